"""Gradients of an embedding replicated on every pipeline stage (Subspace Networks' x0).

The subspace-constrained model (megatron/training/subspace.py) rebuilds the embedding part x0
of the residual stream on every stage, so every stage holds a copy of the embedding tables and
each copy's gradient is that stage's share of the one true gradient. This channel runs after
the ordinary emb channel (which has summed the tied output layer into stage 0's copy and the
last stage's output weight): it sums the copies' gradients over `group` -- all pipeline stages
of one data-parallel replica and tensor-parallel rank, whose vocabulary shards match -- and
writes the sum into every copy and its mirrors, so every copy takes the same step. Exact: one
SUM all-reduce per table, its bytes on the `emb` channel.
"""
from typing import List, Tuple

import torch
import torch.distributed as dist

from megatron.cc.grad_sync.channel import SyncChannel
from megatron.cc.stats import ChannelStats


class ReplicaEmbeddingSync(SyncChannel):
    """`inner` (the emb channel), then the sum of each replicated table over `group`.

    copies: per table, (this stage's copy, parameters that take the same summed gradient:
    the last stage's tied output weight). Gradients are read from `main_grad` (megatron DDP's
    buffers), after the dp channel has averaged them over replicas.
    """

    def __init__(self, inner: SyncChannel, group, stats: ChannelStats,
                 copies: List[Tuple[torch.nn.Parameter, List[torch.nn.Parameter]]]):
        self.inner, self.group, self.stats, self.copies = inner, group, stats, copies

    def __call__(self, model, iteration: int) -> None:
        self.inner(model, iteration)
        if self.group is None or dist.get_world_size(self.group) < 2:
            return
        for copy, mirrors in self.copies:
            grad = copy.main_grad
            dist.all_reduce(grad, group=self.group)
            for m in mirrors:
                m.main_grad.copy_(grad)
            n = grad.numel() * grad.element_size()
            self.stats.add("emb", n, n)

    @property
    def overlapped(self) -> bool:
        return self.inner.overlapped

    def state_dict(self) -> dict:
        return self.inner.state_dict()   # this channel has no state of its own

    def load_state_dict(self, sd: dict) -> None:
        self.inner.load_state_dict(sd)
