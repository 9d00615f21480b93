"""Gradients of an embedding replicated on every pipeline stage (Subspace Networks' x0).

Each stage's copy holds that stage's share of the one true gradient. Around the ordinary emb
channel: before it, the last stage folds its copy's tied-word gradient into the output
weight's; after it, each table's gradient is summed over the stages of one replica and tp rank
and written into every copy, so all copies take the same step (exact; bytes on `emb`). An
untied word table sums only the rows the iteration looked up (LookedUpRows: their union over
dp replicas, one byte per row all-reduced with MAX). Design: docs/subspace.md.
"""
from dataclasses import dataclass
from typing import List, Optional

import torch
import torch.distributed as dist

from megatron.cc.grad_sync.channel import SyncChannel
from megatron.cc.common.stats import ChannelStats


class LookedUpRows:
    """The rows of a vocabulary-parallel word table that this iteration's training forwards
    looked up (forwards without autograd, evaluation's, are not counted).

    Reading them costs one host sync (the row count) per iteration and table."""

    def __init__(self, embedding, dp_group=None):
        self.start, self.end = embedding.vocab_start_index, embedding.vocab_end_index
        self.dp_group = dp_group
        self._ids: List[torch.Tensor] = []
        embedding.register_forward_pre_hook(self._see)

    def _see(self, module, args) -> None:
        if torch.is_grad_enabled():
            self._ids.append(args[0].detach().reshape(-1))

    def take(self, stats: ChannelStats) -> torch.Tensor:
        """Sorted local row indices, the same on every stage of the replica; forgets them."""
        ids, self._ids = torch.cat(self._ids), []
        inside = (ids >= self.start) & (ids < self.end)
        mask = torch.zeros(self.end - self.start, dtype=torch.uint8, device=ids.device)
        mask.scatter_reduce_(0, torch.where(inside, ids - self.start, 0), inside.to(mask.dtype),
                             reduce="amax")
        if self.dp_group is not None and dist.get_world_size(self.dp_group) > 1:
            dist.all_reduce(mask, op=dist.ReduceOp.MAX, group=self.dp_group)
            stats.add("emb", mask.numel(), 0)
        return mask.nonzero().squeeze(1)


@dataclass
class ReplicaTable:
    """One replicated table as this stage holds it.

    copy: this stage's copy (main_grad: this stage's share of the gradient).
    fold_into: the last stage's tied output weight, when the table is the tied word
        embedding: the copy's gradient is added to it before the emb channel runs; after it,
        the copy takes the output weight's summed gradient.
    allreduce: sum over the stages (False only where the emb channel's sum is already the
        whole gradient: the tied word table at pp 2). Equal on every stage of the group.
    rows: an untied word table's looked-up rows: only those are summed.
    """
    copy: torch.nn.Parameter
    fold_into: Optional[torch.nn.Parameter] = None
    allreduce: bool = True
    rows: Optional[LookedUpRows] = None


class ReplicaEmbeddingSync(SyncChannel):
    """`inner` (the emb channel), with each replicated table's gradient summed over `group`.

    Gradients are read from `main_grad` (megatron DDP's buffers), after the dp channel has
    averaged them over replicas. Every copy ends with the same summed gradient.
    """

    def __init__(self, inner: SyncChannel, group, stats: ChannelStats,
                 tables: List[ReplicaTable]):
        self.inner, self.group, self.stats, self.tables = inner, group, stats, tables

    def __call__(self, model, iteration: int) -> None:
        for t in self.tables:
            if t.fold_into is not None:   # the last stage's two uses of the tied weight
                t.fold_into.main_grad.add_(t.copy.main_grad)
                t.copy.main_grad.zero_()
        self.inner(model, iteration)
        if self.group is None or dist.get_world_size(self.group) < 2:
            return
        for t in self.tables:
            grad = t.copy.main_grad
            if t.rows is not None:
                idx = t.rows.take(self.stats)
                part = grad.index_select(0, idx)
                dist.all_reduce(part, group=self.group)
                grad.index_copy_(0, idx, part)
                self.stats.add("emb", part.numel() * part.element_size(),
                               grad.numel() * grad.element_size())
            elif t.allreduce:
                dist.all_reduce(grad, group=self.group)   # stage 0's holds the emb sum
                n = grad.numel() * grad.element_size()
                self.stats.add("emb", n, n)
            elif t.fold_into is not None:
                grad.copy_(t.fold_into.main_grad)
            if t.fold_into is not None and t.allreduce:
                t.fold_into.main_grad.copy_(grad)

    @property
    def overlapped(self) -> bool:
        return self.inner.overlapped

    def state_dict(self) -> dict:
        return self.inner.state_dict()   # this channel has no state of its own

    def load_state_dict(self, sd: dict) -> None:
        self.inner.load_state_dict(sd)
