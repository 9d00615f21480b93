"""--exit-signal-handler: turn SIGTERM (Slurm/LSF pre-emption) into "save, then exit 0".

The handler only records the signal; the training loop asks `requested()` after every
iteration, a MAX all-reduce over all ranks, so every rank stops after the same iteration
even when the signal reaches them at different times (one tiny collective per iteration, paid
only with the flag).
"""
import signal

import torch
import torch.distributed as dist


class ExitSignal:
    def __init__(self, device: torch.device, signum: int = signal.SIGTERM):
        self.signum, self.received, self.device = signum, False, device  # collective_device
        self._previous = signal.signal(signum, self._handle)

    def _handle(self, signum, frame) -> None:
        self.received = True   # nothing else is safe inside a signal handler

    def requested(self) -> bool:
        """Collective: True on every rank once any rank has received the signal."""
        flag = torch.tensor([int(self.received)], dtype=torch.int32, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    def restore(self) -> None:
        signal.signal(self.signum, self._previous)
