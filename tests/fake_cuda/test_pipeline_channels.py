"""The send path of the pipeline channels on a fake GPU: each end of a pp=2 stage boundary
as channels.build_pipeline_channels builds it from the flags (codecs attached by
pipeline_codecs), one forward and one backward message each way, encode + post + wait +
decode inside `gpu.strict()` (a host read or a blocking copy down raises), on gloo (CUDA
payloads staged through pinned host buffers: one stream sync per send, the transport's) and
on NCCL (no staging, no sync); then the codecs' state round trip of a resume onto the GPU.

The other end is emulated (fake_gpu.py): its sends are not received, so a receive buffer
keeps what it was allocated with; sizes, dtypes, devices and the calls are what is checked.
"""
import pytest
import torch

from megatron.cc.pipeline.p2p import Message
from megatron.cc.common.stats import ChannelStats
from tests.conftest import tiny_gpt_argv
from tests.fake_cuda.fake_gpu import real_copy

S, B, H = 16, 1, 32
FLAGS = {
    "uncompressed": {},
    "fixpoint": {"forward-compress-method": "fixpoint", "forward-bits": 8,
                 "backward-compress-method": "fixpoint", "backward-bits": 6},
    "delta": {"forward-compress-method": "delta", "forward-bits": 4,
              "max-activation-cache-size": 4},
    "delta-lowbits": {"forward-compress-method": "delta-lowbits", "forward-bits": 4,
                      "forward-bits-act": 8, "max-activation-cache-size": 4},
    "tah": {"forward-compress-method": "tah", "backward-compress-method": "fixpoint",
            "backward-bits": 6, "backward-tile-size": 16, "tile-size": 16},
    "cb-lep": {"inter-grad-comp": True, "inter-grad-comp-rank": 2, "use-error-feedback": True},
    # Subspace Networks: (S, B, k) coefficients, 4-bit and unquantised
    "subspace": {"forward-compress-method": "subspace", "subspace-rank": 4},
    "subspace-raw": {"forward-compress-method": "subspace", "subspace-rank": 4,
                     "subspace-bits": 0},
}


def _channels(stage, flags, corpus):
    """build_pipeline_channels as stage `stage` of a pp=2 job (global ranks 0 and 1) does."""
    from megatron.training.flags.arguments import parse_args
    from megatron.training.compression.channels import build_pipeline_channels
    from megatron.training.runtime.topology import Topology
    argv = tiny_gpt_argv(corpus, **{"num-layers": 2, "seq-length": S, "hidden-size": H,
                                   "micro-batch-size": B, "global-batch-size": 2,
                                   "pipeline-model-parallel-size": 2,
                                   "distributed-backend": "gloo", **flags})
    args = parse_args(argv, world_size=2)
    topo = Topology(rank=stage, world_size=2, tp_rank=0, tp_size=1, pp_rank=stage, pp_size=2,
                    is_first=stage == 0, is_last=stage == 1, prev_rank=1 - stage,
                    next_rank=1 - stage, dp_rank=0, dp_size=1, pp_ranks=(0, 1), dp_ranks=(stage,),
                    device=torch.device("cuda", torch.cuda.current_device()))
    config = type("Config", (), {"pipeline_dtype": torch.bfloat16})()
    return build_pipeline_channels(args, config, ChannelStats(), topo, epoch_samples=8)


def _exchange(gpu, first, last, iteration=0):
    """Stage 0 sends y and receives its gradient; stage 1 receives y and sends a gradient."""
    msg = Message(microbatch=0, iteration=iteration, sample_ids=torch.arange(B))
    shape = first.shape   # (S, B, H), or (S, B, k) subspace coefficients
    y = torch.randn(shape).to(gpu.device, torch.bfloat16)
    with gpu.strict():
        first.send_forward(y, msg)
        x = last.recv_forward(msg)
        last.send_backward(torch.randn(shape).to(gpu.device, torch.bfloat16), msg)
        g = first.recv_backward(msg)
    for t in (x, g):
        assert t.device == gpu.device and t.dtype == torch.bfloat16 and t.shape == shape


def assert_staging_syncs_only(gpu, start, backend):
    """gloo: the staging's one wait per batch with a send, nothing else; NCCL: none."""
    syncs = gpu.syncs(since=start)
    if backend == "gloo":
        assert syncs and all(e.kind == "sync" and "megatron/cc/common/transport.py" in e.where
                             for e in syncs)
    else:
        assert syncs == []


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
@pytest.mark.parametrize("codecs", list(FLAGS))
def test_pipeline_send_path(fake_gpu, tiny_corpus, codecs, backend):
    with fake_gpu(backend=backend) as gpu:
        first = _channels(0, FLAGS[codecs], tiny_corpus)
        last = _channels(1, FLAGS[codecs], tiny_corpus)
        start = len(gpu.events)
        _exchange(gpu, first, last)
        assert_staging_syncs_only(gpu, start, backend)
        p2p = {c for c, be, devs in gpu.dist.log[-8:]}
        assert p2p <= {"batch_isend_irecv(isend)", "batch_isend_irecv(irecv)"}
        with gpu.lenient():
            states = [real_copy(c.state_dict()) for c in (first, last)]
        first2 = _channels(0, FLAGS[codecs], tiny_corpus)
        last2 = _channels(1, FLAGS[codecs], tiny_corpus)
        first2.load_state_dict(states[0])
        last2.load_state_dict(states[1])
        _exchange(gpu, first2, last2, iteration=1)
