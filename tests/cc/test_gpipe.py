"""GPipe schedule: every forward before any backward, backwards in micro-batch order, and the
same messages as 1F1B (checked with a recording channel, no process group)."""
import pytest

from megatron.cc.gpipe import forward_backward_gpipe
from megatron.cc.schedule import forward_backward_1f1b


class Recorder:
    """Stands in for PipelineChannels and StageStep; logs every call in order."""

    def __init__(self):
        self.log = []

    # channels
    def recv_forward(self, msg):
        self.log.append(("recv_fwd", msg.microbatch))
        return f"x{msg.microbatch}"

    def send_forward(self, y, msg):
        self.log.append(("send_fwd", msg.microbatch))

    def recv_backward(self, msg):
        self.log.append(("recv_bwd", msg.microbatch))
        return "g"

    def send_backward(self, g, msg):
        self.log.append(("send_bwd", msg.microbatch))

    def send_forward_recv_backward(self, y, fmsg, bmsg):
        self.send_forward(y, fmsg)
        return self.recv_backward(bmsg)

    def send_backward_recv_forward(self, g, bmsg, fmsg):
        self.send_backward(g, bmsg)
        return self.recv_forward(fmsg)

    # step
    def sample_ids(self, mb):
        return mb

    def forward(self, x, mb):
        self.log.append(("fwd", mb))
        return f"y{mb}"

    def backward(self, x, y, g):
        self.log.append(("bwd", int(y[1:])))
        return "gx"


@pytest.mark.parametrize("M", [1, 3, 6])
def test_gpipe_runs_all_forwards_then_all_backwards(M):
    r = Recorder()
    forward_backward_gpipe(r, r, M, iteration=0)
    compute = [e for e in r.log if e[0] in ("fwd", "bwd")]
    assert compute == [("fwd", i) for i in range(M)] + [("bwd", i) for i in range(M)]


@pytest.mark.parametrize("M,stage,pp", [(4, 0, 2), (4, 1, 2), (6, 1, 4), (2, 0, 4)])
def test_gpipe_and_1f1b_send_and_compute_the_same_messages(M, stage, pp):
    g, f = Recorder(), Recorder()
    forward_backward_gpipe(g, g, M, iteration=0)
    forward_backward_1f1b(f, f, M, 0, stage, pp)
    for kind in ("send_fwd", "send_bwd", "bwd"):
        # the same micro-batches in the same order on each channel (only interleaving differs)
        assert [e for e in g.log if e[0] == kind] == [e for e in f.log if e[0] == kind]
