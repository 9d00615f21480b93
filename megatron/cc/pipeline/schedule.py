"""The pipeline schedule: one loop for 1F1B, GPipe, interleaved 1F1B and forward-only
evaluation, in three exchange modes (SYNC, PAIRED, PREFETCH: `Schedule`).

Every send and receive carries an explicit `Message(microbatch, iteration, sample_ids)`, so
the compression policy and the per-sample caches work from facts both ends compute. The modes
differ only in when batches are posted and waited; encode and decode run in the same order in
all of them, so codec state, byte counts and losses are SYNC's (docs/pipeline_compression.md).

A `StageStep` supplies the stage's computation:
    forward(input_tensor | None, microbatch[, chunk]) -> output tensor (last stage: the loss,
        already divided by the number of micro-batches)
    backward(input_tensor, output_tensor, output_grad | None) -> input grad | None
    sample_ids(microbatch) -> (B,) int64
"""
from dataclasses import dataclass
from typing import Dict, List, NamedTuple

import torch

from megatron.cc.pipeline.p2p import Message, PipelineChannels
from megatron.cc.pipeline.policy import (interleaved_backward, interleaved_table, num_warmup_interleaved,
                                num_warmup_microbatches)

SYNC, PAIRED, PREFETCH = "sync", "paired", "prefetch"


@dataclass(frozen=True)
class Schedule:
    """How one step runs: `exchange`, `gpipe` (warm-up M), `forward_only` (forwards alone,
    uncompressed: evaluation), `virtual_stages` (vp > 1: interleaved 1F1B).

    - SYNC waits for each batch before computing again; in the steady phase a send and the next
      receive (same neighbour) go out in one batch, so 1F1B cannot deadlock.
    - PAIRED (--overlap-p2p-comm on NCCL) posts SYNC's batches in SYNC's order and defers only the
      send waits to the end of the step: receives posted ahead in a different order on the two
      ends would deadlock on NCCL's per-pair stream.
    - PREFETCH (--overlap-p2p-comm on gloo) posts each send alone, waited at the end of the step,
      and keeps `prefetch_depth` receives of each kind posted ahead: a gloo send only moves once
      its receive is posted."""
    exchange: str = SYNC
    gpipe: bool = False
    forward_only: bool = False
    virtual_stages: int = 1


class Op(NamedTuple):
    """One compute step. `chunk` is the model chunk (0 until interleaved schedules add more);
    `steady`: in 1F1B's steady phase, where a send is paired with the next step's receive."""
    forward: bool
    microbatch: int
    steady: bool = False
    chunk: int = 0


def _order(M: int, warmup: int, forward_only: bool, fwd=None, bwd=None) -> List[Op]:
    """The compute order, and the one place a (chunk, micro-batch) is assigned to each step.

    `fwd[k]` / `bwd[k]`: (chunk, micro-batch) of the k-th forward / backward (None: chunk 0,
    micro-batch k); M is then the number of ops of each kind."""
    def op(forward: bool, k: int, steady: bool = False) -> Op:
        table = fwd if forward else bwd
        chunk, mb = (0, k) if table is None else table[k]
        return Op(forward, mb, steady, chunk)
    if forward_only:
        return [op(True, k) for k in range(M)]
    steady = [op(f, warmup + i if f else i, True) for i in range(M - warmup) for f in (True, False)]
    return ([op(True, k) for k in range(warmup)] + steady
            + [op(False, k) for k in range(M - warmup, M)])


def interleaved_order(M: int, pp_rank: int, pp_size: int, vp: int,
                      forward_only: bool = False) -> List[Op]:
    """Megatron's interleaved 1F1B op list of one rank; chunk c on pp rank r is virtual stage
    c pp + r, and every op names its chunk.

    SYNC and PAIRED post every send in one batch with the next op's receive, and interleaved SYNC
    keeps one send in flight (waited when the next is posted): with the wrap-around link a lone
    send on gloo could wait forever. Epilogue-only CB is decided over the rank's whole op list
    (policy.is_critical_interleaved_send). See docs/pipeline_compression.md."""
    total = M * vp
    warmup = total if forward_only else num_warmup_interleaved(pp_rank, pp_size, vp, M)
    return _order(total, warmup, forward_only, interleaved_table(M, vp, pp_size),
                  interleaved_backward(M, vp, pp_size))


def run_backward(input_tensor, output_tensor, output_grad):
    """Backward through one stage; returns the gradient of its input (None on stage 0)."""
    if input_tensor is not None:
        input_tensor.retain_grad()
    torch.autograd.backward(output_tensor, grad_tensors=output_grad)
    return None if input_tensor is None else input_tensor.grad


def prefetch_depth(pp_size: int, vp: int, num_microbatches: int) -> int:
    """Receives of one kind PREFETCH keeps posted: the first rank's warm-up plus one, the most sends
    a neighbour can post before it needs a message back (docs/overlap_and_slow_links.md)."""
    if vp > 1:
        return num_warmup_interleaved(0, pp_size, vp, num_microbatches) + 1
    return num_warmup_microbatches(0, pp_size, num_microbatches) + 1


