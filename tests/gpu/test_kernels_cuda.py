"""The Triton kernels compiled for the GPU (megatron/cc/kernels) against the eager reference on
the same GPU, bit for bit: what tests/cc/kernels checks under the interpreter on the CPU, here
on real hardware (FMA contraction, division, conversions and layouts as the GPU executes them).
Skipped without CUDA, and when the interpreter is on (run tests/gpu in a process of its own)."""
import os

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") == "1",
    reason="needs CUDA and compiled (not interpreted) Triton")

DEV = "cuda"


def sample(shape, dtype=torch.float32, seed=0):
    from tests.cc.kernels.cases import sample as cpu_sample
    return cpu_sample(shape, dtype, seed).to(DEV)


@pytest.mark.parametrize("granularity,group", [("channel", 128), ("tile", 32), ("bucket", 128),
                                               ("tensor", 1)])
@pytest.mark.parametrize("bits", [1, 3, 4, 8])
@pytest.mark.parametrize("scheme", ["fitted", "absmax", "seed"])
def test_fixpoint(granularity, group, bits, scheme):
    from megatron.cc.codecs import fused
    from megatron.cc.numerics import quant
    from megatron.cc.kernels import fixpoint, group_sums
    x = sample((96, 4, 333), torch.bfloat16, seed=bits)
    packed, scales = fixpoint.encode(x, bits, granularity, group, torch.float16, scheme)
    twin = (quant.group_scales if granularity == "tensor" else group_sums.group_scales)
    assert torch.equal(scales, twin(x, bits, granularity, group, torch.float16, scheme))
    codes = quant.quantize_with_scales(x, scales, bits, granularity, group, scheme=scheme)
    assert torch.equal(packed, quant.pack_bits(codes, bits))
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        y = fixpoint.decode(packed, scales, bits, x.shape, granularity, group, dtype, scheme)
        ref = fused.decode_eager(packed, scales, bits, x.shape, granularity, group, dtype, scheme)
        assert torch.equal(y.view(torch.uint8), ref.view(torch.uint8))


def test_delta_step():
    from megatron.cc.codecs import get_codec
    from megatron.cc.numerics import quant
    from megatron.cc.codecs import delta_kernels as delta
    from megatron.cc.kernels import dispatch, group_sums
    assert dispatch.enabled(torch.empty(1, device=DEV))
    q = get_codec("fixpoint", bits=4)
    x = sample((64, 4, 200), torch.bfloat16, seed=1)
    prev = sample((4, 64, 200), seed=2).transpose(0, 1)
    scales = group_sums.group_scales(x.float() - prev, 4, "channel", 128, torch.float16, "fitted")
    codes = quant.quantize_with_scales(x.float() - prev, scales, 4, "channel")
    new_ref = prev + quant.dequantize(codes, scales, 4, x.shape, "channel")
    payload, new = delta.encode_update(x, prev.clone(), q)
    assert torch.equal(payload[0], quant.pack_bits(codes, 4)) and torch.equal(new, new_ref)
    receiver = prev.clone()
    x_hat = delta.decode_update(payload, receiver, q, x.shape, torch.bfloat16)
    assert torch.equal(receiver, new_ref) and torch.equal(x_hat, new_ref.to(torch.bfloat16))


def test_delta_step_in_cache():
    """The delta step on a device cache's rows, read and updated in place through the slot
    table: the payload and rows of the step on the gathered rows."""
    from megatron.cc.codecs import get_codec
    from megatron.cc.codecs import delta_kernels as delta
    q = get_codec("fixpoint", bits=4)
    x = sample((64, 4, 200), torch.bfloat16, seed=1)
    rows = sample((6, 64, 200), seed=2)
    slots = torch.tensor([5, 0, 3, 1], device=DEV)
    ref_payload, ref_new = delta.encode_update(x, rows[slots].transpose(0, 1).clone(), q)
    want = rows.clone()
    want[slots] = ref_new.transpose(0, 1)
    sender = rows.clone()
    payload = delta.encode_in_cache(x, sender, slots, q)
    assert all(torch.equal(a, b) for a, b in zip(payload, ref_payload))
    assert torch.equal(sender, want)
    receiver = rows.clone()
    x_hat = delta.decode_in_cache(payload, receiver, slots, q, x.shape, torch.bfloat16)
    assert torch.equal(receiver, want) and torch.equal(x_hat, ref_new.to(torch.bfloat16))


@pytest.mark.parametrize("topk_ratio", [0.2, 1.0])
def test_cocktail_decode(topk_ratio, monkeypatch):
    from megatron.cc.codecs import get_codec
    from megatron.cc.kernels import dispatch, sparse
    codec = get_codec("cocktail", topk_ratio=topk_ratio)
    x = sample((300_001,), seed=3)
    for step in (0, 7):
        payload = codec.compress(x, step)
        got = {d: sparse.decompress(codec, payload, x.numel(), step, d)
               for d in (torch.float32, torch.bfloat16)}
        with monkeypatch.context() as m:
            m.setattr(dispatch, "enabled", lambda *t: False)
            for d, y in got.items():
                ref = codec.decompress(payload, x.numel(), step, d)
                assert torch.equal(y.view(torch.uint8), ref.view(torch.uint8))


