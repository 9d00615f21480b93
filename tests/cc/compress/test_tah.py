"""TAH-Quant: Hadamard + pivot inverse, side information decodes exactly, fixed payload size."""
import math

import pytest
import torch

from megatron.cc.codecs import CodecContext, get_codec
from megatron.cc.codecs.tah import entropy_allocation, fwht, swap_pivot_

CTX = CodecContext()


def sylvester(t):
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < t:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(t)


@pytest.mark.parametrize("t", [2, 4, 32, 64, 256])
def test_fwht_is_normalised_hadamard_and_self_inverse(t):
    x = torch.randn(5, 3, t, dtype=torch.float64)
    torch.testing.assert_close(fwht(x), x @ sylvester(t))
    torch.testing.assert_close(fwht(fwht(x)), x)


@pytest.mark.parametrize("t", [2, 16, 64])
def test_pivot_swap_plus_hadamard_inverts(t):
    tiles = torch.randn(40, t)
    pivots = torch.randint(0, t, (40,))
    fwd = fwht(swap_pivot_(tiles.clone(), pivots))
    back = swap_pivot_(fwht(fwd), pivots)
    torch.testing.assert_close(back, tiles, atol=1e-5, rtol=1e-5)


def outlier_heavy(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 0.1
    flat = x.view(-1)
    hot = torch.randperm(flat.numel(), generator=g)[: flat.numel() // 50]
    flat[hot] = 30.0 * torch.sign(torch.randn(hot.numel(), generator=g))
    return x


def expected_nbytes(shape, t, hb, lb, ratio):
    T, C = math.prod(shape[:-1]), shape[-1]
    nt = math.ceil(C / t)
    cp, k = nt * t, math.floor(ratio * T + 0.5)
    return (4 * T * nt + math.ceil(T / 8) + math.ceil(T * nt / 8)
            + math.ceil(T * nt * int(math.log2(t)) / 8)
            + math.ceil(k * cp * hb / 8) + math.ceil((T - k) * cp * lb / 8))


CONFIGS = [dict(), dict(tile_size=32, high_bits=6, low_bits=2, high_ratio=0.5),
           dict(tile_size=8, high_ratio=0.0), dict(tile_size=16, high_ratio=1.0, low_bits=1)]
SHAPES = [(16, 2, 128), (7, 3, 100), (5, 1, 64)]


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("shape", SHAPES)
def test_payload_size_fixed_by_shape(cfg, shape):
    c = get_codec("tah", **cfg)
    want = expected_nbytes(shape, c.t, c.high_bits, c.low_bits, c.high_ratio)
    assert c.payload_spec(torch.Size(shape), torch.float32) == [((want,), torch.uint8)]
    for x in (torch.randn(shape), outlier_heavy(shape), torch.zeros(shape)):
        p = c.encode(x, CTX)
        assert len(p) == 1 and p[0].dtype == torch.uint8 and p[0].numel() == want


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("shape", SHAPES)
def test_side_information_decodes_to_the_encoders_choice(cfg, shape):
    c = get_codec("tah", **cfg)
    x = outlier_heavy(shape, seed=1)
    high, flags, pivots = c.analyze(x)
    assert int(high.sum()) == math.floor(c.high_ratio * high.numel() + 0.5)
    assert bool(flags.any()) and bool((pivots[~flags] == 0).all())
    parts = c.parse(c.encode(x, CTX), shape)
    assert torch.equal(parts.high, high)
    assert torch.equal(parts.flags, flags)
    assert torch.equal(parts.pivots, pivots)


def test_entropy_allocation_prefers_flat_tokens():
    x = torch.zeros(4, 16)
    x[0] = 1.0                      # flat: maximal entropy
    x[1, 3] = 5.0                   # one spike: zero entropy
    x[2] = torch.arange(16.0)       # in between
    high = entropy_allocation(x, 0.5)
    assert high.tolist() == [True, False, True, False]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("shape", SHAPES)
def test_reconstruction_error_bounded(cfg, shape, dtype):
    c = get_codec("tah", **cfg)
    x = outlier_heavy(shape, seed=2).to(dtype)
    p = c.encode(x, CTX)
    y = c.decode(p, shape, dtype, CTX)
    assert y.dtype == dtype and y.shape == x.shape
    parts = c.parse(p, shape)
    T, C = math.prod(shape[:-1]), shape[-1]
    nt = parts.scales.shape[1]
    err = torch.zeros(T, nt * c.t)
    err[:, :C] = (c.decode(p, shape, torch.float32, CTX) - x.float()).reshape(T, C)
    err = err.view(T, nt, c.t)
    half = parts.scales.float() / 2 * (1 + 1e-3) + 1e-5
    plain = ~parts.flags
    assert bool((err.abs().amax(-1)[plain] <= half[plain]).all())
    assert bool((err.norm(dim=-1)[parts.flags] <= half[parts.flags] * math.sqrt(c.t)).all())


def test_hadamard_helps_outlier_tiles():
    x = outlier_heavy((32, 2, 128), seed=3)
    tah = get_codec("tah", high_ratio=1.0)
    no_flags = get_codec("tah", high_ratio=1.0, outlier_factor=float("inf"))
    e_tah = (tah.decode(tah.encode(x, CTX), x.shape, x.dtype, CTX) - x).norm()
    e_plain = (no_flags.decode(no_flags.encode(x, CTX), x.shape, x.dtype, CTX) - x).norm()
    assert e_tah < e_plain


def test_zero_input_is_exact_and_config_checked():
    c = get_codec("tah")
    z = torch.zeros(4, 2, 64)
    assert torch.equal(c.decode(c.encode(z, CTX), z.shape, z.dtype, CTX), z)
    for bad in (dict(tile_size=48), dict(tile_size=512), dict(high_bits=9), dict(high_ratio=1.5)):
        with pytest.raises(ValueError):
            get_codec("tah", **bad)
