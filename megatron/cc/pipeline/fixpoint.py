"""--forward-compress-method fixpoint: b-bit activations, one scale per hidden channel."""
from dataclasses import dataclass

from megatron.cc.codecs.fixpoint import FixpointCodec
from megatron.cc.common.config_fields import flag
from megatron.cc.pipeline.base import PpMethod


@dataclass
class Fixpoint(PpMethod):
    name = "fixpoint"
    quantises = True
    forward_bits: int = flag(4, "Bits per value of fixpoint / delta activations (1..8).",
                             low=1, high=8)

    @staticmethod
    def codec(c, spec):
        return FixpointCodec(bits=c.forward_bits, granularity="channel",
                                 stochastic=c.stochastic_rounding, seed=spec.seed,
                             scheme=c.quant_scheme)
