"""Overlapped non-interleaved 1F1B (--overlap-p2p-comm): sends never wait, receives post early.

The synchronous schedule (schedule.py) posts each batch of isend/irecv and waits for all of
it before computing again, so every message crosses the link while both stages idle. Here:

- sends are posted and waited for only at the end of the step (the payload tensors stay
  referenced until then: memory for at most M messages per link, about what 1F1B keeps alive
  for backward anyway);
- each receive is posted one micro-batch ahead, before the compute that precedes its use
  (`prefetch=True`): on gloo a send only starts moving once its receive is posted, so this is
  what lets activation i+1 cross the link while stage s+1 computes micro-batch i;
- encode happens where the synchronous schedule encodes (at the send), decode where it
  decodes (when the tensor is first needed), in the same micro-batch order on every link:
  codec state, policy decisions and byte counts are those of the synchronous path, so the
  losses are identical (tests/cc/test_overlap.py).

`prefetch=False` keeps the synchronous path's batches (send+recv pairs) in the same order and
only defers the send waits, Megatron's overlap_p2p_comm pattern. NCCL needs that: torch runs
the sends and receives between two ranks on one stream, where receives posted ahead in a
different order on the two ends would deadlock.
"""
from typing import List

from megatron.cc.p2p import Message, PipelineChannels
from megatron.cc.policy import num_warmup_microbatches


def forward_backward_1f1b_overlap(step, channels: PipelineChannels, num_microbatches: int,
                                  iteration: int, pp_rank: int, pp_size: int,
                                  forward_only: bool = False, prefetch: bool = True) -> None:
    M = num_microbatches
    warmup = num_warmup_microbatches(pp_rank, pp_size, M) if not forward_only else M
    sends: List = []   # posted sends, waited for at the end of the step

    def msg(mb):
        return Message(microbatch=mb, iteration=iteration, sample_ids=step.sample_ids(mb),
                       train=not forward_only)

    run = _Prefetching if prefetch else _Paired
    run(step, channels, msg, M, sends, forward_only).run(warmup)
    for s in sends:
        s.wait_send()


class _Schedule:
    def __init__(self, step, channels, msg, M, sends, forward_only):
        self.step, self.ch, self.msg, self.M = step, channels, msg, M
        self.sends, self.forward_only = sends, forward_only
        self.inputs: List = []
        self.outputs: List = []

    def forward(self, x, mb):
        y = self.step.forward(x, mb)
        if not self.forward_only:
            self.inputs.append(x)
            self.outputs.append(y)
        return y

    def backward(self, g):
        return self.step.backward(self.inputs.pop(0), self.outputs.pop(0), g)

    def post(self, send=None, recv=None):
        """Post one batch; keep the handle of its send part for the end of the step."""
        h = self.ch.post(send, recv)
        if send is not None:
            self.sends.append(h)
        return h


class _Prefetching(_Schedule):
    """Every receive posted one micro-batch before it is needed; every send on its own."""

    def recv_fwd(self, mb):
        if self.ch.prev_fwd is None or mb >= self.M:
            return None
        return self.ch.post(None, (self.ch.prev_fwd, self.msg(mb)))

    def recv_bwd(self, mb):
        if self.ch.next_bwd is None or mb >= self.M or self.forward_only:
            return None
        return self.ch.post(None, (self.ch.next_bwd, self.msg(mb)))

    def run(self, warmup):
        ch, M = self.ch, self.M
        rx, rg = self.recv_fwd(0), self.recv_bwd(0)
        bwd_mb = 0
        for mb in range(M):
            x = rx.result() if rx is not None else None
            rx = self.recv_fwd(mb + 1)            # crosses the link while we compute mb
            y = self.forward(x, mb)
            if ch.next_fwd is not None:
                self.post((ch.next_fwd, y, self.msg(mb)))
            if self.forward_only or mb < warmup:
                continue
            bwd_mb = self._backward(bwd_mb, rg)   # 1F1B steady state: one backward per forward
            rg = self.recv_bwd(bwd_mb)
        for _ in range(warmup if not self.forward_only else 0):   # cool-down
            bwd_mb = self._backward(bwd_mb, rg)
            rg = self.recv_bwd(bwd_mb)

    def _backward(self, bwd_mb, rg):
        g = rg.result() if rg is not None else None
        gx = self.backward(g)
        if self.ch.prev_bwd is not None:
            self.post((self.ch.prev_bwd, gx, self.msg(bwd_mb)))
        return bwd_mb + 1


class _Paired(_Schedule):
    """The synchronous schedule's batches, in its order; only the send waits are deferred."""

    def run(self, warmup):
        ch, M, msg = self.ch, self.M, self.msg
        remaining = M - warmup

        def recv(link, mb):
            return None if link is None else self.post(None, (link, msg(mb))).result()

        for mb in range(warmup):
            y = self.forward(recv(ch.prev_fwd, mb), mb)
            if ch.next_fwd is not None:
                self.post((ch.next_fwd, y, msg(mb)))
        fwd_mb, bwd_mb = warmup, 0
        x = recv(ch.prev_fwd, fwd_mb) if remaining > 0 else None
        for i in range(remaining):
            y = self.forward(x, fwd_mb)
            g = None
            if ch.next_fwd is not None:
                g = self.post((ch.next_fwd, y, msg(fwd_mb)), (ch.next_bwd, msg(bwd_mb))).result()
            fwd_mb += 1
            gx = self.backward(g)
            x = None
            if ch.prev_bwd is not None:
                last = i == remaining - 1
                h = self.post((ch.prev_bwd, gx, msg(bwd_mb)),
                              None if last else (ch.prev_fwd, msg(fwd_mb)))
                x = None if last else h.result()
            bwd_mb += 1
        if self.forward_only:
            return
        for _ in range(warmup):
            gx = self.backward(recv(ch.next_bwd, bwd_mb))
            if ch.prev_bwd is not None:
                self.post((ch.prev_bwd, gx, msg(bwd_mb)))
            bwd_mb += 1
