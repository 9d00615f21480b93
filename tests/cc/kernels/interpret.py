"""Import the kernel modules under Triton's interpreter, so that CPU tests execute them.

Triton decides at decoration time (`@triton.jit`, i.e. when a module is imported) whether a
function is compiled or interpreted, from TRITON_INTERPRET; that includes triton.language's own
jit'd helpers (tl.zeros, tl.sum, ...). In a test session triton is usually imported already
(torch._dynamo imports it), for compilation. `kernels()` then sets TRITON_INTERPRET=1 and
imports triton's Python modules (not its compiled extension) and the kernel modules afresh;
modules that imported triton before (torch's) keep the objects they hold.
"""
import importlib
import os
import sys

import pytest


# the modules that define Triton kernels
KERNEL_MODULES = ("megatron.cc.kernels.", "megatron.training.loop.cross_entropy_kernels")


def _fresh_modules() -> None:
    os.environ["TRITON_INTERPRET"] = "1"
    std = sys.modules.get("triton.language.standard")
    if std is None or type(std.zeros).__name__ == "InterpretedFunction":
        return
    for name, mod in list(sys.modules.items()):
        # the compiled extension (nanobind) cannot be initialised twice: keep it; and keep
        # the kernel package's triton-free modules (dispatch: fused.py holds it, and tests
        # monkeypatch the one it holds)
        if (name.split(".")[0] == "triton" and not name.startswith("triton._C")) or (
                name.startswith(KERNEL_MODULES) and hasattr(mod, "triton")):
            del sys.modules[name]
            # and from its package: `from package import name` would find the old one there
            parent, _, child = name.rpartition(".")
            if getattr(sys.modules.get(parent), child, None) is mod:
                delattr(sys.modules[parent], child)


def kernels(name: str):
    """megatron.cc.kernels.<name> (or the module a dotted name gives) with interpreted kernels;
    skips the tests without triton."""
    _fresh_modules()
    pytest.importorskip("triton")
    prims = importlib.import_module("megatron.cc.kernels.primitives")
    assert type(prims.round_half_even).__name__ == "InterpretedFunction", "not interpreted"
    return importlib.import_module(name if "." in name else f"megatron.cc.kernels.{name}")
