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
def test_encode_decode_bit_identical(t, hb, lb, ratio, shape, dtype):
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
