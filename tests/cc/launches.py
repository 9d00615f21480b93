"""Count what a codec call would launch on a GPU, on the CPU.

With the Triton kernels forced on (run by the interpreter) every torch op that computes
something is one device kernel, and so is every Triton launch. `count(fn, numel)` runs fn once
and returns, per call:
    launches   torch ops that compute (views, allocations and metadata ops excluded) plus
               Triton kernel launches
    passes     those among them that read or write a tensor of at least `numel` elements: a
               full pass over the message (or its decode)
    syncs      host reads of a device value (.item(), bool(tensor), nonzero ...)
    ops        {name: launches} for the report when a budget is exceeded
"""
from __future__ import annotations

import collections
import contextlib
from dataclasses import dataclass, field
from typing import Callable, Dict

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

# ops that allocate or describe memory without computing anything (no kernel on a GPU)
FREE = {"empty", "empty_strided", "new_empty", "new_empty_strided", "empty_like", "detach",
        "alias", "lift_fresh", "lift_fresh_copy", "sym_size", "sym_stride", "sym_numel",
        "sym_storage_offset", "is_same_size", "_has_compatible_shallow_copy_type",
        "record_stream", "set_", "resize_"}
SYNC = {"_local_scalar_dense", "nonzero", "is_nonzero", "equal", "allclose", "item",
        "masked_select", "unique_dim", "_unique2"}


@dataclass
class Count:
    launches: int = 0
    passes: int = 0
    syncs: int = 0
    ops: Dict[str, int] = field(default_factory=collections.Counter)


class _Mode(TorchDispatchMode):
    def __init__(self, numel: int, count: Count):
        super().__init__()
        self.numel, self.c, self.paused = numel, count, False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.paused:
            return out
        name = func.overloadpacket.__name__
        if name in SYNC:
            self.c.syncs += 1
        if func.is_view or name in FREE or name in SYNC:
            return out
        self.c.launches += 1
        self.c.ops[name] += 1
        if any(isinstance(t, torch.Tensor) and t.numel() >= self.numel
               for t in tree_leaves((args, kwargs, out))):
            self.c.passes += 1
        return out


@contextlib.contextmanager
def _triton_launches(mode: _Mode):
    """Count interpreted Triton launches; the interpreter's own torch calls are not kernels."""
    from triton.runtime import interpreter
    cls = interpreter.InterpretedFunction
    orig = cls.run

    def run(self, *args, grid, warmup, **kwargs):
        if warmup:
            return orig(self, *args, grid=grid, warmup=warmup, **kwargs)
        mode.paused = True
        try:
            return orig(self, *args, grid=grid, warmup=warmup, **kwargs)
        finally:
            mode.paused = False
            mode.c.launches += 1
            mode.c.ops[f"triton:{self.fn.__name__}"] += 1
            if any(isinstance(t, torch.Tensor) and t.numel() >= mode.numel
                   for t in list(args) + list(kwargs.values())):
                mode.c.passes += 1
    cls.run = run
    try:
        yield
    finally:
        cls.run = orig


def count(fn: Callable[[], object], numel: int) -> Count:
    c = Count()
    mode = _Mode(numel, c)
    with _triton_launches(mode), mode:
        fn()
    return c
