"""Pipeline schedules (no pipelining, and non-interleaved 1F1B) that know what codecs need.

Megatron-core's schedules hide the micro-batch index and phase of each send and create a
CUDA token counter; ours pass an explicit `Message(microbatch, iteration, sample_ids)` with
every send and receive, so the compression policy and the per-sample activation caches work
from facts both ends compute, not from call order.

A `StageStep` supplies the stage's computation:
    forward(input_tensor | None, microbatch) -> output tensor (last stage: the scalar loss,
        already divided by the number of micro-batches)
    backward(input_tensor, output_tensor, output_grad | None) -> input grad | None
    sample_ids(microbatch) -> (B,) int64
"""
from typing import List, Optional

import torch

from megatron.cc.p2p import Message, PipelineChannels
from megatron.cc.policy import num_warmup_microbatches


def run_backward(input_tensor, output_tensor, output_grad):
    """Backward through one stage; returns the gradient of its input (None on stage 0)."""
    if input_tensor is not None:
        input_tensor.retain_grad()
    torch.autograd.backward(output_tensor, grad_tensors=output_grad)
    return None if input_tensor is None else input_tensor.grad


def forward_backward_no_pipelining(step, num_microbatches: int, forward_only=False) -> None:
    for mb in range(num_microbatches):
        out = step.forward(None, mb)
        if not forward_only:
            step.backward(None, out, None)


def forward_backward_1f1b(step, channels: PipelineChannels, num_microbatches: int,
                          iteration: int, pp_rank: int, pp_size: int,
                          forward_only: bool = False, warmup: Optional[int] = None) -> None:
    """`warmup`: forwards before the first backward (default 1F1B's, pp - rank - 1, capped
    at M); M gives GPipe (every forward, then every backward, in micro-batch order)."""
    M = num_microbatches

    def msg(mb):
        return Message(microbatch=mb, iteration=iteration, sample_ids=step.sample_ids(mb),
                       train=not forward_only)

    if forward_only:
        warmup = M
    elif warmup is None:
        warmup = num_warmup_microbatches(pp_rank, pp_size, M)
    remaining = M - warmup
    inputs: List = []
    outputs: List = []

    for mb in range(warmup):
        x = channels.recv_forward(msg(mb))
        y = step.forward(x, mb)
        channels.send_forward(y, msg(mb))
        if not forward_only:
            inputs.append(x)
            outputs.append(y)

    fwd_mb, bwd_mb = warmup, 0
    x = channels.recv_forward(msg(fwd_mb)) if remaining > 0 else None
    for i in range(remaining):
        last = i == remaining - 1
        y = step.forward(x, fwd_mb)
        # Steady state: hand the activation on and, in the same batch, wait for the gradient
        # of the oldest in-flight micro-batch.
        g = channels.send_forward_recv_backward(y, msg(fwd_mb), msg(bwd_mb))
        inputs.append(x)
        outputs.append(y)
        fwd_mb += 1
        x0, y0 = inputs.pop(0), outputs.pop(0)
        gx = step.backward(x0, y0, g)
        if last:
            channels.send_backward(gx, msg(bwd_mb))
            x = None
        else:
            x = channels.send_backward_recv_forward(gx, msg(bwd_mb), msg(fwd_mb))
        bwd_mb += 1

    if forward_only:
        return
    for _ in range(warmup):  # cool-down: drain the in-flight micro-batches
        g = channels.recv_backward(msg(bwd_mb))
        x0, y0 = inputs.pop(0), outputs.pop(0)
        gx = step.backward(x0, y0, g)
        channels.send_backward(gx, msg(bwd_mb))
        bwd_mb += 1
