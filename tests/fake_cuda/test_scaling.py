"""Megatron's scaling features on a fake GPU: interleaved 1F1B's chunk links and sequence
parallelism's tensor-parallel sums, inside `gpu.strict()` (a host read or a blocking copy down
raises), on gloo and on NCCL.

- Interleaved (pp 2, 2 chunks): each rank's InterleavedChannels as build_pipeline_channels
  builds it from the flags; every virtual-stage boundary (0|1 within the pair, 1|2 over the
  wrap-around link, 2|3) carries a forward and a backward message through the chunk's own
  codecs, then the per-chunk codec state round-trips onto the GPU.
- Sequence parallelism: the tp channel's reduce-scatter of a row-parallel output, its
  backward all-gather and the norms' gradient sum, exact and with --mp-acti-comp's PowerSGD,
  over a FakeGroup of 2 whose peer mirrors this rank (values prove nothing here; the CPU tests
  tests/training/test_sequence_parallel.py check them).
"""
import pytest
import torch

from megatron.cc.pipeline.p2p import Message
from megatron.cc.common.stats import ChannelStats
from tests.fake_cuda.fake_gpu import FakeGroup, real_copy
from tests.fake_cuda.test_pipeline_channels import (B, FLAGS, H, S, _channels,
                                                    assert_staging_syncs_only)


def _interleaved(stage, flags, corpus):
    """build_pipeline_channels as pp rank `stage` of a pp=2 job with 2 model chunks does."""
    return _channels(stage, {"num-layers": 4, "virtual-pipeline-model-parallel-size": 2,
                             **flags}, corpus)


# (sender rank, sender chunk) -> (receiver rank, receiver chunk): virtual stage c pp + r
BOUNDARIES = [((0, 0), (1, 0)), ((1, 0), (0, 1)), ((0, 1), (1, 1))]


def _exchange_chunks(gpu, ranks, iteration=0):
    for (sr, sc), (rr, rc) in BOUNDARIES:
        msg = Message(microbatch=0, iteration=iteration, sample_ids=torch.arange(B))
        sender, receiver = ranks[sr].chunk(sc), ranks[rr].chunk(rc)
        with gpu.strict():
            sender.send_forward(torch.randn(S, B, H).to(gpu.device, torch.bfloat16), msg)
            x = receiver.recv_forward(msg)
            receiver.send_backward(torch.randn(S, B, H).to(gpu.device, torch.bfloat16), msg)
            g = sender.recv_backward(msg)
        for t in (x, g):
            assert t.device == gpu.device and t.dtype == torch.bfloat16 and t.shape == (S, B, H)


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
@pytest.mark.parametrize("codecs", ["uncompressed", "fixpoint", "delta", "cb-lep"])
def test_interleaved_chunk_links(fake_gpu, tiny_corpus, codecs, backend):
    with fake_gpu(backend=backend) as gpu:
        ranks = [_interleaved(r, FLAGS[codecs], tiny_corpus) for r in (0, 1)]
        start = len(gpu.events)
        _exchange_chunks(gpu, ranks)
        assert_staging_syncs_only(gpu, start, backend)
        with gpu.lenient():
            states = [real_copy(r.state_dict()) for r in ranks]
        again = [_interleaved(r, FLAGS[codecs], tiny_corpus) for r in (0, 1)]
        for r, sd in zip(again, states):
            r.load_state_dict(sd)
        _exchange_chunks(gpu, again, iteration=1)


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
@pytest.mark.parametrize("compressed", [False, True], ids=["exact", "mp-acti-comp"])
def test_sequence_parallel_tp_sums(fake_gpu, backend, compressed):
    from megatron.cc.tensor_parallel.tp_reduce import LowRankSum, TensorParallelReduce
    with fake_gpu(backend=backend) as gpu:
        stats = ChannelStats()
        reduce = TensorParallelReduce(FakeGroup(2, 0, backend), stats,
                                      forward=LowRankSum(rank=2) if compressed else None)
        partial = torch.randn(S, B, H).to(gpu.device)
        norm_grads = [torch.randn(H).to(gpu.device) for _ in range(2)]
        with gpu.strict():
            block = reduce.forward_scatter(partial, "layer0.linear_proj")
            whole = reduce.backward_gather(block)
            reduce.sum_grads(norm_grads)
        assert block.device == gpu.device and block.shape == (S // 2, B, H)
        assert whole.device == gpu.device and whole.shape == (S, B, H)
        assert all(g.device == gpu.device for g in norm_grads)
        assert all(q.device == gpu.device for q in reduce.qs.values())
        assert gpu.syncs(since=0, kind="read") == []
        # a reduce-scatter and an all-gather of S B H fp32 (half an all-reduce each), the grads
        assert stats.raw["tp"] == 2 * (S * B * H * 4 // 2) + 2 * H * 4
        assert stats.messages["tp"] == 3
