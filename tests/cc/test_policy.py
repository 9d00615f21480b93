"""Epilogue-only CB: both ends agree, and the compressed sends are exactly the critical ones.

The real 1F1B schedule is driven with recording channels for every stage. A backward send on
the critical path is one the schedule posts on its own (last steady-phase iteration and
cool-down); steady-state sends go out in one batch with the next forward receive.
The policy, evaluated from (stage, micro-batch, pp, M) alone, must select exactly those, and
each receiver must evaluate the same decision for the same message.
"""
import pytest

from megatron.cc.pipeline.policy import BackwardCompressionPolicy
from megatron.cc.pipeline.schedule import forward_backward


class _Msgs:
    def __init__(self):
        self.plain_sends, self.all_sends, self.recvs = [], [], []


class Done:
    def result(self):
        return None

    def wait_send(self):
        pass


class RecordingChannels:
    prev_fwd, prev_bwd, next_fwd, next_bwd = "prev_fwd", "prev_bwd", "next_fwd", "next_bwd"

    def __init__(self, rec: _Msgs):
        self.rec = rec

    def post(self, send, recv):
        if send is not None and send[0] == "prev_bwd":
            self.rec.all_sends.append(send[2].microbatch)
            if recv is None:   # a plain backward send
                self.rec.plain_sends.append(send[2].microbatch)
        if recv is not None and recv[0] == "next_bwd":
            self.rec.recvs.append(recv[1].microbatch)
        return Done()


class NullStep:
    def sample_ids(self, mb):
        return None

    def forward(self, x, mb):
        return None

    def backward(self, x, y, g):
        return None


class _Msg:
    def __init__(self, mb, it=5):
        self.microbatch, self.iteration = mb, it


@pytest.mark.parametrize("pp", [2, 3, 4])
@pytest.mark.parametrize("M", range(1, 9))
def test_epilogue_decision_matches_schedule_and_both_ends(pp, M):
    recs = [_Msgs() for _ in range(pp)]
    for stage in range(pp):
        forward_backward(NullStep(), RecordingChannels(recs[stage]), M, iteration=5,
                         pp_rank=stage, pp_size=pp)
    for sender in range(1, pp):
        policy = BackwardCompressionPolicy(sender, pp, M, epilogue_only=True)
        sends, recvs = recs[sender].all_sends, recs[sender - 1].recvs
        assert sends == list(range(M)) and recvs == list(range(M))  # in order, paired
        chosen = [mb for mb in sends if policy(_Msg(mb))]
        assert chosen == recs[sender].plain_sends, (sender, chosen)
        # the receiver builds its policy from the sender's stage, so the decisions coincide
        receiver_view = BackwardCompressionPolicy(sender, pp, M, epilogue_only=True)
        assert [receiver_view(_Msg(mb)) for mb in recvs] == [policy(_Msg(mb)) for mb in sends]
        assert chosen, "the last backward send is always on the critical path"


def test_warmup_iterations_are_uncompressed():
    policy = BackwardCompressionPolicy(1, 2, 4, warmup_iters=3)
    assert [policy(_Msg(0, it)) for it in range(5)] == [False, False, False, True, True]
