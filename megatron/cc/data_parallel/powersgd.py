"""Optimus-CC selective stage compression (SC): PowerSGD with error feedback on the dp channel.

Vogels et al. 2019, step for step as PyTorch's `powerSGD_hook` (the test oracle). Per weight,
M = main_grad + E is viewed as n x m; P = M Q and Q = M^T P are all-reduced (one flat buffer
each) with warm-started Q, M_hat = P Q^T is the rank-r estimate of the replicas' mean gradient,
and E <- M - M_hat. 1-D tensors, matrices where rank r does not pay and the embedding/output
weights go exactly in one flat all-reduce. Warm-up iterations are exact. State (by parameter
name): Q and E. Details: docs/pipeline_compression.md.
"""
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from megatron.cc.codecs.lowrank import orthogonalize_
from megatron.cc.grad_sync.channel import SyncChannel
from megatron.cc.grad_sync.sync import (ExactDataParallelSync, check_ddp_supported,
                                        grad_reduce_factor, param_gather_bytes,
                                        shared_embedding_weight)
from megatron.cc.common.stats import ChannelStats

NamedMatrices = List[Tuple[str, torch.Tensor]]  # (parameter name, gradient viewed as n x m)


def worth_compressing(shape, rank: int) -> bool:
    """2-D or more, and r (n + m) < n m with n = shape[0], m = the rest (implies r < min(n, m))."""
    if len(shape) < 2:
        return False
    n = int(shape[0])
    m = 1
    for s in shape[1:]:
        m *= int(s)
    return rank * (n + m) < n * m


