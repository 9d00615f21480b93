"""GPipe schedule: every micro-batch's forward, then every backward (AC-SGD's --pp-mode gpipe).

Same `step` and `channels` contract as megatron.cc.schedule.forward_backward_1f1b, and the
backward passes run in the same micro-batch order (0..M-1) as 1F1B's, so gradients accumulate
in the same order and both schedules give the same losses and weights. GPipe holds all M
micro-batches' activations at once (1F1B at most pp); what it buys is a simpler message
pattern: stage s only ever waits on one neighbour per phase.
"""
from megatron.cc.p2p import PipelineChannels
from megatron.cc.schedule import forward_backward_1f1b


def forward_backward_gpipe(step, channels: PipelineChannels, num_microbatches: int,
                           iteration: int, forward_only: bool = False) -> None:
    # 1F1B whose warm-up is every micro-batch: its cool-down is GPipe's backward phase
    forward_backward_1f1b(step, channels, num_microbatches, iteration, pp_rank=0, pp_size=1,
                          forward_only=forward_only, warmup=num_microbatches)
