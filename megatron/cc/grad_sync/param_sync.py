"""What the parameter-syncing dp modes (cocktail, diloco, preduce, adpsgd) share.

These modes keep each replica's gradient local (no dp all-reduce; DDP's 1/dp is never applied)
and exchange parameters or parameter deltas after the optimizer step. The tied word embedding,
held by the first and the last stage, is always a segment of its own, so both copies stay
identical.
"""
import contextlib
from typing import Dict, List

import torch
import torch.distributed as dist

from megatron.cc.grad_sync.sync import shared_embedding_weight


def param_segments(model) -> Dict[str, List[torch.Tensor]]:
    """{"embedding": [tied weight]} (first/last stage only) and {"params": the rest}."""
    emb = shared_embedding_weight(model)
    rest = [p for p in model.parameters() if p.requires_grad and p is not emb]
    out = {}
    if emb is not None:
        out["embedding"] = [emb]
    if rest:
        out["params"] = rest
    return out


def flatten(params: List[torch.Tensor]) -> torch.Tensor:
    """fp32 flat copy of the parameters' values."""
    return torch.cat([p.detach().reshape(-1).float() for p in params])


def add_flat_(params: List[torch.Tensor], flat: torch.Tensor) -> None:
    off = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            p.add_(flat[off:off + n].view_as(p).to(p.dtype))
            off += n


def copy_flat_(params: List[torch.Tensor], flat: torch.Tensor) -> None:
    off = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            p.copy_(flat[off:off + n].view_as(p))
            off += n


def to_device(d, device):
    """Tensors moved to `device`, containers rebuilt: state a checkpoint loaded on the CPU,
    placed beside the parameters it belongs to (once, at the first step after a resume)."""
    if isinstance(d, dict):
        return {k: to_device(v, device) for k, v in d.items()}
    if isinstance(d, (list, tuple)):
        return [to_device(v, device) for v in d]
    return d.to(device) if torch.is_tensor(d) else d


def clone_state(d: dict) -> dict:
    """Tensors cloned, plain containers copied: safe to hand to a checkpoint writer."""
    if isinstance(d, dict):
        return {k: clone_state(v) for k, v in d.items()}
    if isinstance(d, (list, tuple)):
        return [clone_state(v) for v in d]
    return d.detach().clone() if torch.is_tensor(d) else d


@contextlib.contextmanager
def replica_average(model, group):
    """Inside the block the model holds the mean of its dp replicas' weights (the iterate the modes'
    analyses follow); after it, this replica's own weights again, bit for bit (fp32 copies).
    Collective over `group`.
    """
    segments = param_segments(model)
    own = {k: flatten(v) for k, v in segments.items()}
    world = dist.get_world_size(group)
    for key, params in segments.items():
        mean = own[key].clone()
        dist.all_reduce(mean, group=group)
        copy_flat_(params, mean / world)
    try:
        yield
    finally:
        for key, params in segments.items():
            copy_flat_(params, own[key])
