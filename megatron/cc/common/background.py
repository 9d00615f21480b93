"""A call on a background thread whose exception resurfaces on the thread that collects it.

The dp exchanges (CocktailSGD, DiLoCo with a sync delay) and the asynchronous checkpoint writer
run one job at a time beside training; a failure there must stop training where the result is
needed. On a GPU the call runs on its creator's device and on a stream of its own that waits
for the creator's queued work; its results come back on the creator's stream. Each background
channel needs a process group of its own (megatron.cc.grad_sync.groups.clone_groups). Why:
docs/data_parallel.md, "Background exchanges".
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
    (DiLoCo's job dict); on a GPU both are collected on the creator's stream.
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
