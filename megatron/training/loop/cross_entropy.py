"""The language-model loss at tp 1 on CUDA in two Triton launches (cross_entropy_kernels.py).

megatron-core's vocab_parallel_cross_entropy takes fp32 logits and keeps their softmax for the
backward: at GPT-2-small's shape (micro-batch 16 x 1024 tokens x 50304) that is a 3.3 GB fp32
copy of the logits and several passes over it. Here the forward reads the logits once in their
own dtype and keeps two fp32 numbers per token (max and log-sum-exp); the backward recomputes
the softmax from them. The result equals the eager loss up to the summation order of the
softmax.
"""
from __future__ import annotations

import torch


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, real):
        from megatron.training.loop import cross_entropy_kernels as k
        x = logits.reshape(-1, logits.shape[-1])
        if x.stride(-1) != 1:
            x = x.contiguous()
        flat = labels.reshape(-1).contiguous()
        loss, stats = k.forward(x, flat, real)
        ctx.save_for_backward(x, flat, stats)
        ctx.real, ctx.shape = real, logits.shape
        return loss.view(labels.shape)

    @staticmethod
    def backward(ctx, grad):
        from megatron.training.loop import cross_entropy_kernels as k
        x, flat, stats = ctx.saved_tensors
        dx = k.backward(x, flat, stats, grad.reshape(-1).float(), ctx.real)
        return dx.view(ctx.shape), None, None


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, real: int) -> torch.Tensor:
    """Per-token loss (labels' shape, fp32) of logits (..., V) over the first `real` columns
    (the rest, vocabulary padding, take no probability)."""
    if not 0 < real <= logits.shape[-1]:
        raise ValueError(f"real vocabulary {real} outside 1..{logits.shape[-1]}")
    return _CrossEntropy.apply(logits, labels, real)
