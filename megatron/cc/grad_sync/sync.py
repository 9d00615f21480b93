"""The exact dp and emb channels, and GradSync, which runs one of each after backward.

dp: megatron-core's DDP grad buffers, all-reduced bucket by bucket (already scaled by 1/dp).
emb: the tied word-embedding gradient summed between the first and last stage (Megatron's
embedding group), so both copies of the weight take the same step.
Compressed dp modes (selective PowerSGD, ...) and the fused emb mode replace these objects;
GradSync itself does not change.
"""
import torch
import torch.distributed as dist

from megatron.cc.stats import ChannelStats


def _unwrap(model):
    while hasattr(model, "module"):
        model = model.module
    return model


def shared_embedding_weight(model):
    """The tied word-embedding weight on this stage, or None (middle stages, untied models)."""
    m = _unwrap(model)
    if not getattr(m, "share_embeddings_and_output_weights", False):
        return None
    if not (getattr(m, "pre_process", False) or getattr(m, "post_process", False)):
        return None
    return m.shared_embedding_or_output_weight()


class ExactDataParallelSync:
    """All-reduce of the DDP grad buffers (the uncompressed baseline)."""

    def __init__(self, group, stats: ChannelStats):
        self.group = group
        self.stats = stats
        self.world = dist.get_world_size(group)

    def __call__(self, model, iteration: int) -> None:
        model.finish_grad_sync()  # megatron DDP: start + wait for every bucket's all-reduce
        if self.world > 1:
            n = sum(b.grad_data.numel() * b.grad_data.element_size() for b in model.buffers)
            self.stats.add("dp", n, n)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, sd: dict) -> None:
        pass


class EmbeddingSync:
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

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, sd: dict) -> None:
        pass


class GradSync:
    """dp channel then emb channel; checkpointable as one component."""

    def __init__(self, dp, emb):
        self.dp, self.emb = dp, emb

    def __call__(self, model, iteration: int) -> None:
        self.dp(model, iteration)
        self.emb(model, iteration)

    def state_dict(self) -> dict:
        return {"dp": self.dp.state_dict(), "emb": self.emb.state_dict()}

    def load_state_dict(self, sd: dict) -> None:
        self.dp.load_state_dict(sd.get("dp", {}))
        self.emb.load_state_dict(sd.get("emb", {}))
