"""The delta step on kernels (megatron/cc/codecs/delta_kernels.py) under Triton's interpreter:
the packed codes and the updated caches (sender and receiver) bit-identical to the eager path
with the same scales; the eager branch is DeltaCodec's own arithmetic."""
import pytest
import torch

from megatron.cc.codecs import get_codec
from megatron.cc.kernels import dispatch, group_sums
from megatron.cc.numerics import quant
from tests.cc.compress.codec_cases import context
from tests.cc.kernels.cases import sample
from tests.cc.kernels.interpret import kernels

kernels("fixpoint")   # interpreted; delta_kernels imports it at each call
from megatron.cc.codecs import delta_kernels as kd  # noqa: E402
SHAPE = (11, 3, 29)   # (S, B, H): 957 values


def cache_view(shape, seed):
    """A cached c as DeltaCodec.encode holds it: (B, S, H) rows seen as (S, B, H)."""
    c = sample((shape[1], shape[0], shape[2]), seed=seed) * 0.5
    return c.transpose(0, 1)


def expected(x, prev, q, scales):
    codes = quant.quantize_with_scales(x.float() - prev, scales, q.bits, q.granularity,
                                       q.group_size, scheme=q.scheme)
    deq = quant.dequantize(codes, scales, q.bits, x.shape, q.granularity, q.group_size,
                           scheme=q.scheme)
    return quant.pack_bits(codes, q.bits), prev + deq


