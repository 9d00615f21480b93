"""Optimus-CC `--emb_grad_comp`: PowerSGD on the tied embedding gradient's sum between stages.

Replaces the emb channel's exact sum over its group (the first and last stage of one replica,
or of every replica with fused embedding sync) by one warm-started PowerSGD step over the same
group; every member gets the same estimate S_hat, so both copies of the tied weight take the
same step. With error feedback each member keeps its share, E_i = M_i - S_hat / k. Where rank
r does not pay, and during the warm-up, the exact channel runs. State: Q, E and the seed.
Algorithm and differences from the seed: docs/embedding_and_tensor_parallel.md.
"""
from typing import Optional

import torch
import torch.distributed as dist

from megatron.cc.codecs.lowrank import orthogonalize_
from megatron.cc.codecs.rsvd import check_seed
from megatron.cc.grad_sync.channel import SyncChannel
from megatron.cc.embedding.fused_sync import FusedEmbeddingSync
from megatron.cc.data_parallel.powersgd import worth_compressing
from megatron.cc.grad_sync.sync import grad_reduce_factor, shared_embedding_weight
from megatron.cc.common.speed import record
from megatron.cc.common.stats import ChannelStats


class EmbPowerSGDSync(SyncChannel):
    """emb channel, lossy: rank-r PowerSGD of the tied embedding gradient's sum over a group.

    Args:
        exact: the exact emb channel this replaces (EmbeddingSync or FusedEmbeddingSync): its
            group is summed over, and it runs the warm-up and every step where r does not pay.
        stats: where the "emb" channel's bytes are counted.
        rank: r (--emb-grad-comp-rank).
        warm_up_iters: iterations (0-based) below this are exact (--emb-grad-comp-warm-up).
        error_feedback: keep each member's share of the residual (--emb-use-error-feedback).
        seed: seeds the initial Q (--comp-seed); equal on every member.
        speed: optional megatron.cc.common.speed.CompSpeed (--check-comp-speed).
    """

    def __init__(self, exact, stats: ChannelStats, rank: int = 4, warm_up_iters: int = 0,
                 error_feedback: bool = False, seed: int = 0, speed=None, eps: float = 1e-8):
        if rank < 1:
            raise ValueError(f"embedding PowerSGD rank must be >= 1, got {rank}")
        self.exact, self.stats, self.rank = exact, stats, rank
        self.group = exact.group
        self.warm_up_iters, self.error_feedback = warm_up_iters, error_feedback
        self.seed, self.speed, self.eps = seed, speed, eps
        self.world = dist.get_world_size(self.group) if self.group is not None else 1
        self.q: Optional[torch.Tensor] = None       # m x r, the last all-reduced Q
        self.error: Optional[torch.Tensor] = None   # n x m, this member's share
        self._pending: dict = {}

    def __call__(self, model, iteration: int) -> None:
        weight = shared_embedding_weight(model) if self.world > 1 else None
        if (weight is None or iteration < self.warm_up_iters
                or not worth_compressing(weight.main_grad.shape, self.rank)):
            self.exact(model, iteration)
            return
        grad = weight.main_grad   # a view of the DDP buffer: updated in place
        M = grad.view(grad.shape[0], -1)
        if isinstance(self.exact, FusedEmbeddingSync):   # FE: scale, then sum (as FE does)
            factor = grad_reduce_factor(model, self.exact.dp_world)
            if factor != 1.0:
                M.mul_(factor)
        sent = self.reduce(M)
        nbytes = M.numel() * M.element_size()
        self.stats.add("emb", sent, nbytes * self._raw_factor())

    def _raw_factor(self) -> int:
        """What the replaced exact channel counts as raw, in units of the gradient's bytes."""
        if isinstance(self.exact, FusedEmbeddingSync) and self.exact.dp_world > 1:
            return 2
        return 1

    def reduce(self, M: torch.Tensor) -> int:
        """M (n x m, this member's) <- the rank-r estimate of the group's sum; returns bytes."""
        rec = record(self.speed, "emb", "comp", M)
        with rec:
            Q_prev = self._warm_q(M)   # first use: also restores a checkpointed error
            if self.error_feedback and self.error is not None:
                M.add_(self.error)
            Q = orthogonalize_(Q_prev.clone(), self.eps)
            P = M @ Q
        dist.all_reduce(P, group=self.group)
        with rec:
            orthogonalize_(P, self.eps)
            Q = M.t() @ P
        dist.all_reduce(Q, group=self.group)
        rec.done()
        dec = record(self.speed, "emb", "decomp", M)
        with dec:
            S_hat = P @ Q.t()
            if self.error_feedback:
                self.error = torch.sub(M, S_hat, alpha=1.0 / self.world)
            M.copy_(S_hat)
            # a Q column that came out exactly zero keeps its predecessor (warm start survives)
            self.q = torch.where(torch.linalg.vector_norm(Q, dim=0) == 0, Q_prev, Q)
        dec.done()
        return P.numel() * P.element_size() + Q.numel() * Q.element_size()

    def _warm_q(self, M: torch.Tensor) -> torch.Tensor:
        if self.q is None:
            saved = self._pending.get("q")
            if saved is None:   # drawn on the CPU: the same Q on every member and device
                gen = torch.Generator().manual_seed(self.seed)
                saved = torch.randn(M.shape[1], self.rank, generator=gen)
            if tuple(saved.shape) != (M.shape[1], self.rank):
                raise ValueError(f"checkpointed embedding PowerSGD Q has shape "
                                 f"{tuple(saved.shape)}, expected {(M.shape[1], self.rank)} "
                                 f"(was --emb-grad-comp-rank changed?)")
            self.q = saved.to(device=M.device, dtype=M.dtype)
            e = self._pending.get("error")
            if e is not None:
                self.error = e.to(device=M.device, dtype=M.dtype).clone()
            self._pending = {}
        return self.q

    def state_dict(self) -> dict:
        sd = {"seed": self.seed, "exact": self.exact.state_dict()}
        q = self.q if self.q is not None else self._pending.get("q")
        e = self.error if self.q is not None else self._pending.get("error")
        if q is not None:
            sd["q"] = q.clone()
        if e is not None:
            sd["error"] = e.clone()
        return sd

    def load_state_dict(self, sd: dict) -> None:
        check_seed(sd, self.seed, "the embedding PowerSGD (--emb-grad-comp)")
        self.exact.load_state_dict(sd.get("exact", {}))
        self.q, self.error = None, None
        self._pending = {k: sd[k] for k in ("q", "error") if k in sd}

