"""Bit packing and symmetric fixpoint quantisation."""
import math

import pytest
import torch

from megatron.cc.codecs import CodecContext, get_codec, payload_bytes
from megatron.cc.numerics import quant
from megatron.cc.numerics.quant import (GRANULARITIES, dequantize, num_scales, pack_bits,
                                        packed_nbytes, quantize, unpack_bits)

BITS = list(range(1, 9))
SIZES = [0, 1, 3, 7, 8, 9, 15, 17, 64, 1001]


def reference_pack(codes, bits):
    """Bit-by-bit little-endian stream, the documented layout."""
    out = [0] * packed_nbytes(len(codes), bits)
    for i, c in enumerate(codes):
        for j in range(bits):
            if (c >> j) & 1:
                k = i * bits + j
                out[k // 8] |= 1 << (k % 8)
    return out


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("n", SIZES)
def test_pack_roundtrip_and_layout(bits, n):
    g = torch.Generator().manual_seed(n * 10 + bits)
    codes = torch.randint(0, 2 ** bits, (n,), dtype=torch.uint8, generator=g)
    packed = pack_bits(codes, bits)
    assert packed.dtype == torch.uint8 and packed.numel() == math.ceil(n * bits / 8)
    assert packed.tolist() == reference_pack(codes.tolist(), bits)
    assert torch.equal(unpack_bits(packed, bits, n), codes)


@pytest.mark.parametrize("bits", [3, 8])
def test_pack_any_shape_and_size_check(bits):
    codes = torch.randint(0, 2 ** bits, (3, 5, 7), dtype=torch.uint8)
    packed = pack_bits(codes, bits)
    assert torch.equal(unpack_bits(packed, bits, codes.numel()).view(3, 5, 7), codes)
    with pytest.raises(ValueError):
        unpack_bits(packed[:-1], bits, codes.numel())
    with pytest.raises(ValueError):
        pack_bits(codes, 9)


def steps_like(scales, bits, shape, granularity, group, scheme="fitted"):
    """Per-element quantisation step: dequantize(code=1) - dequantize(code=0)."""
    one = dequantize(torch.ones(shape, dtype=torch.uint8), scales, bits, shape, granularity,
                     group, scheme=scheme)
    zero = dequantize(torch.zeros(shape, dtype=torch.uint8), scales, bits, shape, granularity,
                      group, scheme=scheme)
    return one - zero


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("granularity,group", [("tensor", 1), ("channel", 1), ("bucket", 128),
                                               ("bucket", 5), ("tile", 8), ("tile", 32)])
@pytest.mark.parametrize("shape", [(17,), (4, 3, 20), (9, 2, 37)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_error_within_half_step(bits, granularity, group, shape, dtype):
    """absmax clips nothing: every value within half a step of its level."""
    g = torch.Generator().manual_seed(bits)
    x = (torch.randn(shape, generator=g) * torch.rand(shape[-1], generator=g) * 3).to(dtype)
    codes, scales = quantize(x, bits, granularity, group, scheme="absmax")
    assert codes.shape == x.shape and codes.dtype == torch.uint8
    assert int(codes.max()) < 2 ** bits
    assert scales.numel() == num_scales(shape, granularity, group)
    x_hat = dequantize(codes, scales, bits, shape, granularity, group, scheme="absmax")
    step = steps_like(scales, bits, shape, granularity, group, "absmax")
    err = (x.float() - x_hat).abs()
    assert bool((err <= step / 2 * (1 + 1e-5) + 1e-7).all())
    assert len(codes.unique()) <= 2 ** bits


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("granularity,group", [("tensor", 1), ("channel", 1), ("bucket", 128),
                                               ("bucket", 5), ("tile", 8), ("tile", 32)])
@pytest.mark.parametrize("heavy", [False, True])
def test_fitted_never_worse_than_absmax_or_seed_per_group(bits, granularity, group, heavy):
    """The fitted grid and scale are the least-squares choice among candidates that include
    max|x| on both grids, so every group's squared error is at most absmax's and the seed's
    (fp16 scale rounding aside; 1 bit: mean|x| is the exact optimum)."""
    g = torch.Generator().manual_seed(bits + 10 * heavy)
    x = torch.randn(6, 4, 40, generator=g)
    if heavy:  # outlier channels and a Student-t-like tail, as in real activations
        x = x / torch.rand(x.shape, generator=g).clamp_min(0.05).sqrt()
        x[..., 3] *= 30
    errs = {}
    for scheme in ("absmax", "seed", "fitted"):
        codes, scales = quantize(x, bits, granularity, group, scheme=scheme)
        x_hat = dequantize(codes, scales, bits, x.shape, granularity, group, scheme=scheme)
        sq = (x - x_hat).square()
        errs[scheme] = quant._to_groups(sq, granularity, group)
    (fa, red), (fs, _), (ff, _) = errs["absmax"], errs["seed"], errs["fitted"]
    ref = torch.minimum(fa.sum(red), fs.sum(red))
    assert bool((ff.sum(red) <= ref * (1 + 2e-3) + 1e-9).all())


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_seed_scheme_is_the_ac_sgd_grid(bits):
    """AC-SGD's fixpoint: q = clip(round(x / S * 2^(b-1)), -2^(b-1), 2^(b-1) - 1), x_hat =
    q / 2^(b-1) * S with S = max|x| per channel (here rounded up to fp16 instead of to
    nearest: the same grid, S one fp16 ulp larger at most)."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(64, 4, 256, generator=g)
    codes, scales = quantize(x, bits, "channel", scheme="seed")
    x_hat = dequantize(codes, scales, bits, x.shape, "channel", scheme="seed")
    s = scales.float()
    h = 2 ** (bits - 1)
    ref = (x / s * h).round().clamp(-h, h - 1) / h * s
    assert torch.allclose(x_hat, ref, atol=1e-6)


# AC-SGD's own quantiser on randn(64, 4, 256), generator seed 1234, per-channel scale
SEED_FIXPOINT_MAE = {2: 0.39, 4: 0.095}


@pytest.mark.parametrize("bits", [2, 4])
def test_fixpoint_mean_error_no_worse_than_the_seed(bits):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(64, 4, 256, generator=g)
    codec = get_codec("fixpoint", bits=bits, granularity="channel")
    payload = codec.encode(x)
    assert payload_bytes(payload) == 64 * 4 * 256 * bits // 8 + 2 * 256
    mae = float((codec.decode(payload, x.shape, torch.float32) - x).abs().mean())
    assert mae <= SEED_FIXPOINT_MAE[bits], mae


@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.bfloat16])
def test_scales_round_up_and_saturate(scale_dtype):
    x = torch.tensor([[0.1, -0.3], [1e-3, 7.77], [-1e5, 2.0]])
    _, scales = quantize(x, 4, "tile", 2, scale_dtype, scheme="absmax")
    assert scales.dtype == scale_dtype
    assert bool((scales.float() >= x.abs().amax(-1).clamp(max=torch.finfo(scale_dtype).max)).all())
    assert bool(torch.isfinite(scales).all())


def test_one_bit_is_sign_times_the_least_squares_scale_and_zero_is_exact():
    x = torch.tensor([[-2.0, 1.0], [0.5, -4.0]])
    expect = {"fitted": 1.875, "absmax": 4.0, "seed": math.sqrt(21.25 / 4)}  # mean|x|, max, RMS
    for scheme, s in expect.items():
        codes, scales = quantize(x, 1, "tensor", scheme=scheme)
        x_hat = dequantize(codes, scales, 1, x.shape, "tensor", scheme=scheme)
        assert torch.allclose(x_hat, x.sign() * s, rtol=1e-3), scheme
    for bits in BITS:
        z = torch.zeros(3, 5)
        codes, scales = quantize(z, bits, "channel")
        assert torch.equal(dequantize(codes, scales, bits, z.shape, "channel"), z)


def test_stochastic_rounding_unbiased_and_reproducible():
    x = torch.full((20000,), 0.3)
    x[0] = 1.0  # scale 1 (stochastic rounding keeps max|x|), 2-bit levels +-1/3, +-1
    g = torch.Generator().manual_seed(0)
    codes, scales = quantize(x, 2, "tensor", generator=g)
    x_hat = dequantize(codes, scales, 2, x.shape, "tensor")
    assert set(x_hat[1:].unique().tolist()) <= {-1 / 3, 1 / 3} or \
        torch.allclose(x_hat[1:].unique(), torch.tensor([-1 / 3, 1 / 3]))
    assert abs(x_hat[1:].mean().item() - 0.3) < 0.02
    a, b = get_codec("fixpoint", bits=3, stochastic=True, seed=5), get_codec("fixpoint", bits=3, stochastic=True, seed=5)
    a.encode(torch.randn(100), None)
    b.load_state_dict(a.state_dict())
    y = torch.randn(100)
    assert all(torch.equal(p, q) for p, q in zip(a.encode(y, None), b.encode(y, None)))


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("granularity,group", [("channel", 128), ("bucket", 128), ("tile", 16), ("tensor", 1)])
@pytest.mark.parametrize("shape", [(5, 3, 37), (1024, 2, 64), (13,)])
def test_fixpoint_codec_bytes_formula(bits, granularity, group, shape):
    c = get_codec("fixpoint", bits=bits, granularity=granularity, group_size=group)
    x = torch.randn(shape)
    p = c.encode(x, CodecContext())
    numel = math.prod(shape)
    if granularity == "channel":
        ns = shape[-1]
    elif granularity == "bucket":
        ns = math.ceil(numel / group)
    elif granularity == "tile":
        ns = numel // shape[-1] * math.ceil(shape[-1] / group)
    else:
        ns = 1
    assert payload_bytes(p) == math.ceil(numel * bits / 8) + 2 * ns
    assert [tuple(t.shape) for t in p] == [s for s, _ in c.payload_spec(torch.Size(shape), x.dtype)]
    y = c.decode(p, shape, torch.bfloat16, CodecContext())
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    absmax = get_codec("fixpoint", bits=bits, granularity=granularity, group_size=group,
                       scheme="absmax")
    z = absmax.decode(absmax.encode(x), shape, torch.float32)
    if bits == 8:
        assert (z - x).abs().max() <= x.abs().max() / 255 + 1e-3
    assert (c.decode(p, shape, torch.float32) - x).square().sum() <= \
        (z - x).square().sum() * (1 + 1e-3)


def test_fixpoint_rejects_bad_config():
    with pytest.raises(ValueError):
        get_codec("fixpoint", bits=0)
    with pytest.raises(ValueError):
        get_codec("fixpoint", granularity="tile", group_size=24)
    with pytest.raises(ValueError):
        get_codec("fixpoint", granularity="row")
    assert set(GRANULARITIES) == {"tensor", "channel", "bucket", "tile"}
