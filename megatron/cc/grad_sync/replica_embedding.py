"""Gradients of an embedding replicated on every pipeline stage (Subspace Networks' x0).

The subspace-constrained model (megatron/training/subspace.py) rebuilds the embedding part x0
of the residual stream on every stage, so every stage holds a copy of the embedding tables and
each copy's gradient is that stage's share of the one true gradient. Around the ordinary emb
channel: before it, the last stage adds its copy's gradient of the tied word table into the
output weight's (so the emb channel's first + last sum carries both of its uses); after it,
each table's gradient is summed over `group` -- all pipeline stages of one data-parallel
replica and tensor-parallel rank, whose vocabulary shards match -- and written into every copy
and the output weight, so every copy takes the same step. Exact: at most one SUM all-reduce per
table (none for the tied word table at pp 2, where the emb channel's sum already is the whole),
its bytes on the `emb` channel.
"""
from dataclasses import dataclass
from typing import List, Optional

import torch
import torch.distributed as dist

from megatron.cc.grad_sync.channel import SyncChannel
from megatron.cc.stats import ChannelStats


@dataclass
class ReplicaTable:
    """One replicated table as this stage holds it.

    copy: this stage's copy (main_grad: this stage's share of the gradient).
    fold_into: the last stage's tied output weight, when the table is the tied word
        embedding: the copy's gradient is added to it before the emb channel runs, so the
        emb channel's first + last sum already holds both of the last stage's uses; after
        it, the copy takes the output weight's summed gradient.
    allreduce: sum over the stages (False only where the emb channel's sum is already the
        whole gradient: the tied word table at pp 2, which saves a second V/tp x H
        all-reduce over the same two stages). Equal on every stage of the group.
    """
    copy: torch.nn.Parameter
    fold_into: Optional[torch.nn.Parameter] = None
    allreduce: bool = True


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
            if t.allreduce:
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
