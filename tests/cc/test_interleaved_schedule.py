"""Interleaved 1F1B: the op order is Megatron's, and the real loop runs it without deadlock.

No process group: every rank's `_Loop` runs in a thread against in-memory links with gloo's
strictest behaviour (a send completes only once its receive is posted, a receive once its
send is), matched per (sender, receiver, tag) in posting order. A wait that can never
complete is reported as a deadlock instead of hanging. Each message carries the sender's
(virtual stage, micro-batch), so a mismatched pairing is caught too.
"""
import threading

import pytest

from megatron.cc.pipeline.policy import (BackwardCompressionPolicy, interleaved_backward,
                                interleaved_table, num_warmup_interleaved)
from megatron.cc.pipeline.schedule import (PAIRED, PREFETCH, SYNC, Schedule, forward_backward,
                                  interleaved_order)


# ------------------------------------------------------------------ the order

def test_order_pp2_vp2_m4_by_hand():
    # groups of pp = 2 micro-batches: (c0: 0 1) (c1: 0 1) (c0: 2 3) (c1: 2 3)
    F = lambda c, m: ("F", c, m)   # noqa: E731
    B = lambda c, m: ("B", c, m)   # noqa: E731
    rank0 = [F(0, 0), F(0, 1), F(1, 0), F(1, 1),                     # warm-up (2-0-1)2 + 2 = 4
             F(0, 2), B(1, 0), F(0, 3), B(1, 1), F(1, 2), B(0, 0), F(1, 3), B(0, 1),
             B(1, 2), B(1, 3), B(0, 2), B(0, 3)]                      # cool-down
    rank1 = [F(0, 0), F(0, 1),                                        # warm-up 2
             F(1, 0), B(1, 0), F(1, 1), B(1, 1), F(0, 2), B(0, 0), F(0, 3), B(0, 1),
             F(1, 2), B(1, 2), F(1, 3), B(1, 3), B(0, 2), B(0, 3)]
    for rank, want in ((0, rank0), (1, rank1)):
        got = [("F" if o.forward else "B", o.chunk, o.microbatch)
               for o in interleaved_order(4, rank, 2, 2)]
        assert got == want, (rank, got)


@pytest.mark.parametrize("pp,vp,M", [(2, 2, 4), (2, 3, 6), (4, 2, 8), (4, 2, 4), (3, 2, 9)])
def test_order_matches_megatron_core(pp, vp, M):
    """The table and warm-up of megatron-core's own helpers; its loop runs warm-up forwards
    k < W, then forward k + W and backward k in turn, then the remaining backwards."""
    from megatron.core.pipeline_parallel import schedules as mc

    class _Group:
        def __init__(self, rank):
            self.r = rank

        def size(self):
            return pp

        def rank(self):
            return self.r

    class _Comm:
        virtual_pipeline_model_parallel_size = vp

        def __init__(self, rank):
            self.pp_group = _Group(rank)

    table = mc.get_schedule_table(M, vp, pp)   # (micro-batch, chunk)
    assert interleaved_table(M, vp, pp) == [(c, m) for m, c in table]
    assert interleaved_backward(M, vp, pp) == [(vp - 1 - c, m) for m, c in table]
    for rank in range(pp):
        _, _, W, remaining = mc.get_pp_rank_microbatches(M, vp, pp, p2p_communicator=_Comm(rank))
        assert num_warmup_interleaved(rank, pp, vp, M) == W
        fwd = [(c, m) for m, c in table]
        bwd = [(vp - 1 - c, m) for m, c in table]
        want = [(True,) + fwd[k] for k in range(W)]
        for k in range(remaining):
            want += [(True,) + fwd[k + W], (False,) + bwd[k]]
        want += [(False,) + bwd[k] for k in range(remaining, M * vp)]
        got = [(o.forward, o.chunk, o.microbatch) for o in interleaved_order(M, rank, pp, vp)]
        assert got == want
        # every (chunk, micro-batch) once each way, its forward first
        seen = {}
        for i, (f, c, m) in enumerate(got):
            seen.setdefault((c, m), []).append((f, i))
        assert all(len(v) == 2 and v[0][0] and not v[1][0] for v in seen.values())
        assert len(seen) == M * vp


# ------------------------------------------------------------------ the loop, simulated

class Deadlock(Exception):
    pass


