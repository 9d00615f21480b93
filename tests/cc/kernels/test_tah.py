"""TAH-Quant kernels (megatron/cc/kernels/tah.py) under Triton's interpreter: payload bytes
and decodes bit-identical to TahCodec's eager encode / decode."""
import pytest
import torch

from megatron.cc.codecs import get_codec
from tests.cc.kernels.cases import sample
from tests.cc.kernels.interpret import kernels

kt = kernels("tah")

CASES = [  # (tile, high_bits, low_bits, high_ratio, shape, dtype)
    (16, 4, 3, 0.8, (5, 3, 37), torch.float32),      # 3 tiles per token, the last padded
    (2, 8, 1, 0.5, (7, 9), torch.bfloat16),          # 1-bit pivots, 1-bit low tokens
    (8, 5, 2, 0.0, (4, 2, 40), torch.float16),       # every token low
    (64, 3, 3, 1.0, (3, 2, 100), torch.float32),     # every token high; 64-point Hadamard
]


def spiky(shape, dtype, seed):
    """Heavy tails plus spikes: many tiles pass the outlier test (max >= 2 x second)."""
    x = sample(shape, torch.float32, seed).clamp(-6e4, 6e4)
    flat = x.view(-1)
    flat[::7] *= 40
    return x.to(dtype)


@pytest.mark.parametrize("t,hb,lb,ratio,shape,dtype", CASES,
                         ids=[f"t{c[0]}-{c[1]}/{c[2]}b-r{c[3]}" for c in CASES])
def test_encode_decode_bit_identical(t, hb, lb, ratio, shape, dtype, monkeypatch):
    monkeypatch.setattr(kt, "RANK_CHUNK", 4)    # the token-map scan in several steps
    monkeypatch.setattr(kt, "SPLIT_CHUNK", 8)   # and the encode's split
    codec = get_codec("tah", tile_size=t, high_bits=hb, low_bits=lb, high_ratio=ratio)
    x = spiky(shape, dtype, seed=t)
    ref = codec.encode(x)
    flags = codec.analyze(x)[1]
    assert 0 < int(flags.sum()) < flags.numel()     # both kinds of tile are exercised
    got = kt.encode(codec, x)
    assert len(got) == 1 and torch.equal(got[0], ref[0])
    for out in (torch.float32, torch.bfloat16, torch.float16):
        y = kt.decode(codec, ref, shape, out)
        y_ref = codec.decode(ref, shape, out)
        assert y.dtype == out and torch.equal(y.view(torch.uint8), y_ref.view(torch.uint8))


@pytest.mark.parametrize("shape,dtype", [((6, 5, 37), torch.float32), ((9, 1300), torch.bfloat16),
                                         ((3, 2, 64), torch.float16)],
                         ids=["padded-tiles", "two-blocks", "fp16"])
def test_entropies_match_the_eager_allocation(shape, dtype):
    """The kernel's token entropies against the eager formula's (summation order and the
    logarithm's rounding apart), zero tokens included; their ranking is the eager one here."""
    from megatron.cc.codecs import tah
    x = spiky(shape, dtype, seed=3)
    x.view(-1, shape[-1])[1] = 0                    # an all-zero token: entropy 0
    got = kt.entropies(x)
    a = x.reshape(-1, shape[-1]).abs().float()
    s = a.sum(-1)
    ref = torch.where(s > 0, s.log() - torch.linalg.vecdot(a, a.clamp_min(1e-38).log()) / s, 0)
    assert got[1] == 0 and torch.allclose(got, ref, rtol=1e-5, atol=1e-5)
    codec = get_codec("tah", high_ratio=0.5)
    assert torch.equal(codec.rank(got)[0], tah.entropy_allocation(x.reshape(-1, shape[-1]), 0.5))
