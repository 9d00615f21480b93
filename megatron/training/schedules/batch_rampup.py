"""Global batch size as a function of consumed samples: Megatron's batch-size ramp-up.

    --rampup-batch-size START INCREMENT SAMPLES --global-batch-size G

starts at START and grows by INCREMENT in (G - START) / INCREMENT equal steps spread over the
first SAMPLES samples, then stays at G. The batch size depends on consumed samples alone, so a
resumed run picks up the ramp where it stopped without saving anything.
"""
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class BatchRampup:
    global_batch_size: int
    start: Optional[int] = None
    increment: int = 0
    ramp_samples: int = 0

    @classmethod
    def from_args(cls, args) -> "BatchRampup":
        ramp = getattr(getattr(args, "compat", None), "rampup_batch_size", None)
        gbs = args.training.global_batch_size
        if not ramp:
            return cls(gbs)
        return cls(gbs, *ramp)

    @property
    def active(self) -> bool:
        return self.start is not None and self.start < self.global_batch_size

    def batch_size(self, consumed_samples: int) -> int:
        if not self.active:
            return self.global_batch_size
        steps = (self.global_batch_size - self.start) // self.increment
        per_step = self.ramp_samples / steps
        done = int(consumed_samples / per_step) if per_step > 0 else steps
        return min(self.start + done * self.increment, self.global_batch_size)

    def iterations_for(self, samples: int) -> int:
        """Iterations that train on `samples` samples, counted as Megatron's update_train_iters
        does: the ramp-up iterations one by one, then whole global batches."""
        iters = consumed = 0
        while self.active and consumed <= self.ramp_samples:
            b = self.batch_size(consumed)
            if consumed + b > samples:
                return iters
            consumed += b
            iters += 1
        return iters + (samples - consumed) // self.global_batch_size
