"""The fused tp-1 loss (megatron/training/loop/cross_entropy.py) under Triton's interpreter
against what lm_loss's eager route computes (the softmax cross entropy of the fp32 logits over
the real vocabulary), here PyTorch's own cross_entropy: loss and gradient, padded vocabularies,
rows longer than one block, bf16 logits, strided rows; and lm_loss takes it for CUDA tensors
at tp 1 only."""
import pytest
import torch
import torch.nn.functional as F

from tests.cc.kernels.interpret import kernels

kernels("megatron.training.loop.cross_entropy_kernels")

from megatron.training.loop import cross_entropy as ce  # noqa: E402
from megatron.training.loop import training  # noqa: E402


def eager(logits, labels, real):
    """Per-token softmax cross entropy of the fp32 logits' first `real` columns."""
    x = logits.float()[..., :real]
    return F.cross_entropy(x.reshape(-1, real), labels.reshape(-1),
                           reduction="none").view(labels.shape)


def fused(logits, labels, real):
    return ce._CrossEntropy.apply(logits, labels, real)


def case(b, s, v, dtype=torch.float32, seed=0, spread=3.0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(b, s, v, generator=g) * spread).to(dtype)
    labels = torch.randint(0, v, (b, s), generator=g)
    return logits, labels


@pytest.mark.parametrize("b,s,v,real", [(2, 3, 40, 40), (2, 5, 128, 100),
                                        (1, 3, 4096 + 300, 4096 + 257)],
                         ids=["exact-vocab", "padded", "two-blocks-padded"])
def test_loss_and_gradient_match_the_eager_loss(b, s, v, real):
    logits, labels = case(b, s, v)
    labels = labels % real
    weights = torch.rand(b, s, generator=torch.Generator().manual_seed(1))
    outs = []
    for f in (eager, fused):
        x = logits.clone().requires_grad_()
        loss = f(x, labels, real)
        (loss * weights).sum().backward()
        outs.append((loss.detach(), x.grad))
    (le, ge), (lf, gf) = outs
    assert lf.dtype == torch.float32 and lf.shape == (b, s)
    assert torch.allclose(lf, le, rtol=1e-6, atol=1e-5), (lf - le).abs().max()
    assert torch.allclose(gf, ge, rtol=1e-5, atol=1e-7), (gf - ge).abs().max()
    assert bool((gf[..., real:] == 0).all())   # padding: no probability, no gradient


def test_bf16_logits_read_in_their_dtype():
    logits, labels = case(2, 4, 300, torch.bfloat16, spread=8.0)
    x = logits.clone().requires_grad_()
    loss = fused(x, labels, 300)
    loss.sum().backward()
    ref = eager(logits.float(), labels, 300)   # the same values, widened exactly
    assert torch.allclose(loss, ref, rtol=1e-6, atol=1e-5)
    assert x.grad.dtype == torch.bfloat16
    # the interpreter's fp32 -> bf16 cast truncates (CUDA rounds): within one bf16 step
    xr = logits.float().requires_grad_()
    eager(xr, labels, 300).sum().backward()
    assert torch.allclose(x.grad.float(), xr.grad, rtol=2 ** -7, atol=1e-6)


def test_strided_rows_and_extreme_logits():
    logits, labels = case(3, 2, 200, spread=1.0)
    logits[0, 0, 5] = 1e4                       # one dominant logit: its softmax is 1
    logits[1, 1] = -1e4                         # a row of equal very negative values
    wide = torch.zeros(3, 2, 256)
    wide[..., :200] = logits
    view = wide[..., :200]                      # rows 256 apart, unit column stride
    got = fused(view, labels, 200)
    assert torch.allclose(got, eager(logits, labels, 200), rtol=1e-6, atol=1e-5)
    assert torch.isfinite(got).all()


def test_lm_loss_takes_the_fused_route_for_cuda_at_tp_1_only(monkeypatch):
    from megatron.core import tensor_parallel
    calls = []
    monkeypatch.setattr(training.dispatch, "enabled", lambda *t: True)
    monkeypatch.setattr(tensor_parallel, "vocab_parallel_cross_entropy",
                        lambda l, y: calls.append("megatron-core") or l.sum(-1))
    monkeypatch.setattr(training, "cross_entropy",
                        lambda l, y, real: calls.append(real) or l.sum(-1))
    logits, labels = case(1, 2, 128)
    training.lm_loss(logits, labels, vocab_size=100, tp_rank=0)
    assert calls == [100]
    training.lm_loss(logits, labels, vocab_size=200, tp_rank=0, tp_size=2)
    assert calls == [100, "megatron-core"]      # tp 2: the vocab-parallel loss


def test_refuses_a_real_vocabulary_outside_the_logits():
    logits, labels = case(1, 2, 64)
    with pytest.raises(ValueError, match="real vocabulary 65"):
        ce.cross_entropy(logits, labels, 65)
