"""Scatter-gather pipeline sends (megatron.cc.pipeline.p2p.ScatterGather), in one process.

Each tp rank sends its (S/tp, B, H) slice; the codec and the byte counts see the slice; the
receiver decodes its slice and all-gathers. The transport is a stub that hands every receive
the slice the same-index sender sent, and the all-gather is emulated with the other ranks'
slices, so the library's send and receive paths run without process groups; the real
all-gather runs in every tp > 1 multi-process test (scatter-gather is the default there).
"""
import pytest
import torch

from megatron.cc.codecs import get_codec
from megatron.cc.pipeline.p2p import Link, Message, PipelineChannels, ScatterGather
from megatron.cc.common.stats import ChannelStats

S, B, H, TP = 8, 2, 16, 2


class Wire:
    """Stands in for P2PTransport: sends are kept, each receive gets the last sent payload."""

    def __init__(self):
        self.sent = []

    def post(self, sends, recvs):
        if sends:
            self.sent = [p.clone() for p, _ in sends]
        for (buf, _), p in zip(recvs, self.sent):
            buf.copy_(p)
        return [], []


class LocalGather(ScatterGather):
    """The all-gather, with the other tp ranks' slices taken from a full tensor."""

    def __init__(self, rank, full):
        super().__init__(group=None, rank=rank, size=TP)
        self.full = full

    def gather(self, part, shape):
        parts = list(self.full.chunk(self.size))
        parts[self.rank] = part
        return torch.cat(parts).reshape(shape)


def test_slices_are_the_sequence_blocks():
    sg = ScatterGather(None, 1, TP)
    x = torch.randn(S, B, H)
    assert sg.wire_shape((S, B, H)) == (S // TP, B, H)
    assert torch.equal(sg.scatter(x), x[S // TP:])
    assert sg.scatter(x).is_contiguous()   # Megatron v2.5's flat chunks: a view, no copy
    with pytest.raises(ValueError, match="not divisible"):
        sg.wire_shape((7, B, H))


@pytest.mark.parametrize("codec", [None, "fixpoint"])
def test_each_rank_sends_and_counts_its_slice(codec):
    x = torch.randn(S, B, H)
    for rank in range(TP):
        wire, stats = Wire(), ChannelStats()
        make = (lambda: get_codec("fixpoint", bits=4)) if codec else (lambda: None)
        send = PipelineChannels((S, B, H), torch.float32, stats, transport=wire,
                                next_fwd=Link("pp-fwd", 1, make()),
                                scatter_gather=LocalGather(rank, x))
        recv = PipelineChannels((S, B, H), torch.float32, ChannelStats(), transport=wire,
                                prev_fwd=Link("pp-fwd", 0, make()),
                                scatter_gather=LocalGather(rank, x))
        msg = Message(microbatch=0, iteration=0, sample_ids=torch.arange(B))
        send.send_forward(x, msg)
        out = recv.recv_forward(msg)
        part = x[rank * S // TP:(rank + 1) * S // TP]
        raw = part.numel() * 4
        sent = raw if codec is None else get_codec("fixpoint", bits=4).payload_nbytes(
            part.shape, torch.float32)
        assert stats.snapshot()["pp-fwd"] == {"sent": sent, "raw": raw, "messages": 1}
        assert out.shape == (S, B, H) and out.is_leaf and out.requires_grad
        if codec is None:
            assert torch.equal(out, x)   # slicing and gathering are exact
        else:
            fp = get_codec("fixpoint", bits=4)
            mine = fp.decode(fp.encode(part), part.shape, torch.float32)
            assert torch.equal(out[rank * S // TP:(rank + 1) * S // TP], mine)


def test_flag_spellings(tiny_corpus):
    from megatron.training.flags.arguments import ConfigError, parse_args
    from tests.conftest import tiny_gpt_argv

    def args(*extra, **kw):
        flags = {"tensor-model-parallel-size": 2, "pipeline-model-parallel-size": 2, **kw}
        return parse_args(tiny_gpt_argv(tiny_corpus, **flags) + list(extra), world_size=4)
    assert args().scatter_gather                                        # on by default
    assert args("--scatter-gather-tensors-in-pipeline").scatter_gather
    assert not args("--no-scatter-gather-tensors-in-pipeline").scatter_gather
    assert not args(**{"tensor-model-parallel-size": 1}).scatter_gather  # nothing to scatter
    with pytest.raises(ConfigError, match="--no-scatter-gather-tensors-in-pipeline"):
        args(**{"seq-length": 31})
    assert not args("--no-scatter-gather-tensors-in-pipeline",
                    **{"seq-length": 31}).scatter_gather
