"""Triton kernels of the fused language-model cross entropy (loop/cross_entropy.py).

One program per token row streams the row's logits in blocks: the forward keeps a running max
and sum of exponentials in fp32 (the log-sum-exp in one read, no fp32 copy of the logits), the
backward writes (softmax - one-hot) x the row's upstream gradient in the logits' dtype. Columns
from `real` on (the padded vocabulary) count as -inf: no probability, zero gradient.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096   # logits per load: 8 KB of bf16 per program and step


@triton.jit
def _forward_kernel(x_ptr, labels_ptr, loss_ptr, max_ptr, logsum_ptr, stride, V, REAL,
                    BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * stride
    cols = tl.arange(0, BLOCK)
    m = tl.full((BLOCK,), -float("inf"), tl.float32)   # per-lane running max ...
    s = tl.zeros((BLOCK,), tl.float32)                  # ... and sum of exp(x - max)
    for start in range(0, V, BLOCK):
        c = start + cols
        x = tl.load(base + c, mask=c < REAL, other=-float("inf")).to(tl.float32)
        new = tl.maximum(m, x)
        safe = tl.where(new == -float("inf"), 0.0, new)   # a lane that has seen only -inf
        s = s * tl.exp(m - safe) + tl.exp(x - safe)
        m = new
    mx = tl.max(m, axis=0)
    total = tl.sum(s * tl.exp(tl.where(m == -float("inf"), mx, m) - mx), axis=0)
    logsum = tl.log(total)
    label = tl.load(labels_ptr + row)
    target = tl.load(base + label).to(tl.float32)
    # max and log-sum kept apart: x - max is exact where x - (max + logsum) would round
    # at the logits' magnitude
    tl.store(max_ptr + row, mx)
    tl.store(logsum_ptr + row, logsum)
    tl.store(loss_ptr + row, (mx - target) + logsum)


@triton.jit
def _backward_kernel(x_ptr, labels_ptr, max_ptr, logsum_ptr, g_ptr, dx_ptr, stride, dstride, V,
                     REAL, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mx = tl.load(max_ptr + row)
    logsum = tl.load(logsum_ptr + row)
    g = tl.load(g_ptr + row).to(tl.float32)
    label = tl.load(labels_ptr + row)
    for start in range(0, V, BLOCK):
        c = start + cols
        x = tl.load(x_ptr + row * stride + c, mask=c < REAL, other=-float("inf"))
        p = tl.exp((x.to(tl.float32) - mx) - logsum)
        d = g * (p - tl.where(c == label, 1.0, 0.0))
        tl.store(dx_ptr + row * dstride + c, d.to(dx_ptr.dtype.element_ty), mask=c < V)


def forward(x: torch.Tensor, labels: torch.Tensor, real: int):
    """(loss, stats), fp32, of the (N, V) logits x (unit column stride) and labels (N,):
    loss (N,) and stats (2, N), each row's max and log of its sum of exp(x - max)."""
    n, v = x.shape
    loss = torch.empty(n, dtype=torch.float32, device=x.device)
    stats = torch.empty((2, n), dtype=torch.float32, device=x.device)
    if n:
        _forward_kernel[(n,)](x, labels, loss, stats[0], stats[1], x.stride(0), v, real,
                              BLOCK=BLOCK)
    return loss, stats


def backward(x: torch.Tensor, labels: torch.Tensor, stats: torch.Tensor, g: torch.Tensor,
             real: int) -> torch.Tensor:
    """d loss / d x, x's dtype and shape (contiguous), for the upstream gradient g (N,)."""
    n, v = x.shape
    dx = torch.empty((n, v), dtype=x.dtype, device=x.device)
    if n:
        _backward_kernel[(n,)](x, labels, stats[0], stats[1], g.contiguous(), dx, x.stride(0),
                               dx.stride(0), v, real, BLOCK=BLOCK)
    return dx
