"""AC-SGD delta step against a device-resident per-sample cache, read in place.

The cache holds one (S, H) fp32 row per sample; a message (S, B, H) finds sample b in row
slots[b]. `sub_cached` is the delta's first step, d = x - c, without gathering the rows first;
the quantise + pack and unpack + dequantise kernels (fixpoint.py, `slots=`) read and update the
same rows in place, so a delta step moves no cache row twice and launches no per-sample copies.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .dispatch import LAUNCH, cdiv
from .fixpoint import cache_args, offset3

SUB_BLOCK = 2048


@triton.jit
def _sub_cached_kernel(x_ptr, c_ptr, slot_ptr, d_ptr, N, D1, D2, CS0, CS1, CS2,
                       BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < N
    x = tl.load(x_ptr + i, mask=m, other=0.0).to(tl.float32)   # widening: exact
    c = tl.load(c_ptr + offset3(i, D1, D2, CS0, CS1, CS2, slot_ptr, True), mask=m, other=0.0)
    tl.store(d_ptr + i, x - c, mask=m)


def sub_cached(x: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """x.float() - cache[slots].transpose(0, 1), fp32 of x's shape (S, B, H): cache (rows, S, H)
    fp32, slots (B,) int64 on the device."""
    x = x.contiguous()
    d1, d2, cs, _, slots = cache_args(x.shape, cache, cache, slots)
    d = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    n = x.numel()
    if n:
        _sub_cached_kernel[(cdiv(n, SUB_BLOCK),)](x, cache, slots, d, n, d1, d2, *cs,
                                                  BLOCK=SUB_BLOCK, **LAUNCH)
    return d
