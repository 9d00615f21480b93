"""--forward-compress-method delta-lowbits: delta with the cache itself at b bits (AC-SGD)."""
from dataclasses import dataclass

from megatron.cc.codecs.delta import DeltaLowbitsCodec
from megatron.cc.common.config_fields import flag
from megatron.cc.pipeline.delta import Delta


@dataclass
class DeltaLowbits(Delta):
    name = "delta-lowbits"
    codec_class = DeltaLowbitsCodec
    forward_bits_act: int = flag(
        8, "delta-lowbits: bits per value of the cached activations (1..8), one 16-bit scale "
           "per (sample, channel) as AC-SGD (whose default is 4).", low=1, high=8)

    @staticmethod
    def cache_kw(c) -> dict:
        return dict(bits_act=c.forward_bits_act)
