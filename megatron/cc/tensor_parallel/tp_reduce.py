"""The tensor-parallel channel ("tp" on the log line): the sums megatron-core's tensor-parallel
layers all-reduce, counted, and compressed on request (Optimus-CC's --mp_acti_comp and
--mp_grad_comp).

A site is one all-reduce of one layer in one direction: `forward_sum` (row-parallel partial
outputs), `backward_sum` (column-parallel input-gradient shares), `count` (megatron-core's own,
bytes only); with sequence parallelism `forward_scatter` and `backward_gather`. Compression is
warm-started PowerSGD with P and Q all-reduced in fp32 and no error feedback; an all-gather or
reduce-scatter counts half its bytes. See docs/embedding_and_tensor_parallel.md.
"""
from dataclasses import dataclass
from typing import Dict, Optional

import torch
import torch.distributed as dist

from megatron.cc.common.compat import all_gather_single, reduce_scatter_single
from megatron.cc.codecs.lowrank import orthogonalize_
from megatron.cc.common.stats import ChannelStats


def gathered_bytes(full: int) -> int:
    """An all-gather or reduce-scatter of a `full`-byte tensor in the channel's unit (module
    doc): half an all-reduce of it."""
    return full // 2


@dataclass(frozen=True)
class LowRankSum:
    """PowerSGD of one direction: rank r, exact for the first `warm_up_iters` iterations."""
    rank: int
    warm_up_iters: int = 0


class TensorParallelReduce:
    """Counted (and per direction optionally compressed) sums over the tensor-parallel group."""

    def __init__(self, group, stats: ChannelStats, forward: Optional[LowRankSum] = None,
                 backward: Optional[LowRankSum] = None, seed: int = 0, eps: float = 1e-8):
        self.group, self.stats, self.seed, self.eps = group, stats, seed, eps
        self.compress = {"forward": forward, "backward": backward}
        self.iteration = 0
        self.qs: Dict[str, torch.Tensor] = {}

    def _rank_size(self):
        return dist.get_rank(self.group), dist.get_world_size(self.group)

    # ------------------------------------------------------------------- sums
    def count(self, nbytes: int) -> None:
        """An all-reduce megatron-core made itself (uncompressible here); call it under the
        caller's grad mode: validation (no grad) is not counted."""
        if torch.is_grad_enabled():
            self.stats.add("tp", nbytes, nbytes)

    def forward_sum(self, x: torch.Tensor, site: str, training: bool = True) -> torch.Tensor:
        """training=False (validation): exact and not counted, as on the pipeline channels."""
        return self._sum(x, f"{site}/forward", self.compress["forward"], training)

    def backward_sum(self, x: torch.Tensor, site: str) -> torch.Tensor:
        return self._sum(x, f"{site}/backward", self.compress["backward"], True)

    def forward_scatter(self, x: torch.Tensor, site: str, training: bool = True) -> torch.Tensor:
        """Sequence parallelism: this rank's block of rows (dim 0) of the sum of `x`, as
        megatron-core's reduce_scatter_to_sequence_parallel_region (or --mp-acti-comp's)."""
        return self._sum(x, f"{site}/forward", self.compress["forward"], training, scatter=True)

    def backward_gather(self, x: torch.Tensor) -> torch.Tensor:
        """The all-gather along dim 0 that is a reduce-scatter's backward (exact)."""
        rank, size = self._rank_size()
        out = torch.empty((x.shape[0] * size,) + tuple(x.shape[1:]), dtype=x.dtype,
                          device=x.device)
        all_gather_single(out, x.contiguous(), group=self.group)
        full = out.numel() * out.element_size()
        self.stats.add("tp", gathered_bytes(full), gathered_bytes(full))
        return out

    def sum_grads(self, grads) -> None:
        """All-reduce (in place, exact, counted) the gradients of parameters every rank holds
        whole but trained on its sequence block only (sequence parallelism's norms and
        row-parallel biases), as megatron-core's finalize_model_grads does: one flat message."""
        grads = list(grads)
        if not grads:
            return
        flat = torch._utils._flatten_dense_tensors(grads)
        dist.all_reduce(flat, group=self.group)
        for g, synced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
            g.copy_(synced)
        self.stats.add("tp", flat.numel() * flat.element_size(),
                       flat.numel() * flat.element_size())

    def _sum(self, x: torch.Tensor, key: str, how: Optional[LowRankSum],
             training: bool, scatter: bool = False) -> torch.Tensor:
        raw = x.numel() * x.element_size()
        counted = gathered_bytes(raw) if scatter else raw
        m = x.shape[-1]
        n = x.numel() // max(m, 1)
        if how is None or not training or self.iteration < how.warm_up_iters \
                or (n + m) * how.rank >= n * m:
            # megatron-core's own reduce: the same collective of the same contiguous tensor
            x = x.contiguous()
            if scatter:
                rank, size = self._rank_size()
                out = torch.empty((x.shape[0] // size,) + tuple(x.shape[1:]), dtype=x.dtype,
                                  device=x.device)
                reduce_scatter_single(out, x, group=self.group)
                x = out
            else:
                dist.all_reduce(x, group=self.group)
            if training:
                self.stats.add("tp", counted, counted)
            return x
        M = x.reshape(n, m).float()
        Q = self.qs.get(key)
        if Q is None:   # drawn on the CPU: the same Q on every rank and device
            Q = torch.randn(m, how.rank, generator=torch.Generator().manual_seed(self.seed))
        Q = orthogonalize_(Q.to(M.device, copy=True), self.eps)
        P = M @ Q
        dist.all_reduce(P, group=self.group)
        orthogonalize_(P, self.eps)
        Q = M.t() @ P
        dist.all_reduce(Q, group=self.group)
        self.qs[key] = Q
        self.stats.add("tp", (P.numel() + Q.numel()) * 4, counted)
        if scatter:   # the rank's sequence block: its rows of the (S B, H) view, S-major
            rank, size = self._rank_size()
            rows = n // size
            shape = (x.shape[0] // size,) + tuple(x.shape[1:])
            return (P[rank * rows:(rank + 1) * rows] @ Q.t()).to(x.dtype).reshape(shape)
        return (P @ Q.t()).to(x.dtype).reshape(x.shape)

    # ------------------------------------------------------------------- state
    def state_dict(self) -> dict:
        return {"qs": {k: q.clone() for k, q in self.qs.items()}}

    def load_state_dict(self, sd: dict) -> None:
        self.qs = {k: q.clone() for k, q in sd.get("qs", {}).items()}
