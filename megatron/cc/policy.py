"""Which pipeline messages are compressed: pure functions both ends of a link evaluate.

Nothing about the decision crosses the wire and nothing depends on call order: the sender and
the receiver each compute it from (sender stage, micro-batch, iteration, pp, M).
"""
from dataclasses import dataclass


def num_warmup_microbatches(stage: int, pp: int, num_microbatches: int) -> int:
    """Forward passes stage `stage` runs before its first backward in non-interleaved 1F1B."""
    return min(pp - stage - 1, num_microbatches)


def is_critical_backward_send(sender_stage: int, microbatch: int, pp: int,
                              num_microbatches: int) -> bool:
    """Optimus-CC epilogue-only CB: is the backward send of `microbatch` by `sender_stage` on
    1F1B's critical path, i.e. the last send of the steady phase or any cool-down send?

    The sender runs `remaining = M - warmup` steady iterations, each ending with one backward
    send (micro-batches 0 .. remaining-1), then `warmup` cool-down sends. When M is smaller
    than the warm-up depth there is no steady phase and every send is in the cool-down.
    """
    remaining = num_microbatches - num_warmup_microbatches(sender_stage, pp, num_microbatches)
    return microbatch >= remaining - 1


@dataclass
class BackwardCompressionPolicy:
    """CB's decision for the bwd link whose sender is `sender_stage`."""
    sender_stage: int
    pp: int
    num_microbatches: int
    warmup_iters: int = 0
    epilogue_only: bool = False

    def __call__(self, msg) -> bool:
        if msg.iteration < self.warmup_iters:
            return False
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
