"""Optimus-CC fused embedding synchronisation (FE): the tied embedding gradient in one all-reduce.

Instead of the dp all-reduce followed by the first + last stage sum, each of the first and
last stage's gradients, scaled by 1/dp, is summed in one all-reduce over "first and last stage
of every replica": the same sum in another order, so FE is lossless. One fused group per tp
rank, since each holds its own vocabulary slice. The dp channels leave the embedding out
(exclude_embedding), so it is synchronised exactly once. At pp 1 there is no emb channel and
no fused group.
"""
import torch.distributed as dist

from megatron.cc.grad_sync.channel import SyncChannel
from megatron.cc.grad_sync.sync import grad_reduce_factor, shared_embedding_weight
from megatron.cc.common.stats import ChannelStats


def create_fused_embedding_group(tp_rank: int, member: bool, timeout=None):
    """Create one group per TP rank: {first and last pipeline stage of every replica}.

    Collective over the default group: every rank calls it once, after megatron's
    initialize_model_parallel, and all groups are created on all ranks in the same order.
    `member`: this rank is on the first or last pipeline stage. Returns this rank's group, or
    None for middle stages. `timeout` (a timedelta): the groups' collective timeout; None is
    torch's default (30 min), not the default group's.
    """
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (tp_rank, bool(member)))
    mine = None
    for t in sorted({t for t, _ in everyone}):
        ranks = [r for r, (tr, m) in enumerate(everyone) if tr == t and m]
        group = dist.new_group(ranks, timeout=timeout)
        if t == tp_rank and member:
            mine = group
    return mine


class FusedEmbeddingSync(SyncChannel):
    """emb channel: the tied embedding gradient, scaled by 1/dp, summed over the fused group.

    Args:
        group: this rank's fused group (None on middle stages: nothing to do).
        stats: where the "emb" channel's bytes are counted.
        dp_world: data-parallel size (the 1/dp of the average).
    """

    def __init__(self, group, stats: ChannelStats, dp_world: int):
        self.group, self.stats, self.dp_world = group, stats, dp_world

    def __call__(self, model, iteration: int) -> None:
        if self.group is None:
            return
        weight = shared_embedding_weight(model)
        if weight is None:
            return  # untied embeddings: nothing is shared between stages
        grad = weight.main_grad
        factor = grad_reduce_factor(model, self.dp_world)
        if factor != 1.0:
            grad.mul_(factor)  # megatron's order: scale, then sum
        dist.all_reduce(grad, group=self.group)
        nbytes = grad.numel() * grad.element_size()
        # raw: what the unfused path puts on the wire for this gradient (dp + embedding group)
        self.stats.add("emb", nbytes, nbytes * (2 if self.dp_world > 1 else 1))
