"""--backward-compress-method fixpoint: b-bit activation gradients, no error feedback
(AC-SGD / TAH-Quant backward)."""
from dataclasses import dataclass
from typing import Optional

from megatron.cc.codecs.fixpoint import FixpointCodec
from megatron.cc.common.config_fields import ConfigError, flag
from megatron.cc.pipeline.base import PpMethod


@dataclass
class FixpointBackward(PpMethod):
    name = "fixpoint"
    quantises = True
    backward_bits: int = flag(8, "Bits per value of fixpoint gradients (1..8).", low=1, high=8)
    backward_tile_size: Optional[int] = flag(
        None, "fixpoint gradients: one scale per tile of this many hidden values (a power of "
              "two; TAH-Quant runs 32); default one scale per hidden channel.")

    @staticmethod
    def check(c, pp: int) -> None:
        bwd, t = c.backward_compress_method, c.backward_tile_size
        if c.inter_grad_comp and bwd == "fixpoint":
            raise ConfigError("--inter-grad-comp (low-rank CB) and --backward-compress-method "
                              "fixpoint both claim the backward channel; pick one")
        if t is not None and bwd != "fixpoint":
            raise ConfigError(f"--backward-tile-size sets fixpoint gradient tiles, but "
                              f"--backward-compress-method is {bwd}")
        if t is not None and (t < 1 or t & (t - 1)):
            raise ConfigError(f"--backward-tile-size must be a power of two, got {t}")

    @staticmethod
    def codec(c, spec):
        tiled = c.backward_tile_size is not None
        return FixpointCodec(bits=c.backward_bits, granularity="tile" if tiled else "channel",
                             group_size=c.backward_tile_size or 128,
                             stochastic=c.stochastic_rounding, seed=spec.seed,
                             scheme=c.quant_scheme)
