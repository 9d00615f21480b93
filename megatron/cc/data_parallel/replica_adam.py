"""AdamW for replicas whose steps are averaged afterwards (the parameter-syncing dp modes).

A replica's gradient carries dp times the noise variance of the all-reduced one, so its Adam
step is up to sqrt(dp) smaller. ReplicaAdamW divides instead by an estimate of the all-reduced
gradient's second moment from the replica's own bias-corrected moments, with no bytes sent:

    v_dp = v_hat / dp + (1 - 1/dp) * min(m_hat^2, v_hat)

--dp-adam-correction; the state is AdamW's own, and dp = 1 is plain AdamW. Rationale and
tests: docs/data_parallel.md.
"""
import math

import torch


def dp_second_moment(m_hat: torch.Tensor, v_hat: torch.Tensor, dp: int) -> torch.Tensor:
    """The estimated second moment of the mean of dp replicas' gradients (see module doc)."""
    return v_hat / dp + (1.0 - 1.0 / dp) * torch.minimum(m_hat * m_hat, v_hat)


class ReplicaAdamW(torch.optim.AdamW):
    """torch.optim.AdamW with the denominator sqrt(v_dp) + eps (module doc) instead of
    sqrt(v_hat) + eps. Decoupled weight decay, bias corrections and state as in AdamW."""

    def __init__(self, params, dp: int, **kwargs):
        if dp < 1:
            raise ValueError(f"dp must be >= 1, got {dp}")
        super().__init__(params, **kwargs)
        self.dp = dp

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group.get("amsgrad") or group.get("maximize"):
                raise ValueError("ReplicaAdamW: amsgrad / maximize are not supported")
            beta1, beta2 = group["betas"]
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if len(state) == 0 or "step" not in state:
                    # on the host, as in AdamW: t is read every step without a device sync
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p,
                                                           memory_format=torch.preserve_format)
                state["step"] += 1
                t = float(state["step"])
                m, v, g = state["exp_avg"], state["exp_avg_sq"], p.grad
                p.mul_(1.0 - lr * wd)
                m.lerp_(g, 1.0 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
                bc1, bc2 = 1.0 - beta1 ** t, 1.0 - beta2 ** t
                # dp_second_moment in v's own (uncorrected) units, in place, few passes:
                # sqrt(x / bc2) + eps == (sqrt(x) + eps sqrt(bc2)) / sqrt(bc2)
                d = torch.mul(m, m).mul_(bc2 / (bc1 * bc1))
                torch.minimum(d, v, out=d)
                d.mul_(1.0 - 1.0 / self.dp).add_(v, alpha=1.0 / self.dp)
                d.sqrt_().add_(eps * math.sqrt(bc2))
                p.addcdiv_(m, d, value=-lr * math.sqrt(bc2) / bc1)
        return loss


def use_replica_adam(optimizer, dp: int) -> None:
    """Swap the Adam inside a freshly built megatron-core optimizer (FP32Optimizer, or each one
    of a ChainedOptimizer; torch's AdamW or a fused one) for ReplicaAdamW over the same param
    groups. Call before the lr scheduler is built and before any step (no state to carry)."""
    for wrapper in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = wrapper.optimizer
        if any(len(s) for s in inner.state.values()):
            raise ValueError("use_replica_adam: the optimizer has already stepped")
        d = inner.defaults
        wrapper.optimizer = ReplicaAdamW(inner.param_groups, dp, lr=d["lr"], betas=d["betas"],
                                         eps=d["eps"], weight_decay=d["weight_decay"])
