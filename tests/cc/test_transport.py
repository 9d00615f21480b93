"""megatron.cc.common.transport.P2PTransport without process groups: every batch posts its receives
before its sends (on gloo, send-first batches make two crossing messages take turns:
bench/bench_link_duplex.py), and each handle still belongs to its own transfer."""
import torch
import torch.distributed as dist

from megatron.cc.common import transport


class _Op:
    """torch's P2POp checks the process group; this keeps what the transport gives it."""

    def __init__(self, op, tensor, peer, group=None, tag=0):
        self.op, self.tensor, self.peer, self.group, self.tag = op, tensor, peer, group, tag


class _Req:
    def __init__(self, op):
        self.op = op

    def wait(self):
        if self.op.op is dist.irecv:   # the "transfer": a receive gets its peer's number
            self.op.tensor.fill_(self.op.peer)


def test_receives_are_posted_before_sends_and_handles_keep_their_transfer(monkeypatch):
    posted = []

    def batch(ops):
        posted.extend(ops)
        return [_Req(op) for op in ops]

    monkeypatch.setattr(transport.dist, "get_backend", lambda group=None: "gloo")
    monkeypatch.setattr(transport.dist, "batch_isend_irecv", batch)
    monkeypatch.setattr(transport.dist, "P2POp", _Op)
    t = transport.P2PTransport()
    sends = [(torch.ones(3), 1), (torch.ones(2), 2, 7)]
    recvs = [(torch.zeros(4), 3), (torch.zeros(5), 4, 9)]
    send_reqs, recv_reqs = t.post(sends, recvs)
    assert [op.op for op in posted] == [dist.irecv, dist.irecv, dist.isend, dist.isend]
    assert [(op.peer, op.tag) for op in posted] == [(3, 0), (4, 9), (1, 0), (2, 7)]
    assert [r.req.op.tensor is s[0] for r, s in zip(send_reqs, sends)] == [True, True]
    for r in recv_reqs:
        r.wait()
    assert [float(b[0].max()) for b in recvs] == [3.0, 4.0]   # each into its own buffer
