"""ReplicaAdamW (--dp-adam-correction): AdamW whose denominator estimates the second moment of
the replicas' mean gradient from the replica's own moments.

- dp = 1 is torch.optim.AdamW (weight decay, bias corrections), to float rounding;
- on synthetic gradients (per-coordinate mean mu, per-replica noise s), the estimate from one
  replica's moments is at most 40% above (and not below) the second moment of the mean of dp
  replicas' gradients, both where noise dominates (plain local Adam is off by a factor of dp
  there) and where the signal does;
- the mean of dp replicas' steps matches one AdamW step on the mean gradient in size, where
  the mean of plain local AdamW steps is about sqrt(dp) too small (the defect it corrects);
- the state is AdamW's own: a state_dict of one loads into the other.
"""
import math

import pytest
import torch

from megatron.cc.data_parallel.replica_adam import ReplicaAdamW, dp_second_moment, use_replica_adam

BETAS, EPS, LR, WD = (0.9, 0.999), 1e-8, 1e-2, 0.1


def test_dp1_is_adamw():
    torch.manual_seed(0)
    w0 = torch.randn(64, 8)
    a, b = w0.clone().requires_grad_(), w0.clone().requires_grad_()
    ref = torch.optim.AdamW([a], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    ours = ReplicaAdamW([b], dp=1, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    for _ in range(20):
        g = torch.randn_like(w0)
        a.grad, b.grad = g.clone(), g.clone()
        ref.step()
        ours.step()
    torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)
    assert not torch.equal(a, w0)
    for k in ("exp_avg", "exp_avg_sq", "step"):
        torch.testing.assert_close(ours.state[b][k], ref.state[a][k])


def test_step_uses_the_estimate():
    """One step from given moments: p (1 - lr wd) - lr m_hat / (sqrt(v_dp) + eps), v_dp from
    dp_second_moment (the step computes it in place, in v's units)."""
    torch.manual_seed(1)
    dp, t = 4, 7
    w = torch.randn(256, requires_grad=True)
    opt = ReplicaAdamW([w], dp=dp, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    m, v, g = torch.randn(256), torch.rand(256), torch.randn(256)
    opt.state[w] = {"step": torch.tensor(float(t - 1)), "exp_avg": m.clone(),
                    "exp_avg_sq": v.clone()}
    w0 = w.detach().clone()
    w.grad = g
    opt.step()
    m1 = BETAS[0] * m + (1 - BETAS[0]) * g
    v1 = BETAS[1] * v + (1 - BETAS[1]) * g * g
    m_hat, v_hat = m1 / (1 - BETAS[0] ** t), v1 / (1 - BETAS[1] ** t)
    want = w0 * (1 - LR * WD) - LR * m_hat / (dp_second_moment(m_hat, v_hat, dp).sqrt() + EPS)
    torch.testing.assert_close(w.detach(), want, rtol=1e-5, atol=1e-6)
    # and it is not plain AdamW's step
    plain = w0 * (1 - LR * WD) - LR * m_hat / (v_hat.sqrt() + EPS)
    assert (w.detach() - plain).abs().max() > 1e-4


def _moments(grads, betas=BETAS):
    """Bias-corrected Adam moments of a sequence of gradients."""
    m = torch.zeros_like(grads[0])
    v = torch.zeros_like(grads[0])
    for g in grads:
        m.lerp_(g, 1 - betas[0])
        v.mul_(betas[1]).addcmul_(g, g, value=1 - betas[1])
    t = len(grads)
    return m / (1 - betas[0] ** t), v / (1 - betas[1] ** t)


@pytest.mark.parametrize("dp", [2, 4, 8])
@pytest.mark.parametrize("signal", [0.05, 3.0])   # noise-dominated / signal-dominated
def test_estimate_tracks_the_mean_gradients_second_moment(dp, signal):
    gen = torch.Generator().manual_seed(dp)
    n, steps = 4096, 3000
    mu = signal * torch.randn(n, generator=gen)
    local = [mu + torch.randn(dp, n, generator=gen) for _ in range(steps)]
    m0, v0 = _moments([g[0] for g in local])             # replica 0's own moments
    _, v_mean = _moments([g.mean(0) for g in local])     # Adam on the all-reduced gradient
    est = dp_second_moment(m0, v0, dp)
    rel = (est.mean() - v_mean.mean()) / v_mean.mean()
    # on the safe side (not smaller), and over by at most the noise m_hat^2 carries:
    # (1 - 1/dp) (1 - b1) / (1 + b1) s^2 = 0.37 of s^2/dp at dp = 8
    assert -0.05 < rel < 0.4, (dp, signal, rel.item())
    plain = (v0.mean() - v_mean.mean()).abs() / v_mean.mean()
    if signal < 1:   # the defect: plain local Adam's v is ~dp times the all-reduced one
        assert plain > 0.5 * (dp - 1), plain.item()
        assert rel < plain / 4


def _replica_steps(cls, replicas, steps=200, **kw):
    """Mean parameter change of dp replicas over `steps` local steps from the same start,
    and of one AdamW on the mean gradient, on a noise-dominated linear loss."""
    gen = torch.Generator().manual_seed(1)
    n = 2048
    mu = 0.05 * torch.randn(n, generator=gen)
    dp = replicas
    ws = [torch.zeros(n, requires_grad=True) for _ in range(dp)]
    w_ref = torch.zeros(n, requires_grad=True)
    opts = [cls([w], lr=1e-3, betas=BETAS, eps=EPS, weight_decay=0.0, **kw) for w in ws]
    ref = torch.optim.AdamW([w_ref], lr=1e-3, betas=BETAS, eps=EPS, weight_decay=0.0)
    for _ in range(steps):
        g = mu + torch.randn(dp, n, generator=gen)
        for i, (w, o) in enumerate(zip(ws, opts)):
            w.grad = g[i].clone()
            o.step()
        w_ref.grad = g.mean(0)
        ref.step()
    mean = torch.stack([w.detach() for w in ws]).mean(0)
    # signal part of the change: its projection on -mu, per unit of |mu|^2
    return (-(mean @ mu) / (mu @ mu)).item(), (-(w_ref.detach() @ mu) / (mu @ mu)).item()


def test_averaged_steps_follow_adam_on_the_mean_gradient():
    dp = 4
    ours, ref = _replica_steps(ReplicaAdamW, dp, dp=dp)
    plain, ref2 = _replica_steps(torch.optim.AdamW, dp)
    assert ref == pytest.approx(ref2)
    assert ours == pytest.approx(ref, rel=0.25), (ours, ref)
    # plain local AdamW: about 1/sqrt(dp) of the step along the signal
    assert plain == pytest.approx(ref / math.sqrt(dp), rel=0.25), (plain, ref)


def test_state_is_adamw_state():
    w = torch.randn(10, requires_grad=True)
    ours = ReplicaAdamW([w], dp=4, lr=LR)
    w.grad = torch.randn(10)
    ours.step()
    plain = torch.optim.AdamW([w], lr=LR)
    plain.load_state_dict(ours.state_dict())
    back = ReplicaAdamW([w], dp=4, lr=LR)
    back.load_state_dict(plain.state_dict())
    for k in ("exp_avg", "exp_avg_sq", "step"):
        assert torch.equal(back.state[w][k], ours.state[w][k])


def test_use_replica_adam_swaps_a_fresh_optimizer_only():
    class Wrapper:   # the shape of megatron-core's FP32Optimizer: .optimizer
        def __init__(self, opt):
            self.optimizer = opt
    w = torch.randn(4, requires_grad=True)
    inner = torch.optim.AdamW([w], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    wrapper = Wrapper(inner)
    use_replica_adam(wrapper, dp=4)
    swapped = wrapper.optimizer
    assert isinstance(swapped, ReplicaAdamW) and swapped.dp == 4
    assert swapped.param_groups[0] is inner.param_groups[0]   # the scheduler's groups
    assert swapped.param_groups[0]["weight_decay"] == WD
    w.grad = torch.ones(4)
    swapped.step()
    with pytest.raises(ValueError, match="already stepped"):
        use_replica_adam(wrapper, dp=4)
