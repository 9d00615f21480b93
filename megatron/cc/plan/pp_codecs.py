"""The pipeline codecs a CompressionConfig selects, built from the codec registry.

These are the codecs megatron/training/pipeline_codecs.py and channels.py attach to the links,
with the arguments that decide payload sizes; arguments that only change values (seeds,
stochastic rounding, where an activation cache lives) are left at their defaults, and no
activation cache is allocated (payload sizes never depend on it). The payload size is the
codec's own `payload_nbytes`, so the model and the wire cannot drift;
tests/cc/plan/test_pp_codecs.py checks these against the driver's builders for every method.
"""
from typing import Optional

from megatron.cc.compress import get_codec
from megatron.cc.compress.base import Codec

# --inter-grad-comp-type -> registered codec (megatron/training/channels.py CB_CODECS)
CB_CODECS = {"PowerSGD": "lowrank", "RandomizedSVD": "rsvd"}


def forward_codec(c) -> Optional[Codec]:
    """The pp-fwd codec of --forward-compress-method, or None (uncompressed)."""
    method = c.forward_compress_method
    if method == "none":
        return None
    if method == "fixpoint":
        return get_codec("fixpoint", bits=c.forward_bits, granularity="channel",
                         scheme=c.quant_scheme)
    if method == "subspace":   # the model changes, not only the codec: not modelled here
        raise ValueError("the planner does not model --forward-compress-method subspace yet; "
                         "its pipeline bytes per message are megatron/training/subspace.py's "
                         "expected_bytes_per_message")
    if method == "tah":
        return get_codec("tah", tile_size=c.tile_size, high_bits=c.high_precision_bits,
                         low_bits=c.low_precision_bits,
                         high_ratio=c.high_precision_allocation_ratio)
    kw = dict(bits=c.forward_bits, capacity=1, sample_shape=None, scheme=c.quant_scheme)
    if method == "delta-lowbits":
        kw["bits_act"] = c.forward_bits_act
    return get_codec(method, **kw)


def backward_codec(c) -> Optional[Codec]:
    """The pp-bwd codec: fixpoint (--backward-compress-method fixpoint), CB (lowrank / rsvd),
    or None."""
    if c.backward_compress_method == "fixpoint":
        tiled = c.backward_tile_size is not None
        return get_codec("fixpoint", bits=c.backward_bits,
                         granularity="tile" if tiled else "channel",
                         group_size=c.backward_tile_size or 128, scheme=c.quant_scheme)
    if c.inter_grad_comp or c.backward_compress_method == "lowrank":
        rank = c.backward_rank if c.backward_rank is not None else c.inter_grad_comp_rank
        return get_codec(CB_CODECS[c.inter_grad_comp_type], rank=rank,
                         payload_dtype=c.inter_grad_comp_dtype,
                         power_iters=c.inter_grad_comp_power_iters)
    return None