@pytest.mark.parametrize("topk_ratio", [0.2, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cocktail_encode(topk_ratio, dtype, monkeypatch):
    from megatron.cc.codecs import get_codec
    from megatron.cc.kernels import dispatch
    codec = get_codec("cocktail", topk_ratio=topk_ratio, scheme="absmax")
    x = sample((300_001,), dtype, seed=4)
    for step in (0, 7):
        got = codec.compress(x, step)
        with monkeypatch.context() as m:
            m.setattr(dispatch, "enabled", lambda *t: False)
            want = codec.compress(x, step)
        assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("density", [1 / 64, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_sparseloco_encode_decode(density, dtype, monkeypatch):
    from megatron.cc.codecs.chunk_topk import ChunkTopKCodec
    from megatron.cc.kernels import dispatch
    codec = ChunkTopKCodec(density, 4096, 2, scheme="absmax")
    x = sample((300_001,), dtype, seed=5)
    got = codec.compress(x)
    dec = codec.decompress(got, x.numel(), dtype=dtype)
    with monkeypatch.context() as m:
        m.setattr(dispatch, "enabled", lambda *t: False)
        want = codec.compress(x)
        ref = codec.decompress(got, x.numel(), dtype=dtype)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert torch.equal(dec.view(torch.uint8), ref.view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_lowrank_finish(dtype):
    from megatron.cc.kernels import lowrank
    p, q, q_old = (sample(s, seed=i) for i, s in enumerate([(8192, 16), (1920, 16), (1920, 16)]))
    q[:, 3] = 0
    dead = torch.linalg.vector_norm(q, dim=0) == 0
    q_ref = torch.where(dead, q_old, q)
    got = lowrank.finish(p, q, q_old, dtype)
    want = (p.to(dtype), q_ref.to(dtype), p.to(dtype).float(), q_ref.to(dtype).float())
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and torch.equal(q, q_ref)


def test_lowrank_residual():
    from megatron.cc.kernels import lowrank
    p, q = sample((8192, 16), torch.bfloat16, seed=1), sample((1920, 16), torch.bfloat16, seed=2)
    mat = sample((8192, 1920), seed=3)
    want = mat - lowrank.low_rank_product(p, q, (8192, 1920), torch.float32)
    assert torch.equal(lowrank.low_rank_residual(mat, p, q, out=mat), want)


def test_lowrank_decode_product():
    from megatron.cc.kernels import group_sums, lowrank
    p = torch.randn(8192, 16, device=DEV).to(torch.bfloat16)
    q = torch.randn(1920, 16, device=DEV).to(torch.bfloat16)
    twin = group_sums.low_rank_product(p, q)
    for dtype in (torch.float32, torch.bfloat16):
        got = lowrank.low_rank_product(p, q, (1024, 8, 1920), dtype)
        assert torch.equal(got.view(8192, 1920), twin.to(dtype))


@pytest.mark.parametrize("t", [2, 16, 64])
def test_tah(t, monkeypatch):
    """The kernels' payload is the eager one for the same token ranking (the kernel's
    entropies, within rounding of the eager ones), and so is the decode."""
    from megatron.cc.codecs import get_codec
    from megatron.cc.kernels import dispatch, tah
    codec = get_codec("tah", tile_size=t)
    x = sample((128, 4, 300), torch.bfloat16, seed=t)
    x.view(-1)[::7] *= 40
    got = tah.encode(codec, x)
    ent = tah.entropies(x)
    a = x.reshape(-1, 300).abs().float()
    s = a.sum(-1)
    eager_ent = s.log() - torch.linalg.vecdot(a, a.clamp_min(1e-38).log()) / s
    assert torch.allclose(ent, eager_ent, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(dispatch, "enabled", lambda *t: False)
    monkeypatch.setattr(codec, "allocate", lambda a: codec.rank(ent))
    ref = codec.encode(x)
    assert torch.equal(got[0], ref[0])
    y_ref = codec.decode(ref, x.shape, torch.bfloat16)
    y = tah.decode(codec, ref, x.shape, torch.bfloat16)
    assert torch.equal(y.view(torch.uint8), y_ref.view(torch.uint8))


def test_lowrank_gram_schmidt():
    from megatron.cc.kernels import group_sums, lowrank
    p = torch.randn(4096, 16, device=DEV) * torch.logspace(0, -4, 16, device=DEV)
    got = lowrank.orthogonalize_(p.clone(), 1e-8)
    assert torch.equal(got, group_sums.orthogonalize_(p.clone(), 1e-8))
    assert torch.allclose(got.t() @ got, torch.eye(16, device=DEV), atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_cross_entropy(dtype):
    """The tp-1 loss kernels on the GPU against torch's cross entropy of the same fp32 logits
    (GPT-2's padded vocabulary: 50257 real of 50304, 13 blocks a row)."""
    import torch.nn.functional as F
    from megatron.training.loop.cross_entropy import cross_entropy
    g = torch.Generator(device=DEV).manual_seed(0)
    logits = (torch.randn(2, 64, 50304, device=DEV, generator=g) * 4).to(dtype)
    labels = torch.randint(0, 50257, (2, 64), device=DEV, generator=g)
    x = logits.clone().requires_grad_()
    loss = cross_entropy(x, labels, 50257)
    loss.sum().backward()
    ref_x = logits.float()[..., :50257].clone().requires_grad_()
    ref = F.cross_entropy(ref_x.reshape(-1, 50257), labels.reshape(-1), reduction="none")
    ref.sum().backward()
    assert torch.allclose(loss.reshape(-1), ref, rtol=1e-5, atol=1e-4)
    tol = 1e-6 if dtype == torch.float32 else 2 ** -8
    assert torch.allclose(x.grad[..., :50257].float(), ref_x.grad, rtol=tol, atol=1e-6)
    assert bool((x.grad[..., 50257:] == 0).all())
