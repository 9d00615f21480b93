"""The exact dp and emb channels, and GradSync, which runs one of each after backward.

dp: megatron-core's DDP grad buffers, all-reduced bucket by bucket to the replica average.
emb: the tied word-embedding gradient summed between the first and last stage, so both
copies take the same step. Compressed dp modes and the fused emb mode replace these objects;
GradSync does not change. With fused embedding sync the embedding's slice is left out of the
dp all-reduce (`allreduce_buckets`, zero-copy views).
"""
import time

import torch.distributed as dist

from megatron.cc.grad_sync.channel import SyncChannel
from megatron.cc.common.stats import ChannelStats


def unwrap(model):
    """The model inside DDP / Float16Module wrappers (each keeps it as `.module`)."""
    while hasattr(model, "module"):   # torch and megatron-core wrappers
        model = model.module
    return model


def shared_embedding_weight(model):
    """The tied word-embedding weight on this stage, or None (middle stages, untied models)."""
    m = unwrap(model)
    if not getattr(m, "share_embeddings_and_output_weights", False):
        return None
    if not (getattr(m, "pre_process", False) or getattr(m, "post_process", False)):
        return None
    return m.shared_embedding_or_output_weight()


def check_ddp_supported(model, why: str = "compressed / fused gradient sync") -> None:
    """Our dp channels replace megatron DDP's own grad all-reduce: it must not run by itself.
    The distributed optimizer is fine: these channels leave every rank's buffer whole and
    averaged, of which its optimizer shard reads its own range (in place of DDP's
    reduce-scatter)."""
    if model.ddp_config.overlap_grad_reduce:
        raise NotImplementedError(f"{why}: needs megatron DDP with overlap_grad_reduce=False")
    if getattr(model, "expert_parallel_buffers", None):
        raise NotImplementedError("expert-parallel (MoE) grad buffers are not supported")


def param_gather_bytes(model) -> int:
    """Bytes megatron-core's distributed optimizer all-gathers after the step (the updated
    parameters) when one of our channels reduced the grads: half an all-reduce of the parameter
    buffers."""
    if not model.ddp_config.use_distributed_optimizer:
        return 0
    return sum(b.param_data.numel() * b.param_data.element_size() for b in model.buffers) // 2


def coalescing_refused(model, group) -> bool:
    """True when megatron DDP's own sync would fail: gloo refuses CUDA tensors in the
    `allreduce_coalesced` that torch's `_coalescing_manager` becomes, but takes them in plain
    all-reduces, so those buckets go one call each."""
    return dist.get_backend(group) == "gloo" and any(b.grad_data.is_cuda for b in model.buffers)


def grad_reduce_factor(model, world: int) -> float:
    """What megatron DDP multiplies the sum over replicas by: 1/dp (1 with per-token loss)."""
    factors = {b.gradient_scaling_factor for buf in model.buffers for b in buf.buckets}
    if len(factors) != 1:
        raise NotImplementedError(f"grad buckets with different scaling factors: {factors}")
    factor = factors.pop()
    return factor / world if model.ddp_config.average_in_collective else factor


def allreduce_buckets(model, group, exclude=()) -> int:
    """Megatron DDP's bucket all-reduce (same scaling, same op), skipping `exclude`'s grads.

    Each bucket's grad_data minus the excluded parameters' slices is reduced as contiguous
    views of the buffer (zero-copy); excluded grads keep their local, unscaled values.
    Returns the bytes put on the wire.
    """
    op = dist.ReduceOp.AVG if model.ddp_config.average_in_collective else dist.ReduceOp.SUM
    sent = 0
    for buf in model.buffers:
        for bucket in buf.buckets:
            holes = sorted(bucket.param_to_index[p] for p in exclude if p in bucket.params)
            n, start = bucket.grad_data.numel(), 0
            for a, b in holes + [(n, n)]:
                if a > start:
                    seg = bucket.grad_data[start:a]
                    if bucket.gradient_scaling_factor != 1.0:
                        seg *= bucket.gradient_scaling_factor
                    dist.all_reduce(seg, op=op, group=group)
                    sent += seg.numel() * seg.element_size()
                start = max(start, b)
    return sent