def sent_values(shape, rank: int) -> Tuple[int, int]:
    """(values sent exactly, values of P and Q) for one tensor through PowerSGD at `rank`: the
    whole tensor where not worth_compressing, else r (n + m) factor values."""
    numel = 1
    for s in shape:
        numel *= int(s)
    if not worth_compressing(shape, rank):
        return numel, 0
    n = int(shape[0])
    return 0, rank * (n + numel // n)


def is_embedding_or_output(param) -> bool:
    return bool(getattr(param, "is_embedding_or_output_parameter", False)
                or getattr(param, "shared_embedding", False))


class PowerSGDDataParallelSync(SyncChannel):
    """dp channel: PowerSGD (rank r, error feedback, warm start) after `warm_up_iters` exact steps.

    Args:
        group: the data-parallel process group of this stage.
        stats: where the "dp" channel's bytes are counted.
        rank: r, columns of P and Q (--grad-comp-rank).
        warm_up_iters: iterations (0-based) below this are exact (--grad-comp-warm-up x iters).
        exclude_embedding: leave the tied embedding gradient to the fused emb channel.
        seed: seeds the generator of the initial Qs (must be equal on all replicas).
        eps: relative floor of column norms when orthogonalising (zero columns stay finite).
    """

    def __init__(self, group, stats: ChannelStats, rank: int = 128, warm_up_iters: int = 0,
                 exclude_embedding: bool = False, seed: int = 0, eps: float = 1e-8):
        if rank < 1:
            raise ValueError(f"PowerSGD rank must be >= 1, got {rank}")
        self.group, self.stats, self.rank = group, stats, rank
        self.warm_up_iters, self.seed, self.eps = warm_up_iters, seed, eps
        self.world = dist.get_world_size(group)
        self.exact = ExactDataParallelSync(group, stats, exclude_embedding=exclude_embedding)
        self.exclude_embedding = exclude_embedding
        self.qs: Dict[str, torch.Tensor] = {}      # name -> Q (m x r), a view of _q_flat
        self.errors: Dict[str, torch.Tensor] = {}  # name -> E (n x m)
        self._q_flat: Optional[torch.Tensor] = None
        self._p_flat: Optional[torch.Tensor] = None
        self._pending: dict = {}                   # state loaded before the first use
        self._layout = None

    # ---------------------------------------------------------------- megatron DDP entry
    def __call__(self, model, iteration: int) -> None:
        if iteration < self.warm_up_iters:
            self.exact(model, iteration)
            return
        compress, exact, factor = self._layout_of(model)
        sent, raw = self.reduce(compress, exact, factor)
        if self.world > 1:
            self.stats.add("dp", sent + param_gather_bytes(model), raw)

    def _layout_of(self, model):
        """(matrices to compress, tensors to all-reduce exactly, reduce factor); cached."""
        if self._layout is None:
            check_ddp_supported(model)
            names = {p: n for n, p in model.named_parameters()}
            skip = shared_embedding_weight(model) if self.exclude_embedding else None
            compress, exact = [], []
            for buf in model.buffers:
                for p in buf.params:
                    if p is skip:
                        continue
                    g = p.main_grad  # a view of the bucket: updating it updates the buffer
                    if not is_embedding_or_output(p) and worth_compressing(g.shape, self.rank):
                        compress.append((names[p], g.view(g.shape[0], -1)))
                    else:
                        exact.append(g)
            self._layout = (compress, exact, grad_reduce_factor(model, self.world))
        return self._layout

    # ---------------------------------------------------------------- the algorithm
    def reduce(self, compress: NamedMatrices, exact: List[torch.Tensor],
               factor: Optional[float] = None) -> Tuple[int, int]:
        """Synchronise in place: `compress` by PowerSGD, `exact` by one flat all-reduce.

        Results are the replica sum times `factor` (default 1/dp: the mean). Returns
        (bytes sent, bytes uncompressed).
        """
        factor = 1.0 / self.world if factor is None else factor
        sent = raw = 0
        if exact:
            flat = torch.cat([t.reshape(-1) for t in exact])
            if factor != 1.0:
                flat.mul_(factor)  # megatron's order: scale, then sum
            dist.all_reduce(flat, group=self.group)
            offset = 0
            for t in exact:
                t.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()
            sent += flat.numel() * flat.element_size()
            raw += flat.numel() * flat.element_size()
        if compress:
            sent += self._powersgd(compress, factor * self.world)
            raw += sum(M.numel() * M.element_size() for _, M in compress)
        return sent, raw

    def _powersgd(self, compress: NamedMatrices, post: float) -> int:
        self.init_state(compress)
        Ps, Qs = self._views(compress)
        for (name, M), P, Q in zip(compress, Ps, Qs):
            self._project(name, M, P, Q)
        q_prev = self._q_flat.clone()
        dist.all_reduce(self._p_flat, group=self.group)
        for (_, M), P, Q in zip(compress, Ps, Qs):
            self._back_project(M, P, Q)
        dist.all_reduce(self._q_flat, group=self.group)
        self._q_flat.div_(self.world)
        for (name, M), P, Q, Q_prev in zip(compress, Ps, Qs, self._views(compress, q_prev)[1]):
            self._rebuild(name, M, P, Q, Q_prev, post)
        return (self._p_flat.numel() * self._p_flat.element_size()
                + self._q_flat.numel() * self._q_flat.element_size())

    # one matrix's steps, in order: the all-reduce of P after the first, of Q after the second
    def _project(self, name: str, M, P, Q) -> None:
        """M += E (error feedback); Q orthonormalised; P = M Q."""
        if name in self.errors:
            M.add_(self.errors[name])
        orthogonalize_(Q, self.eps)
        torch.mm(M, Q, out=P)

    def _back_project(self, M, P, Q) -> None:
        """P (summed) orthonormalised; Q = M^T P."""
        orthogonalize_(P, self.eps)
        torch.mm(M.t(), P, out=Q)

    def _rebuild(self, name: str, M, P, Q, Q_prev, post: float) -> None:
        """Q averaged: M <- P Q^T x post, E <- M - P Q^T. A Q column that came out exactly
        zero (zero gradient on every replica) would stay zero forever; the previous one
        (Q_prev; None: no warm start) is kept so the warm start survives. Same on all ranks."""
        M_hat = P @ Q.t()
        if name not in self.errors:
            self.errors[name] = torch.empty_like(M)
        torch.sub(M, M_hat, out=self.errors[name])
        M.copy_(M_hat if post == 1.0 else M_hat.mul_(post))
        if Q_prev is None:
            return
        dead = torch.linalg.vector_norm(Q, dim=0) == 0
        Q.copy_(torch.where(dead, Q_prev, Q))

    def _views(self, compress: NamedMatrices, q_flat=None):
        q_flat = self._q_flat if q_flat is None else q_flat
        Ps, Qs, p_off, q_off = [], [], 0, 0
        for _, M in compress:
            n, m = M.shape
            Ps.append(self._p_flat[p_off:p_off + n * self.rank].view(n, self.rank))
            Qs.append(q_flat[q_off:q_off + m * self.rank].view(m, self.rank))
            p_off += n * self.rank
            q_off += m * self.rank
        return Ps, Qs

    def init_state(self, compress: NamedMatrices) -> None:
        """Allocate P/Q buffers; Qs from loaded state, else from the seeded generator."""
        names = [n for n, _ in compress]
        if self._q_flat is not None:
            if names != list(self.qs):
                raise RuntimeError("the set of compressed parameters changed between steps")
            return
        M0 = compress[0][1]
        kw = dict(dtype=M0.dtype, device=M0.device)
        self._p_flat = torch.empty(sum(M.shape[0] for _, M in compress) * self.rank, **kw)
        self._q_flat = torch.empty(sum(M.shape[1] for _, M in compress) * self.rank, **kw)
        _, Qs = self._views(compress)
        gen = torch.Generator().manual_seed(self.seed)
        loaded_q, loaded_e = self._pending.get("qs", {}), self._pending.get("errors", {})
        for (name, M), Q in zip(compress, Qs):
            initial = torch.randn(Q.shape, generator=gen)  # drawn for every Q: order-stable
            src = loaded_q.get(name, initial)
            if tuple(src.shape) != tuple(Q.shape):
                raise ValueError(f"checkpointed PowerSGD Q of {name} has shape "
                                 f"{tuple(src.shape)}, expected {tuple(Q.shape)} "
                                 f"(was --grad-comp-rank changed?)")
            Q.copy_(src)
            self.qs[name] = Q
            if name in loaded_e:
                self.errors[name] = loaded_e[name].to(**kw).clone().view_as(M)
        self._pending = {}

    # ---------------------------------------------------------------- checkpoint state
    def state_dict(self) -> dict:
        if self._q_flat is None:
            return {k: {n: t.clone() for n, t in v.items()} for k, v in self._pending.items()}
        return {"qs": {n: q.clone() for n, q in self.qs.items()},
                "errors": {n: e.clone() for n, e in self.errors.items()}}

    def load_state_dict(self, sd: dict) -> None:
        sd = {"qs": dict(sd.get("qs", {})), "errors": dict(sd.get("errors", {}))}
        if self._q_flat is None:
            self._pending = sd
            return
        for name, q in sd["qs"].items():
            self.qs[name].copy_(q)
        self.errors = {n: e.to(self._q_flat.device, self._q_flat.dtype).clone()
                       for n, e in sd["errors"].items()}
