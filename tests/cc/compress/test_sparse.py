"""CocktailSGD compression: shared rolling mask, top-k, bucketed low-bit values, fixed size."""
import math

import pytest
import torch

from megatron.cc.codecs import CodecContext, get_codec, payload_bytes
from megatron.cc.numerics.quant import dequantize


def expected_bytes(numel, p, topk, bits, bucket=128):
    stride = round(1 / p)
    n_rand = math.ceil(numel / stride)
    k = min(n_rand, max(1, math.floor(topk * n_rand + 0.5)))
    mask = 0 if k == n_rand else math.ceil(n_rand / 8)   # all kept: no mask is sent
    return mask + math.ceil(k * bits / 8) + 2 * math.ceil(k / bucket)


@pytest.mark.parametrize("numel", [1, 9, 1000, 1001, 12345])
@pytest.mark.parametrize("p,topk,bits", [(0.1, 0.2, 4), (0.5, 0.05, 2), (1.0, 1.0, 8), (0.3, 0.5, 3),
                                         (0.125, 1.0, 2)])
def test_payload_size_fixed_by_numel(numel, p, topk, bits):
    c = get_codec("cocktail", random_ratio=p, topk_ratio=topk, bits=bits)
    want = expected_bytes(numel, p, topk, bits)
    assert c.payload_nbytes((numel,), torch.float32) == want
    for step in range(4):
        for x in (torch.randn(numel), torch.zeros(numel)):
            assert payload_bytes(c.compress(x, step)) == want


def test_rolling_mask_shared_and_advancing():
    a, b = get_codec("cocktail", random_ratio=0.25, seed=7), get_codec("cocktail", random_ratio=0.25, seed=7)
    n = 103
    assert torch.equal(a.random_indices(n, 5), b.random_indices(n, 5))
    assert not torch.equal(a.random_indices(n, 5), a.random_indices(n, 6))
    covered = torch.cat([a.random_indices(n, s) for s in range(4)])
    assert set(covered[covered < n].tolist()) == set(range(n))  # every entry gets its turn


def test_decode_at_8_bits_is_topk_of_random_subset():
    torch.manual_seed(0)
    c = get_codec("cocktail", random_ratio=0.1, topk_ratio=0.2, bits=8, scheme="absmax")
    x = torch.randn(5003)
    step = 3
    y = c.decompress(c.compress(x, step), x.numel(), step)
    idx = c.random_indices(x.numel(), step)
    idx = idx[idx < x.numel()]
    k = c.sizes(x.numel())[1]
    keep = idx[x[idx].abs().topk(k).indices]
    assert set(y.nonzero().squeeze(1).tolist()) <= set(keep.tolist())
    bucket_max = x[keep].abs().max()
    assert float((y[keep] - x[keep]).abs().max()) <= bucket_max / 255 * 1.001
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[keep] = False
    assert float(y[mask].abs().max()) == 0.0


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 6])
def test_low_bit_error_within_half_step_per_bucket(bits):
    torch.manual_seed(bits)
    c = get_codec("cocktail", random_ratio=1.0, topk_ratio=1.0, bits=bits, bucket_size=16,
                  scheme="absmax")
    x = torch.randn(1000)
    payload = c.compress(x, 0)
    y = c.decompress(payload, x.numel(), 0)
    scales = payload[2].float()
    step = dequantize(torch.ones(1000, dtype=torch.uint8), payload[2], bits, (1000,), "bucket",
                      16, scheme="absmax") - \
        dequantize(torch.zeros(1000, dtype=torch.uint8), payload[2], bits, (1000,), "bucket", 16,
                   scheme="absmax")
    assert bool(((y - x).abs() <= step / 2 * (1 + 1e-5) + 1e-7).all())
    assert scales.numel() == math.ceil(1000 / 16)


def test_codec_interface_and_stochastic_state():
    a = get_codec("cocktail", bits=2, stochastic=True, seed=1)
    x = torch.randn(4, 300)
    ctx = CodecContext(iteration=11)
    a.encode(x, ctx)
    b = get_codec("cocktail", bits=2, stochastic=True, seed=1)
    b.load_state_dict(a.state_dict())
    pa, pb = a.encode(x, ctx), b.encode(x, ctx)
    assert all(torch.equal(u, v) for u, v in zip(pa, pb))
    y = b.decode(pb, x.shape, torch.bfloat16, ctx)
    assert y.shape == x.shape and y.dtype == torch.bfloat16
    assert torch.equal(y.float().view(-1), a.decompress(pa, x.numel(), 11, torch.bfloat16).float())


@pytest.mark.parametrize("numel", [1000, 1003])   # 1003: the last rolling slot may be a pad
def test_topk_one_sends_no_mask_and_keeps_the_whole_subset(numel):
    torch.manual_seed(3)
    c = get_codec("cocktail", random_ratio=0.125, topk_ratio=1.0, bits=8, scheme="absmax")
    x = torch.randn(numel)
    for step in range(8):
        payload = c.compress(x, step)
        assert payload[0].numel() == 0 and c.mask_ok(payload, numel)
        y = c.decompress(payload, numel, step)
        idx = c.random_indices(numel, step)
        idx = idx[idx < numel]
        rest = torch.ones(numel, dtype=torch.bool)
        rest[idx] = False
        assert float(y[rest].abs().max()) == 0.0
        step_size = x[idx].abs().max() / 127.5   # absmax: nothing clipped, half a step
        assert float((y[idx] - x[idx]).abs().max()) <= step_size / 2 * 1.001


# CocktailSGD's own bucket quantiser on the same values: relative RMS error
SEED_BUCKET_REL_RMS = {1: 0.65, 2: 0.45}


@pytest.mark.parametrize("bits", [1, 2])
def test_low_bit_bucket_values_no_worse_than_the_seed(bits):
    """1 bit decodes to sign x the least-squares scale of the bucket (mean|v|), not +-max
    (which was worse than sending nothing: relative RMS error 2.33); 2 bits use all 4 codes."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(64 * 4 * 256, generator=g) * 1e-3
    c = get_codec("cocktail", random_ratio=1.0, topk_ratio=1.0, bits=bits, bucket_size=128)
    payload = c.compress(x, 0)
    n = x.numel()
    assert payload_bytes(payload) == 0 + math.ceil(n * bits / 8) + 2 * math.ceil(n / 128)
    rel = float((c.decompress(payload, n, 0) - x).norm() / x.norm())
    assert rel <= SEED_BUCKET_REL_RMS[bits], rel
    seed = get_codec("cocktail", random_ratio=1.0, topk_ratio=1.0, bits=bits, bucket_size=128,
                     scheme="seed")
    rel_seed = float((seed.decompress(seed.compress(x, 0), n, 0) - x).norm() / x.norm())
    assert rel < rel_seed and abs(rel_seed - SEED_BUCKET_REL_RMS[bits]) < 0.03, rel_seed
