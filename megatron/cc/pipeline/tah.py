"""--forward-compress-method tah: TAH-Quant, tiles of tokens at two bit widths by entropy."""
from dataclasses import dataclass

from megatron.cc.codecs.tah import TahCodec
from megatron.cc.common.config_fields import ConfigError, flag
from megatron.cc.pipeline.base import PpMethod


@dataclass
class TAH(PpMethod):
    name = "tah"
    tile_size: int = flag(64, "tah: tile width along the hidden dim (a power of two, 2..256).")
    high_precision_bits: int = flag(4, "tah: bits of the high-entropy tokens (1..8).", low=1,
                                    high=8)
    low_precision_bits: int = flag(3, "tah: bits of the other tokens (1..8).", low=1, high=8)
    high_precision_allocation_ratio: float = flag(
        0.8, "tah: share of tokens (highest entropy first) that get --high-precision-bits.")

    @staticmethod
    def check(c, pp: int) -> None:
        t = c.tile_size
        if not 2 <= t <= 256 or t & (t - 1):
            raise ConfigError(f"--tile-size must be a power of two in 2..256, got {t}")
        if not 0.0 <= c.high_precision_allocation_ratio <= 1.0:
            raise ConfigError(f"--high-precision-allocation-ratio must be in [0, 1], got "
                              f"{c.high_precision_allocation_ratio}")

    @staticmethod
    def codec(c, spec):
        return TahCodec(tile_size=c.tile_size, high_bits=c.high_precision_bits,
                        low_bits=c.low_precision_bits,
                        high_ratio=c.high_precision_allocation_ratio)