class Wire:
    """In-memory p2p with rendezvous semantics, shared by every rank's thread."""

    def __init__(self, n):
        self.cv = threading.Condition()
        self.sends, self.recvs = {}, {}   # (src, dst, tag) -> [box]
        self.order = {}                   # (src, dst) -> kinds in post order, per side
        self.running, self.failed = n, None
        self.waiting = {}                 # thread -> the box it waits on

    def post_send(self, src, dst, tag, payload, kind):
        with self.cv:
            key = (src, dst, tag)
            self.order.setdefault(("send", src, dst), []).append(kind)
            box = {"payload": payload, "matched": False}
            waiting = self.recvs.get(key, [])
            if waiting:
                r = waiting.pop(0)
                r["payload"], r["matched"], box["matched"] = payload, True, True
            else:
                self.sends.setdefault(key, []).append(box)
            self.cv.notify_all()
            return box

    def post_recv(self, src, dst, tag, kind):
        with self.cv:
            key = (src, dst, tag)
            self.order.setdefault(("recv", src, dst), []).append(kind)
            box = {"payload": None, "matched": False}
            waiting = self.sends.get(key, [])
            if waiting:
                s = waiting.pop(0)
                box["payload"], box["matched"], s["matched"] = s["payload"], True, True
            else:
                self.recvs.setdefault(key, []).append(box)
            self.cv.notify_all()
            return box

    def _stuck(self):
        return len(self.waiting) == self.running and \
            not any(b["matched"] for b in self.waiting.values())

    def wait(self, box):
        me = threading.get_ident()
        with self.cv:
            self.waiting[me] = box
            try:
                while not box["matched"]:
                    if self.failed:
                        raise Deadlock(self.failed)
                    if self._stuck():
                        self.failed = "every rank waits on a transfer that is never posted"
                        self.cv.notify_all()
                        raise Deadlock(self.failed)
                    self.cv.wait(timeout=10)
            finally:
                del self.waiting[me]

    def done(self):
        with self.cv:
            self.running -= 1
            if self.running and self._stuck():
                self.failed = "the other ranks wait on a finished rank"
            self.cv.notify_all()


class FakeLink:
    def __init__(self, channel, peer, tag, chunk):
        self.channel, self.peer, self.tag, self.chunk = channel, peer, tag, chunk


class Handle:
    def __init__(self, wire, send_box, recv_box):
        self.wire, self.send_box, self.recv_box = wire, send_box, recv_box

    def wait_send(self):
        if self.send_box is not None:
            self.wire.wait(self.send_box)

    def result(self):
        if self.recv_box is None:
            return None
        self.wire.wait(self.recv_box)
        return self.recv_box["payload"]


class FakeChannels:
    """One rank's links per chunk, as build_pipeline_channels makes them (tags at pp 2)."""

    def __init__(self, wire, rank, pp, vp, events=None):
        self.wire, self.rank, self.pp = wire, rank, pp
        self.events = events   # a list: receives posted and computes, in this rank's order
        tag = 1 if pp == 2 else 0
        self.chunks = []
        for c in range(vp):
            ch = type("Chunk", (), {})()
            first, last = rank == 0 and c == 0, rank == pp - 1 and c == vp - 1
            prev, nxt = (rank - 1) % pp, (rank + 1) % pp
            ch.prev_fwd = None if first else FakeLink("pp-fwd", prev, 0, c)
            ch.prev_bwd = None if first else FakeLink("pp-bwd", prev, tag, c)
            ch.next_fwd = None if last else FakeLink("pp-fwd", nxt, 0, c)
            ch.next_bwd = None if last else FakeLink("pp-bwd", nxt, tag, c)
            self.chunks.append(ch)
        if vp == 1:   # the loop uses a single chunk's links directly
            self.__dict__.update(vars(self.chunks[0]))

    def chunk(self, c):
        return self.chunks[c]

    def post(self, send, recv):
        s = r = None
        if recv is not None and self.events is not None:
            self.events.append(("recv", recv[0].channel, recv[1].microbatch))
        if send is not None:
            link, y, msg = send
            s = self.wire.post_send(self.rank, link.peer, link.tag,
                                    (link.channel, y, msg.microbatch), link.channel)
        if recv is not None:
            link, msg = recv
            r = self.wire.post_recv(link.peer, self.rank, link.tag, link.channel)
        return Handle(self.wire, s, r)


