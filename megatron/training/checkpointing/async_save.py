"""Background checkpoint writes: snapshot to host memory now, write and checksum on a thread.

    writer = AsyncWriter()
    writer.submit([(snapshot(state), path), ...])   # returns at once
    ...                                             # training goes on
    writer.poll()  -> True once every file is written (re-raises the thread's error)

The snapshot is the only part on the training path: a copy of every tensor into host memory
(on GPU: into pinned buffers kept between saves, one device sync), so training may change the
live tensors right after. The thread then torch.saves (which releases the GIL while it writes
tensor data), fsyncs and records checksums (checkpoint_io.write_file). At most one batch of
writes is in flight: the caller polls or waits before the next submit.
"""
from typing import Dict, List, Optional, Tuple

import torch

from megatron.cc.common.background import BackgroundCall
from megatron.training.checkpointing.checkpoint_io import write_file
from megatron.training.runtime.topology import cuda_available


class HostSnapshot:
    """Copies nested state (dicts, lists, tuples, tensors, plain values) into host memory."""

    def __init__(self):
        self._pinned: Dict[Tuple, torch.Tensor] = {}   # (path in the state, shape, dtype) -> buffer

    def __call__(self, obj):
        out = self._copy(obj, ())
        if cuda_available():
            torch.cuda.synchronize()   # sync point: the non-blocking copies must land first
        return out

    def _copy(self, obj, key):
        if torch.is_tensor(obj):
            if obj.device.type == "cpu":
                return obj.detach().clone()
            slot = (key, tuple(obj.shape), obj.dtype)
            buf = self._pinned.get(slot)
            if buf is None:
                buf = self._pinned[slot] = torch.empty(obj.shape, dtype=obj.dtype,
                                                       pin_memory=True)
            return buf.copy_(obj.detach(), non_blocking=True)
        if isinstance(obj, dict):
            return type(obj)((k, self._copy(v, key + (k,))) for k, v in obj.items())
        if isinstance(obj, (list, tuple)):
            return type(obj)(self._copy(v, key + (i,)) for i, v in enumerate(obj))
        return obj


class AsyncWriter:
    """One background thread writing one checkpoint's files; errors surface in poll/wait."""

    def __init__(self):
        self._call: Optional[BackgroundCall] = None

    @property
    def busy(self) -> bool:
        return self._call is not None

    def submit(self, jobs: List[Tuple[object, str]]) -> None:
        if self.busy:
            raise RuntimeError("an asynchronous checkpoint write is still in flight; wait first")
        self._call = BackgroundCall("asynchronous checkpoint write failed", self._run, jobs,
                                    name="async-checkpoint-writer")

    @staticmethod
    def _run(jobs) -> None:
        for obj, path in jobs:
            write_file(obj, path)

    def poll(self) -> bool:
        """True when nothing is in flight any more; raises what the thread raised."""
        if self._call is None:
            return True
        if not self._call.done:
            return False
        return self.wait()

    def wait(self) -> bool:
        if self._call is not None:
            call, self._call = self._call, None
            call.result()   # raises what the writer raised
        return True
