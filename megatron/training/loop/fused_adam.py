"""torch's fused AdamW for megatron-core's optimizer on CUDA when neither Transformer Engine nor
apex is installed.

megatron-core then builds torch.optim.Adam / AdamW with torch's default, the foreach kernels
(several launches per step and tensor list); Megatron-LM's intent is a fused Adam (TE's or
apex's FusedAdam), and torch has one: one launch per parameter chunk. Same update up to
rounding. Optimizers of another class (--dp-adam-correction's ReplicaAdamW, Muon's half that
is not Adam, TE's or apex's) are left as they are, and so is every optimizer on the CPU, whose
losses the tests compare bit for bit.
"""
from __future__ import annotations

import torch

from megatron.training.runtime.compat import optimizer_parts

ADAMS = (torch.optim.Adam, torch.optim.AdamW)


def _on_cuda(group) -> bool:
    return all(p.is_cuda and p.is_floating_point() for p in group["params"])


def use_fused_adam(optimizer, on_device=_on_cuda) -> int:
    """Switch the torch Adam(W) groups of megatron-core's `optimizer` whose parameters are all
    on CUDA to fused=True; returns how many groups run fused. Called again after a checkpoint
    is loaded (a checkpoint's param groups carry their own foreach / fused flags), it also
    moves Adam's step counters where the fused kernel reads them (the device, float32)."""
    n = 0
    for part in optimizer_parts(optimizer):
        inner = getattr(part, "optimizer", None)
        if type(inner) not in ADAMS:
            continue
        for group in inner.param_groups:
            if not group["params"] or not on_device(group) or group.get("differentiable"):
                continue
            group["fused"], group["foreach"] = True, False
            for p in group["params"]:
                step = inner.state.get(p, {}).get("step")
                if torch.is_tensor(step) and (step.device != p.device
                                              or step.dtype != torch.float32):
                    inner.state[p]["step"] = step.to(p.device, torch.float32)
            n += 1
        if n:
            inner.defaults["fused"], inner.defaults["foreach"] = True, False
    return n
