"""--hetero x: emulate a heterogeneous cluster on one machine.

Before its dp phase each replica sleeps u * x * (compute time of this iteration), u uniform
in [0, 1) drawn per iteration from a generator seeded by (seed, dp rank): every pipeline stage
of one replica draws the same u, so the whole replica is slow together, as one slow machine
would be. Wraps any dp mode; everything else is delegated.
"""
import random
import time

from megatron.cc.grad_sync.channel import SyncChannel


class HeteroDelay(SyncChannel):
    """Wraps a dp channel and forwards its whole contract (SyncChannel), the sleep added."""

    def __init__(self, dp: SyncChannel, fraction: float, seed: int, dp_rank: int):
        self.dp, self.fraction = dp, fraction
        self.rng = random.Random(seed * 1000003 + dp_rank)
        self._t_end = None   # when the previous dp phase ended: compute starts there

    @property
    def overlapped(self) -> bool:
        return self.dp.overlapped

    @property
    def lockstep(self) -> bool:
        return self.dp.lockstep

    def begin(self, model, iteration: int) -> None:
        self.dp.begin(model, iteration)

    def __call__(self, model, iteration: int) -> None:
        now = time.perf_counter()
        u = self.rng.random()
        if self._t_end is not None:
            time.sleep(u * self.fraction * (now - self._t_end))
        self.dp(model, iteration)

    def after_optimizer_step(self, model, iteration: int) -> None:
        self.dp.after_optimizer_step(model, iteration)
        self._t_end = time.perf_counter()

    def flush(self, model) -> None:
        self.dp.flush(model)

    def state_dict(self) -> dict:
        return self.dp.state_dict()

    def load_state_dict(self, sd: dict) -> None:
        self.dp.load_state_dict(sd)