def forward_backward(step, channels: PipelineChannels, num_microbatches: int, iteration: int,
                     pp_rank: int, pp_size: int, schedule: Schedule = Schedule()) -> None:
    M = num_microbatches
    depth = prefetch_depth(pp_size, schedule.virtual_stages, M)
    if schedule.virtual_stages > 1:
        ops = interleaved_order(M, pp_rank, pp_size, schedule.virtual_stages,
                                schedule.forward_only)
        return _Loop(step, channels, iteration, schedule, depth).run(ops)
    gpipe = schedule.gpipe and pp_size > 1   # one stage: nothing to pipeline
    warmup = M if gpipe or schedule.forward_only else num_warmup_microbatches(pp_rank, pp_size, M)
    _Loop(step, channels, iteration, schedule, depth).run(
        _order(M, warmup, schedule.forward_only))


class _Loop:
    def __init__(self, step, channels: PipelineChannels, iteration: int, schedule: Schedule,
                 depth: int):
        self.step, self.ch, self.iteration = step, channels, iteration
        self.depth = depth   # PREFETCH: receives of each kind kept posted (prefetch_depth)
        self.exchange, self.train = schedule.exchange, not schedule.forward_only
        self.vp = schedule.virtual_stages
        self.saved: Dict = {}     # (chunk, micro-batch) -> (input, output), kept for backward
        self.sends: List = []     # posted sends whose wait is deferred to the end of the step
        self.recvs: Dict = {}     # step index -> its posted receive (None: nothing to receive)
        self.last = None          # interleaved SYNC: the send in flight, waited at the next

    def run(self, ops: List[Op]) -> None:
        prefetch = self.exchange == PREFETCH
        if prefetch:   # the first receive of each kind, before any compute
            for fwd in (True, False):
                for _ in range(self.depth):
                    self._prefetch(ops, -1, fwd)
        for i, op in enumerate(ops):
            h = self.recvs.pop(i) if i in self.recvs else self._post(None, self._recv(op))
            got = None if h is None else h.result()   # activation, or gradient of the output
            if prefetch and op.forward:
                self._prefetch(ops, i, True)   # crosses the link while we compute this one
            y = self._compute(op, got)
            ch = self._links(op)
            link = ch.next_fwd if op.forward else ch.prev_bwd
            send = None if link is None else (link, y, self._msg(op))
            nxt = ops[i + 1] if i + 1 < len(ops) else None
            # interleaved: every send goes with the next receive (see interleaved_order)
            paired = op.steady and nxt is not None and nxt.steady or self.vp > 1
            if not prefetch and nxt is not None and paired:
                self.recvs[i + 1] = self._post(send, self._recv(nxt))
            else:
                self._post(send, None)
            if prefetch and not op.forward:   # once this gradient is out, the next one's
                self._prefetch(ops, i, False)
        for h in self.sends + [self.last]:
            if h is not None:
                h.wait_send()

    def _links(self, op: Op):
        """The links of the op's chunk (vp = 1: the channels themselves)."""
        return self.ch.chunk(op.chunk) if self.vp > 1 else self.ch

    def _compute(self, op: Op, got):
        if op.forward:
            chunk = (op.chunk,) if self.vp > 1 else ()
            y = self.step.forward(got, op.microbatch, *chunk)
            if self.train:
                self.saved[op.chunk, op.microbatch] = (got, y)
            return y
        x, y = self.saved.pop((op.chunk, op.microbatch))
        return self.step.backward(x, y, got)

    def _msg(self, op: Op) -> Message:
        return Message(microbatch=op.microbatch, iteration=self.iteration,
                       sample_ids=self.step.sample_ids(op.microbatch), train=self.train)

    def _recv(self, op: Op):
        ch = self._links(op)
        link = ch.prev_fwd if op.forward else ch.next_bwd
        return None if link is None else (link, self._msg(op))

    def _prefetch(self, ops: List[Op], i: int, forward: bool) -> None:
        """Post the receive of the first step after `i` of the same kind not yet posted."""
        j = next((j for j in range(i + 1, len(ops))
                  if ops[j].forward == forward and j not in self.recvs), None)
        if j is not None:
            self.recvs[j] = self._post(None, self._recv(ops[j]))

    def _post(self, send, recv):
        """Post one batch; SYNC waits for its send now, the others at the end of the step."""
        if send is None and recv is None:
            return None
        h = self.ch.post(send, recv)
        if self.exchange == SYNC and self.vp > 1:
            if self.last is not None:
                self.last.wait_send()
            self.last = h if send is not None else self.last
        elif self.exchange == SYNC:
            h.wait_send()
        elif send is not None:
            self.sends.append(h)
        return h
