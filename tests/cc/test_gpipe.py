"""GPipe schedule: every forward before any backward, backwards in micro-batch order, and the
same messages as 1F1B (checked with a recording channel, no process group)."""
import pytest

from megatron.cc.pipeline.schedule import Schedule, forward_backward

GPIPE = Schedule(gpipe=True)


class Done:
    """A posted batch that has already completed."""

    def __init__(self, value=None):
        self.value = value

    def result(self):
        return self.value

    def wait_send(self):
        pass


class Recorder:
    """Stands in for PipelineChannels and StageStep; logs every call in order."""

    def __init__(self):
        self.log = []

    # channels: every link present, so every message the schedule posts is logged
    prev_fwd, prev_bwd, next_fwd, next_bwd = "prev_fwd", "prev_bwd", "next_fwd", "next_bwd"

    def post(self, send, recv):
        if send is not None:
            link, y, msg = send
            self.log.append(("send_fwd" if link == "next_fwd" else "send_bwd", msg.microbatch))
        if recv is None:
            return Done()
        link, msg = recv
        fwd = link == "prev_fwd"
        self.log.append(("recv_fwd" if fwd else "recv_bwd", msg.microbatch))
        return Done(f"x{msg.microbatch}" if fwd else "g")

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
    forward_backward(r, r, M, 0, 0, 2, GPIPE)
    compute = [e for e in r.log if e[0] in ("fwd", "bwd")]
    assert compute == [("fwd", i) for i in range(M)] + [("bwd", i) for i in range(M)]


@pytest.mark.parametrize("M,stage,pp", [(4, 0, 2), (4, 1, 2), (6, 1, 4), (2, 0, 4)])
def test_gpipe_and_1f1b_send_and_compute_the_same_messages(M, stage, pp):
    g, f = Recorder(), Recorder()
    forward_backward(g, g, M, 0, stage, pp, GPIPE)
    forward_backward(f, f, M, 0, stage, pp)
    for kind in ("send_fwd", "send_bwd", "bwd"):
        # the same micro-batches in the same order on each channel (only interleaving differs)
        assert [e for e in g.log if e[0] == kind] == [e for e in f.log if e[0] == kind]
