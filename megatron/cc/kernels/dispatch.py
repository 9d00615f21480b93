"""When the Triton kernels run instead of the eager torch code (no triton import here).

CUDA tensors with triton importable use the kernels, unless MEGATRON_CC_FUSED=0 (debugging, or
to time the eager path). CPU tensors take the eager path; tests run the kernels on CPU tensors
under Triton's interpreter by calling them directly (tests/cc/kernels/interpret.py).
"""
from __future__ import annotations

import functools
import importlib.util
import os

import torch


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """triton importable (GPU builds of torch bring it; a CPU install may lack it)."""
    return importlib.util.find_spec("triton") is not None


def enabled(*tensors: torch.Tensor) -> bool:
    """Run the kernels for these tensors: all on CUDA, triton there, MEGATRON_CC_FUSED != 0."""
    return (all(t.is_cuda for t in tensors) and available()
            and os.environ.get("MEGATRON_CC_FUSED", "1") != "0")


# the dtypes the kernels write a decoded message in, as their OUT constexpr (primitives.store_as)
OUT_KIND = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}

# Every launch: no fused multiply-add contraction. The eager reference rounds x - k*step and
# prev + deq after each operation; an FMA would round once and change the last bit.
LAUNCH = {"enable_fp_fusion": False}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def read_width(bits: int) -> int:
    """Bytes primitives.read_bits loads per value of `bits` bits (its NB)."""
    return next_pow2(cdiv(bits + 7, 8))
