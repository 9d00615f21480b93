"""SparseLoCo's chunked top-k codec on plain tensors (one process).

- index packing round trip at every width 1..16;
- encode/decode round trip: the kept positions are exactly each chunk's top-k by magnitude
  (a per-chunk reference loop), their values exactly the quantiser's reconstruction of them,
  everything else zero; pads never leak past numel;
- payload bytes == the module docstring's formula, == flat_spec, for odd sizes and chunks;
- density 1 sends no indices, and at 8 bits (absmax) reconstructs within half a step.
"""
import math

import pytest
import torch

from megatron.cc.codecs.chunk_topk import (ChunkTopKCodec, index_bits, pack_uints,
                                             unpack_uints)
from megatron.cc.numerics.quant import dequantize, quantize


@pytest.mark.parametrize("bits", list(range(1, 17)))
def test_pack_uints_round_trip(bits):
    gen = torch.Generator().manual_seed(bits)
    for n in (0, 1, 7, 8, 9, 1001):
        v = torch.randint(0, 1 << bits, (n,), generator=gen)
        packed = pack_uints(v, bits)
        assert packed.dtype == torch.uint8 and packed.numel() == math.ceil(n * bits / 8)
        assert torch.equal(unpack_uints(packed, bits, n), v)


def test_index_bits():
    assert [index_bits(c) for c in (1, 2, 3, 4, 5, 64, 100, 4096, 4097)] == \
        [0, 1, 2, 2, 3, 6, 7, 12, 13]


def _formula(n, C, k, b):
    m = -(-n // C)
    idx = 0 if k == C else math.ceil(m * k * index_bits(C) / 8)
    return idx + math.ceil(m * k * b / 8) + 2 * m


@pytest.mark.parametrize("n,C,density,bits", [
    (10000, 4096, 1 / 64, 2), (4096, 4096, 1 / 64, 2), (1, 4096, 1 / 64, 2),
    (1000, 100, 0.05, 3), (777, 64, 0.25, 8), (5000, 128, 1 / 128, 1), (300, 7, 0.5, 4)])
def test_round_trip_is_top_k_per_chunk(n, C, density, bits):
    gen = torch.Generator().manual_seed(n + C)
    x = torch.randn(n, generator=gen) * torch.rand(n, generator=gen).pow(3)
    codec = ChunkTopKCodec(density, C, bits)
    k = codec.k
    payload = codec.compress(x)
    spec = codec.flat_spec(n)
    assert [(tuple(p.shape), p.dtype) for p in payload] == [(tuple(s), d) for s, d in spec]
    assert codec.nbytes(n) == sum(p.numel() * p.element_size() for p in payload) == \
        _formula(n, C, k, bits)
    out = codec.decompress(payload, n)
    assert out.shape == (n,) and out.dtype == torch.float32
    # reference: per chunk, the k largest |x| among the real entries, ascending positions
    m = -(-n // C)
    keep, vals = [], []
    for j in range(m):
        seg = x[j * C:(j + 1) * C]
        top = seg.abs().topk(min(k, seg.numel())).indices.sort().values
        keep.append(top + j * C)
        v = torch.zeros(k)
        v[:top.numel()] = seg[top]          # a short last chunk: pads carry zeros
        vals.append(v)
    keep = torch.cat(keep)
    codes, scales = quantize(torch.cat(vals), bits, "bucket", k)
    ref_vals = dequantize(codes, scales, bits, (m * k,), "bucket", k).view(m, k)
    ref = torch.zeros(n)
    ref[keep] = torch.cat([ref_vals[j, :min(k, n - j * C)] for j in range(m)])
    assert torch.equal(out, ref)
    assert int((out != 0).sum()) <= keep.numel()


def test_density_one_sends_no_indices_and_is_close_at_8_bits():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    codec = ChunkTopKCodec(1.0, 128, 8, scheme="absmax")   # nothing clipped: |err| <= step/2
    payload = codec.compress(x)
    assert payload[0].numel() == 0 and codec.nbytes(1000) == 8 * 128 + 2 * 8   # padded chunk
    out = codec.decompress(payload, 1000)
    step = torch.nn.functional.pad(x.abs(), (0, 24)).view(8, 128).amax(1) * 2 / 255
    assert torch.all((out - x).abs() <= step.repeat_interleave(128)[:1000] * 0.5 * 1.01 + 1e-7)


def test_stochastic_rounding_state_round_trip():
    x = torch.randn(5000, generator=torch.Generator().manual_seed(1))
    a = ChunkTopKCodec(0.1, 256, 2, stochastic=True, seed=3)
    a.compress(x)
    sd = a.state_dict()
    b = ChunkTopKCodec(0.1, 256, 2, stochastic=True, seed=3)
    b.load_state_dict(sd)
    for p, q in zip(a.compress(x), b.compress(x)):
        assert torch.equal(p, q)


@pytest.mark.parametrize("kw", [{"density": 0.0}, {"density": 1.5}, {"chunk_size": 0},
                                {"bits": 0}, {"bits": 9}])
def test_bad_arguments(kw):
    with pytest.raises(ValueError):
        ChunkTopKCodec(**kw)