@pytest.mark.parametrize("bits,granularity,group,scheme",
                         [(4, "channel", 128, "fitted"), (3, "tile", 8, "absmax"),
                          (1, "bucket", 50, "seed"), (8, "channel", 128, "absmax")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_encode_and_decode_update(bits, granularity, group, scheme, dtype, monkeypatch):
    q = get_codec("fixpoint", bits=bits, granularity=granularity, group_size=group,
                  scheme=scheme)
    x = sample(SHAPE, dtype, seed=bits)
    prev = cache_view(SHAPE, seed=bits + 1)
    scales = group_sums.group_scales(x.float() - prev, bits, granularity, group,
                                     torch.float16, scheme)
    ref_packed, ref_new = expected(x, prev, q, scales)
    monkeypatch.setattr(dispatch, "enabled", lambda *t: True)
    sender = prev.clone()
    payload, new = kd.encode_update(x, sender, q)
    assert torch.equal(payload[1], scales) and torch.equal(payload[0], ref_packed)
    assert new.data_ptr() == sender.data_ptr() and torch.equal(new, ref_new)   # in place
    for out in (torch.float32, torch.bfloat16):
        receiver = prev.clone()
        x_hat = kd.decode_update(payload, receiver, q, SHAPE, out)
        assert torch.equal(receiver, ref_new)                # the cache, in place
        assert x_hat.dtype == out and x_hat.shape == SHAPE
        # the message: the cache's value in its dtype (the interpreter's fp32 -> bf16 cast
        # truncates where CUDA rounds, so bf16 is compared by the kernel's own conversion)
        if out == torch.float32:
            assert torch.equal(x_hat, ref_new)
        else:
            assert (x_hat.float() - ref_new).abs().le(ref_new.abs() * 2 ** -7).all()


def test_eager_branch_is_delta_codecs_arithmetic():
    """With the kernels off, encode_update / decode_update give DeltaCodec's payload and
    caches (second message of a sample: a real delta against a warm cache)."""
    enc, dec = get_codec("delta", bits=3, capacity=4), get_codec("delta", bits=3, capacity=4)
    ctx = context(SHAPE)
    x1, x2 = sample(SHAPE, seed=1), sample(SHAPE, seed=2)
    dec.decode(enc.encode(x1, ctx), SHAPE, torch.float32, ctx)
    slots = torch.tensor([enc.cache.slots[int(i)] for i in ctx.sample_ids])
    prev = enc.cache.read(slots).transpose(0, 1)
    payload = enc.encode(x2, ctx)
    x_hat = dec.decode(payload, SHAPE, torch.float32, ctx)
    ours, new = kd.encode_update(x2, prev.clone(), enc.q)
    assert all(torch.equal(a, b) for a, b in zip(ours, payload))
    assert torch.equal(new, enc.cache.read(slots).transpose(0, 1))
    receiver = prev.clone()
    assert torch.equal(kd.decode_update(payload, receiver, dec.q, SHAPE, torch.float32), x_hat)
    assert torch.equal(receiver, x_hat)


@pytest.mark.parametrize("bits,granularity,group,scheme",
                         [(4, "channel", 128, "fitted"), (3, "tile", 8, "absmax")])
def test_in_cache_step_equals_the_gathered_step(bits, granularity, group, scheme, monkeypatch):
    """encode_in_cache / decode_in_cache on the cache rows, sample b in row slots[b] (out of
    order): the payload of encode_update on the gathered rows, and those rows' updates in
    place; the other rows untouched."""
    q = get_codec("fixpoint", bits=bits, granularity=granularity, group_size=group,
                  scheme=scheme)
    s, b, h = SHAPE
    x = sample(SHAPE, torch.bfloat16, seed=bits)
    rows = sample((b + 2, s, h), seed=bits + 1) * 0.5
    slots = torch.tensor([3, 0, 4])
    monkeypatch.setattr(dispatch, "enabled", lambda *t: True)
    ref_payload, ref_new = kd.encode_update(x, rows[slots].transpose(0, 1).clone(), q)
    want = rows.clone()
    want[slots] = ref_new.transpose(0, 1)
    sender = rows.clone()
    payload = kd.encode_in_cache(x, sender, slots, q)
    assert all(torch.equal(a, c) for a, c in zip(payload, ref_payload))
    assert torch.equal(sender, want)
    receiver = rows.clone()
    x_hat = kd.decode_in_cache(payload, receiver, slots, q, SHAPE, torch.float32)
    assert torch.equal(receiver, want) and torch.equal(x_hat, ref_new)


def _run_delta(codec, steps, monkeypatch, kernels_on):
    monkeypatch.setattr(dispatch, "enabled", lambda *t: kernels_on)
    # absmax: scales exact in any order, so the eager and kernel routes agree bit for bit
    enc, dec = (get_codec(codec, bits=4, capacity=5, storage="device",
                          sample_shape=SHAPE[::2], scheme="absmax") for _ in range(2))
    out = []
    for i, ids in enumerate(steps):
        from megatron.cc.codecs import CodecContext
        ctx = CodecContext(microbatch=0, iteration=i, sample_ids=torch.tensor(ids))
        payload = enc.encode(sample(SHAPE, seed=10 + i), ctx)
        out.append((payload, dec.decode(payload, SHAPE, torch.float32, ctx)))
    assert torch.equal(enc.cache.data, dec.cache.data)
    return out, enc.cache.data.clone()


def test_device_cache_codec_is_unchanged_by_the_in_place_path(monkeypatch):
    """DeltaCodec with a device fp32 cache: with the kernels (in place) and without (rows
    gathered, eager), the same payloads, messages and caches over fresh samples, revisits,
    an eviction, and a micro-batch naming one sample twice (gathered path)."""
    steps = [[1, 2, 3], [2, 3, 4], [3, 1, 5], [6, 6, 2], [2, 6, 1]]
    calls = []
    for name in ("encode_in_cache", "decode_in_cache"):
        orig = getattr(kd, name)
        monkeypatch.setattr(kd, name, lambda *a, _f=orig, _n=name: calls.append(_n) or _f(*a))
    on, cache_on = _run_delta("delta", steps, monkeypatch, True)
    assert len(calls) == 2 * (len(steps) - 1)   # in place but for the repeated sample
    off, cache_off = _run_delta("delta", steps, monkeypatch, False)
    assert len(calls) == 2 * (len(steps) - 1)
    assert torch.equal(cache_on, cache_off)
    for (pa, xa), (pb, xb) in zip(on, off):
        assert all(torch.equal(a, c) for a, c in zip(pa, pb)) and torch.equal(xa, xb)