class Step:
    """Forward outputs name (virtual stage, micro-batch); inputs are checked against it."""

    def __init__(self, rank, pp, vp):
        self.rank, self.pp, self.vp, self.log = rank, pp, vp, []

    def sample_ids(self, mb):
        return None

    def forward(self, x, mb, chunk=0):
        v = chunk * self.pp + self.rank
        if v == 0:
            assert x is None
        else:
            assert x == ("pp-fwd", ("act", v - 1, mb), mb), (self.rank, chunk, mb, x)
        self.log.append(("F", chunk, mb))
        return ("act", v, mb)

    def backward(self, x, y, g):
        _, v, mb = y
        if v == self.pp * self.vp - 1:
            assert g is None
        else:
            assert g == ("pp-bwd", ("grad", v + 1, mb), mb), (v, mb, g)
        self.log.append(("B", v // self.pp, mb))
        return ("grad", v, mb)


def simulate(pp, vp, M, exchange, forward_only=False):
    wire = Wire(pp)
    steps = [Step(r, pp, vp) for r in range(pp)]
    errors = []

    def rank_main(r):
        try:
            forward_backward(steps[r], FakeChannels(wire, r, pp, vp, steps[r].log), M, 0, r,
                             pp,
                             Schedule(exchange, forward_only=forward_only, virtual_stages=vp))
        except BaseException as e:   # noqa: BLE001 - reported below
            errors.append((r, e))
            with wire.cv:
                wire.failed = wire.failed or f"rank {r}: {e!r}"
                wire.cv.notify_all()
        finally:
            wire.done()

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(pp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "simulation hung"
    assert not errors, errors
    return wire, steps


CASES = [(2, 2, 2), (2, 2, 4), (2, 2, 8), (2, 3, 4), (3, 2, 3), (3, 2, 6), (4, 2, 4),
         (4, 2, 8), (4, 3, 8), (4, 2, 12)]


@pytest.mark.parametrize("exchange", [SYNC, PAIRED, PREFETCH])
def test_loop_runs_interleaved_without_deadlock(exchange):
    for pp, vp, M in CASES:
        wire, steps = simulate(pp, vp, M, exchange)
        for s in steps:   # each (chunk, micro-batch) forward, then its backward
            assert sorted(e for e in s.log if e[0] != "recv") == sorted(
                [(k, c, m) for k in "FB" for c in range(vp) for m in range(M)])
        # NCCL has no tags: there, each pair must post its sends and receives of both kinds
        # in the same order. PAIRED (the NCCL mode) keeps that order; so does SYNC.
        if exchange != PREFETCH:
            for (side, src, dst), kinds in wire.order.items():
                if side == "send":
                    assert kinds == wire.order[("recv", src, dst)], (pp, vp, M, src, dst)


@pytest.mark.parametrize("exchange", [SYNC, PREFETCH])
def test_forward_only_interleaved(exchange):
    for pp, vp, M in [(2, 2, 4), (4, 2, 8)]:
        _, steps = simulate(pp, vp, M, exchange, forward_only=True)
        assert all(len([e for e in s.log if e[0] == "F"]) == M * vp for s in steps)


@pytest.mark.parametrize("pp,vp,M", [(2, 1, 8), (4, 1, 8), (2, 2, 8), (4, 2, 8)])
def test_prefetch_keeps_the_neighbours_lead_of_receives_posted(pp, vp, M):
    """PREFETCH keeps prefetch_depth receives of each kind posted beyond the one it computes
    on (the most sends a neighbour can post before it needs one back):
    one ahead lets the upstream rank's sends meet no receive, and on gloo such sends make
    the two directions take turns (docs/overlap_and_slow_links.md, "Prefetch depth")."""
    from megatron.cc.pipeline.schedule import prefetch_depth
    assert [prefetch_depth(p, 1, 8) for p in (2, 4)] == [2, 4]
    assert [prefetch_depth(2, 2, 8), prefetch_depth(4, 2, 8), prefetch_depth(4, 3, 8)] == \
        [5, 11, 15]
    depth = min(prefetch_depth(pp, vp, M), M * vp)
    _, steps = simulate(pp, vp, M, PREFETCH)
    last = steps[-1].log
    first = next(i for i, e in enumerate(last) if e[0] == "F")
    assert [e[1] for e in last[:first]].count("pp-fwd") == min(depth + 1, M * vp)
    for i, e in enumerate(last):   # at every forward: its own receive and depth more
        if e[0] == "F":
            done = sum(1 for x in last[:i] if x[0] == "F")
            posted = sum(1 for x in last[:i] if x[:2] == ("recv", "pp-fwd"))
            assert posted - done == min(depth + 1, M * vp - done), (i, posted, done)


def test_epilogue_rule_per_chunk_boundary():
    """The compressed backward sends are the sender's last steady backward and its cool-down,
    over its whole interleaved op list; both ends build the policy from the sender's
    (stage, chunk), so they agree."""
    class Msg:
        def __init__(self, mb):
            self.microbatch, self.iteration = mb, 1
    for pp, vp, M in [(2, 2, 4), (4, 2, 8), (3, 3, 6)]:
        for r in range(pp):
            ops = interleaved_order(M, r, pp, vp)
            bwd = [o for o in ops if not o.forward]
            last_steady = max(i for i, o in enumerate(bwd) if o.steady) \
                if any(o.steady for o in bwd) else -1
            for i, o in enumerate(bwd):
                if r == 0 and o.chunk == 0:
                    continue   # virtual stage 0 sends no gradient
                pol = BackwardCompressionPolicy(r, pp, M, epilogue_only=True,
                                                sender_chunk=o.chunk, vp=vp)
                assert pol(Msg(o.microbatch)) == (i >= last_steady), (pp, vp, M, r, o)
