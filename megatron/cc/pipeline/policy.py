"""Which pipeline messages are compressed: pure functions both ends of a link evaluate.

Nothing about the decision crosses the wire and nothing depends on call order: the sender and
the receiver each compute it from (sender stage, micro-batch, iteration, pp, M).
"""
from dataclasses import dataclass
from typing import List, Tuple


def num_warmup_microbatches(stage: int, pp: int, num_microbatches: int) -> int:
    """Forward passes stage `stage` runs before its first backward in non-interleaved 1F1B."""
    return min(pp - stage - 1, num_microbatches)


# ---------------------------------------------------------------- interleaved 1F1B
# Megatron's interleaved schedule (megatron-core pipeline_parallel/schedules.py, default
# microbatch_group_size_per_vp_stage = pp): micro-batches go in groups of pp; each group runs
# through chunk 0, then chunk 1, ... on every rank. Virtual stage of chunk c on pp rank r:
# c * pp + r. These functions are pure, so both ends of a link evaluate them alike.

def interleaved_table(num_microbatches: int, vp: int, group: int) -> List[Tuple[int, int]]:
    """(chunk, micro-batch) of the k-th forward of every rank. The last group takes whatever
    is left (megatron-core's rule; with M a multiple of pp every group has pp)."""
    M, out = num_microbatches, []
    for start in range(0, M, group):
        stop = M if start + group >= M else start + group
        out += [(c, mb) for c in range(vp) for mb in range(start, stop)]
    return out


def interleaved_backward(num_microbatches: int, vp: int, group: int) -> List[Tuple[int, int]]:
    """(chunk, micro-batch) of the k-th backward: the forward table with chunks reversed."""
    return [(vp - 1 - c, mb) for c, mb in interleaved_table(num_microbatches, vp, group)]


def num_warmup_interleaved(stage: int, pp: int, vp: int, num_microbatches: int) -> int:
    """Forwards rank `stage` runs before its first backward in interleaved 1F1B: every rank
    fills vp - 1 groups, earlier ranks two more steps per stage behind them; capped at M vp."""
    return min((pp - stage - 1) * 2 + (vp - 1) * pp, num_microbatches * vp)


def is_critical_backward_send(sender_stage: int, microbatch: int, pp: int,
                              num_microbatches: int) -> bool:
    """Optimus-CC epilogue-only CB: is the backward send of `microbatch` by `sender_stage` on
    1F1B's critical path, i.e. the last send of the steady phase or any cool-down send?
    (With M below the warm-up depth every send is in the cool-down.)
    """
    remaining = num_microbatches - num_warmup_microbatches(sender_stage, pp, num_microbatches)
    return microbatch >= remaining - 1


def is_critical_interleaved_send(sender_stage: int, sender_chunk: int, microbatch: int,
                                 pp: int, vp: int, num_microbatches: int) -> bool:
    """Epilogue-only CB under interleaving: 1F1B's rule over the sender's whole op list. A backward
    send is critical when the sender computes it as the last backward of its steady phase (the
    first M vp - W of its backwards, in `interleaved_backward` order) or in its cool-down.
    """
    order = interleaved_backward(num_microbatches, vp, pp)
    k = order.index((sender_chunk, microbatch))
    remaining = num_microbatches * vp - num_warmup_interleaved(sender_stage, pp, vp,
                                                               num_microbatches)
    return k >= remaining - 1


@dataclass
class BackwardCompressionPolicy:
    """CB's decision for the bwd link whose sender is `sender_stage` (and, interleaved,
    its model chunk `sender_chunk` of `vp`)."""
    sender_stage: int
    pp: int
    num_microbatches: int
    warmup_iters: int = 0
    epilogue_only: bool = False
    sender_chunk: int = 0
    vp: int = 1

    def __call__(self, msg) -> bool:
        if msg.iteration < self.warmup_iters:
            return False
        if self.epilogue_only and self.vp > 1:
            return is_critical_interleaved_send(self.sender_stage, self.sender_chunk,
                                                msg.microbatch, self.pp, self.vp,
                                                self.num_microbatches)
        if self.epilogue_only:
            return is_critical_backward_send(self.sender_stage, msg.microbatch, self.pp,
                                             self.num_microbatches)
        return True


@dataclass
class WarmupPolicy:
    """Compress from iteration `warmup_iters` on (forward codecs' warm-up)."""
    warmup_iters: int = 0

    def __call__(self, msg) -> bool:
        return msg.iteration >= self.warmup_iters
