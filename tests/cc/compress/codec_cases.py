"""Every codec configuration the device and host-sync tests run (CPU here, CUDA in tests/gpu).

Each case: (id, codec name, constructor kwargs). Delta codecs need sample ids; the lowrank
cases cover the factorised path (with LEP) and the full-rank path. The subspace codec's
messages are its k coefficients: `build` makes k the test's message width.
"""
import torch

from megatron.cc.codecs import CodecContext, get_codec

CASES = [
    ("identity", "identity", {}),
    ("fixpoint4-channel", "fixpoint", dict(bits=4)),
    ("fixpoint8-tensor", "fixpoint", dict(bits=8, granularity="tensor")),
    ("fixpoint3-bucket-sr", "fixpoint", dict(bits=3, granularity="bucket", stochastic=True)),
    ("fixpoint6-tile32", "fixpoint", dict(bits=6, granularity="tile", group_size=32)),
    ("fixpoint1-channel", "fixpoint", dict(bits=1)),
    ("lowrank4-lep", "lowrank", dict(rank=4, error_feedback=True)),
    ("lowrank-fullrank", "lowrank", dict(rank=512)),
    ("rsvd4-lep", "rsvd", dict(rank=4, error_feedback=True, power_iters=2)),
    ("rsvd-fullrank", "rsvd", dict(rank=512)),
    ("delta4", "delta", dict(bits=4, capacity=16)),
    ("delta-lowbits4-8", "delta-lowbits", dict(bits=4, bits_act=8, capacity=16)),
    ("tah", "tah", dict(tile_size=16)),
    ("cocktail", "cocktail", dict(bits=4, stochastic=True)),
    ("subspace4", "subspace", dict(hidden_size=4096, bits=4)),
    ("subspace-exact", "subspace", dict(hidden_size=4096, bits=0)),
]
IDS = [c[0] for c in CASES]


def build(name, kwargs, device=None, width=None):
    """`width`: the last dim of the messages (the subspace codec's rank k)."""
    if name in ("delta", "delta-lowbits") and device is not None:
        kwargs = dict(kwargs, device=device)
    if name == "subspace":
        kwargs = dict(kwargs, rank=width)
    return get_codec(name, **kwargs)


def context(shape, microbatch=0, iteration=0):
    """Sample ids are host metadata (CPU), wherever the message lives."""
    return CodecContext(microbatch=microbatch, iteration=iteration,
                        sample_ids=torch.arange(shape[1]) + 100 * microbatch)