class ExactDataParallelSync(SyncChannel):
    """All-reduce of the DDP grad buffers (the uncompressed baseline).

    exclude_embedding: leave the tied embedding gradient out (it is synchronised by the fused
    emb channel instead, see fused_embedding.py).
    use_group: reduce over `group` even when DDP could do it on its own group (a channel with
    its own transport, --dp-backend).
    """

    def __init__(self, group, stats: ChannelStats, exclude_embedding: bool = False,
                 use_group: bool = False):
        self.group = group
        self.stats = stats
        self.world = dist.get_world_size(group)
        self.exclude_embedding = exclude_embedding
        self.use_group = use_group

    def __call__(self, model, iteration: int) -> None:
        weight = shared_embedding_weight(model) if self.exclude_embedding else None
        gathered = 0   # megatron DDP's own sync counts its parameter all-gather in n
        if weight is None and not self.use_group and not coalescing_refused(model, self.group):
            model.finish_grad_sync()  # megatron DDP: start + wait for every bucket's all-reduce
            n = sum(b.grad_data.numel() * b.grad_data.element_size() for b in model.buffers)
        elif weight is None and not self.use_group:   # gloo + CUDA: same buckets, one call each
            check_ddp_supported(model, why="gloo cannot coalesce CUDA all-reduces")
            allreduce_buckets(model, self.group)
            n = sum(b.grad_data.numel() * b.grad_data.element_size() for b in model.buffers)
            gathered = param_gather_bytes(model)
        else:
            check_ddp_supported(model)
            n = allreduce_buckets(model, self.group, exclude=() if weight is None else (weight,))
            gathered = param_gather_bytes(model)
        if self.world > 1:
            self.stats.add("dp", n + gathered, n)


class EmbeddingSync(SyncChannel):
    """Sum of the tied embedding gradient over the first and last stage of one replica."""

    def __init__(self, group, stats: ChannelStats):
        self.group = group
        self.stats = stats

    def __call__(self, model, iteration: int) -> None:
        if self.group is None or dist.get_world_size(self.group) < 2:
            return
        weight = shared_embedding_weight(model)
        if weight is None:
            return
        grad = weight.main_grad
        dist.all_reduce(grad, group=self.group)
        self.stats.add("emb", grad.numel() * grad.element_size(),
                       grad.numel() * grad.element_size())


def _timed(channel: SyncChannel, model, iteration: int, name: str) -> None:
    """Run a channel; a synchronous one blocks the step for its whole call ("<name> wait ms").
    Overlapped channels time their own waits."""
    group = channel.group
    if channel.overlapped or group is None or dist.get_world_size(group) < 2:
        channel(model, iteration)
        return
    t0 = time.perf_counter()
    channel(model, iteration)
    channel.stats.add_wait(name, time.perf_counter() - t0)


class GradSync:
    """dp channel then emb channel; checkpointable as one component."""

    def __init__(self, dp: SyncChannel, emb: SyncChannel):
        self.dp, self.emb = dp, emb

    def begin(self, model, iteration: int) -> None:
        """Before forward/backward: an overlapped dp channel arms its gradient hooks."""
        self.dp.begin(model, iteration)

    def __call__(self, model, iteration: int) -> None:
        _timed(self.dp, model, iteration, "dp")
        _timed(self.emb, model, iteration, "emb")

    @property
    def lockstep(self) -> bool:
        """False when replicas may be at different iterations (preduce, adpsgd)."""
        return self.dp.lockstep

    def after_optimizer_step(self, model, iteration: int) -> None:
        """Parameter-syncing dp modes (cocktail, diloco, preduce, adpsgd) act here."""
        self.dp.after_optimizer_step(model, iteration)

    def flush(self, model) -> None:
        """End of training: apply whatever a dp mode still has in flight."""
        self.dp.flush(model)

    def state_dict(self) -> dict:
        return {"dp": self.dp.state_dict(), "emb": self.emb.state_dict()}

    def load_state_dict(self, sd: dict) -> None:
        self.dp.load_state_dict(sd.get("dp", {}))
        self.emb.load_state_dict(sd.get("emb", {}))
