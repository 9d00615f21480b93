"""A call on a background thread whose exception resurfaces on the thread that collects it.

The dp exchanges (CocktailSGD, DiLoCo with a sync delay) and the asynchronous checkpoint writer
run one job at a time beside training; a failure there must stop training at the point that
needs the result, not die silently in a daemon thread.

On a GPU (CUDA initialised by the creating thread) the call runs where its creator runs:
- the creator's CUDA device is set in the thread (a new thread starts on device 0, so rank r's
  job would otherwise allocate on, and launch collectives from, another rank's GPU);
- it runs on a stream of its own, which first waits for the work the creator's stream had
  queued at construction (the job's inputs), and is synchronised before the call reports done:
  wait()/result() return device-complete results, and the tensors it hands back (its value,
  and what it filled into its arguments) are recorded on the creator's stream, where they are
  used next (freed, their memory is not reused before that stream's work on them is done).

The ordering hazard of collectives from two threads, and how it is kept out:
- two threads issuing collectives on one group could interleave differently on different ranks
  (NCCL: mismatched operations, a hang). Every background channel therefore gets a process
  group of its own, used by no other thread: megatron.cc.grad_sync.groups.clone_groups
  (CocktailSGD with overlap, DiLoCo with a sync delay; checked by tests/cc/test_background_groups.py);
- were the job on the creator's stream, the creator's later NCCL work would queue behind the
  background collective's completion, and ranks that queued the two in different orders would
  wait on each other's (a cross-communicator deadlock): the job's own stream, waiting on the
  creator only for what was queued before the job existed, never makes the creator's stream
  wait on it;
- what remains is NCCL's own caveat: kernels of two communicators in flight at once must fit
  on the GPU together. CUDA_DEVICE_MAX_CONNECTIONS=1 (one hardware queue for all streams) can
  serialise them in different orders on different ranks: not set by this project; with it set,
  run these modes without their background thread (--cocktail-no-overlap, no sync delay).
"""
import threading
from typing import Any, Callable, Optional

import torch


class _CreatorDevice:
    """The creating thread's CUDA device and stream, a stream for the job, and an event
    marking what the creator's stream had queued when the job was made."""

    def __init__(self):
        self.device = torch.cuda.current_device()
        self.creator = torch.cuda.current_stream(self.device)
        self.stream = torch.cuda.Stream(device=self.device)
        self.inputs_ready = torch.cuda.Event()
        self.inputs_ready.record(self.creator)

    def run(self, fn, args):
        torch.cuda.set_device(self.device)
        self.stream.wait_event(self.inputs_ready)
        try:
            with torch.cuda.stream(self.stream):
                value = fn(*args)
        finally:
            self.stream.synchronize()   # this thread waits (not training): done means done
        for t in _tensors((value, args)):   # handed back: used next on the creator's stream
            if t.is_cuda:
                t.record_stream(self.creator)
        return value


def _tensors(obj):
    if torch.is_tensor(obj):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


class BackgroundCall:
    """fn(*args) on a daemon thread, started at construction.

    wait() joins; result() joins and returns fn's value, or raises
    RuntimeError(f"{what}: {error}") from the error fn raised (once: a second result() after
    a raise returns None). Results may also come back through arguments fn fills in
    (DiLoCo's job dict); on a GPU both are collected on the creator's stream (module docstring).
    """

    def __init__(self, what: str, fn: Callable, *args, name: Optional[str] = None):
        self.what = what
        self._value: Any = None
        self._error: Optional[BaseException] = None
        self._cuda = _CreatorDevice() if torch.cuda.is_initialized() else None   # (never on CPU)
        self._thread = threading.Thread(target=self._run, args=(fn, args), daemon=True,
                                        name=name)
        self._thread.start()

    def _run(self, fn, args) -> None:
        try:
            self._value = fn(*args) if self._cuda is None else self._cuda.run(fn, args)
        except BaseException as e:   # handed to the collecting thread by result()
            self._error = e

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self) -> None:
        self._thread.join()

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            err, self._error = self._error, None
            raise RuntimeError(f"{self.what}: {err}") from err
        return self._value
