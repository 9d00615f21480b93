"""Pure tensor codecs for communication compression (no torch.distributed in here).

Importing this package registers every codec by name:
    identity       base.IdentityCodec       the uncompressed baseline
    fixpoint       fixpoint.FixpointCodec   symmetric b-bit fixpoint, bit-packed (AC-SGD, TAH bwd)
    lowrank        lowrank.LowRankCodec     Optimus-CC compressed backprop (+ LEP)
    rsvd           rsvd.RandomizedSVDCodec  CB by a randomized SVD per message (+ LEP)
    delta          delta.DeltaCodec         AC-SGD activation deltas against a per-sample cache
    delta-lowbits  delta.DeltaLowbitsCodec  the same with a low-bit cache
    tah            tah.TahCodec             TAH-Quant tile-wise adaptive Hadamard
    cocktail       sparse.CocktailCodec     CocktailSGD random + top-k + quantised values
    subspace       subspace.SubspaceCodec   Subspace Networks' coefficients (raw or fixpoint)
"""
from .base import REGISTRY, Codec, CodecContext, get_codec, payload_bytes, register
from .delta import ActivationCache, CacheTooLarge, DeltaCodec, DeltaLowbitsCodec
from .lowrank import LowRankCodec, orthogonalize_
from .fixpoint import FixpointCodec
from megatron.cc.numerics.quant import pack_bits, packed_nbytes, unpack_bits
from .rsvd import RandomizedSVDCodec
from .sparse import CocktailCodec
from .tah import TahCodec
from .subspace import SubspaceCodec

__all__ = ["REGISTRY", "Codec", "CodecContext", "get_codec", "payload_bytes", "register",
           "ActivationCache", "CacheTooLarge", "DeltaCodec", "DeltaLowbitsCodec",
           "LowRankCodec", "orthogonalize_", "FixpointCodec", "pack_bits", "packed_nbytes",
           "unpack_bits", "CocktailCodec", "TahCodec", "RandomizedSVDCodec",
           "SubspaceCodec"]
