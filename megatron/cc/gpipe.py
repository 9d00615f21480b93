"""GPipe schedule: every micro-batch's forward, then every backward (AC-SGD's --pp-mode gpipe).

Same `step` and `channels` contract as megatron.cc.schedule.forward_backward_1f1b, and the
backward passes run in the same micro-batch order (0..M-1) as 1F1B's, so gradients accumulate
in the same order and both schedules give the same losses and weights. GPipe holds all M
micro-batches' activations at once (1F1B at most pp); what it buys is a simpler message
pattern: stage s only ever waits on one neighbour per phase.
"""
from megatron.cc.p2p import Message, PipelineChannels


def forward_backward_gpipe(step, channels: PipelineChannels, num_microbatches: int,
                           iteration: int, forward_only: bool = False) -> None:
    def msg(mb):
        return Message(microbatch=mb, iteration=iteration, sample_ids=step.sample_ids(mb),
                       train=not forward_only)

    inputs, outputs = [], []
    for mb in range(num_microbatches):
        x = channels.recv_forward(msg(mb))
        y = step.forward(x, mb)
        channels.send_forward(y, msg(mb))
        if not forward_only:
            inputs.append(x)
            outputs.append(y)
    if forward_only:
        return
    for mb in range(num_microbatches):
        g = channels.recv_backward(msg(mb))
        gx = step.backward(inputs[mb], outputs[mb], g)
        inputs[mb] = outputs[mb] = None      # free this micro-batch's graph
        channels.send_backward(gx, msg(mb))
