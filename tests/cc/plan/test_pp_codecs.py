"""Pipeline channels: the cost model's bytes per message equal the payload the driver's own codec
(built by megatron/training's builders from the same flags) puts on the wire when it encodes a
real activation, for every pipeline codec; and the per-iteration totals count every message."""
import pytest
import torch

from megatron.cc.codecs import CodecContext
from megatron.cc.plan.channel_bytes import channel_bytes
from megatron.cc.plan.shapes import Layout, ModelShape
from megatron.cc.pipeline.registry import LinkEnd, pp_codec
from megatron.cc.common.stats import nbytes
from megatron.training.flags.arguments import parse_args

S, B, H = 16, 2, 64
BASE = ["--num-layers", "4", "--hidden-size", str(H), "--num-attention-heads", "4",
        "--seq-length", str(S), "--micro-batch-size", str(B), "--global-batch-size", "8",
        "--pipeline-model-parallel-size", "2", "--train-iters", "10"]

FWD = {   # name: flags (forward codecs)
    "fixpoint-2": ["--forward-compress-method", "fixpoint", "--forward-bits", "2"],
    "fixpoint-4": ["--forward-compress-method", "fixpoint", "--forward-bits", "4"],
    "fixpoint-8": ["--forward-compress-method", "fixpoint", "--forward-bits", "8"],
    "delta-4": ["--forward-compress-method", "delta", "--forward-bits", "4"],
    "delta-lowbits-3/8": ["--forward-compress-method", "delta-lowbits", "--forward-bits", "3"],
    "tah-4/3/0.8": ["--forward-compress-method", "tah"],
    "tah-8/2/0.5-tile16": ["--forward-compress-method", "tah", "--high-precision-bits", "8",
                           "--low-precision-bits", "2", "--high-precision-allocation-ratio",
                           "0.5", "--tile-size", "16"],
}
BWD = {   # name: flags (backward codecs)
    "fixpoint-8": ["--backward-compress-method", "fixpoint"],
    "fixpoint-4-tile32": ["--backward-compress-method", "fixpoint", "--backward-bits", "4",
                          "--backward-tile-size", "32"],
    "CB lowrank r4": ["--inter-grad-comp", "--inter-grad-comp-rank", "4"],
    "CB lowrank r8 fp16": ["--backward-compress-method", "lowrank", "--backward-rank", "8",
                           "--inter-grad-comp-dtype", "float16"],
    "CB rsvd r4": ["--inter-grad-comp", "--inter-grad-comp-rank", "4",
                   "--inter-grad-comp-type", "RandomizedSVD"],
    "CB full rank": ["--inter-grad-comp", "--inter-grad-comp-rank", "64"],
}


def _setup(flags):
    args = parse_args(BASE + flags, world_size=2)
    shape = ModelShape.from_args(args.model, vocab_size=1000)
    layout = Layout(args.tp, args.pp, args.dp, B, args.num_microbatches, torch.float32, 10)
    return args, shape, layout


def _encoded_bytes(codec, seed=0):
    x = torch.randn(S, B, H, generator=torch.Generator().manual_seed(seed))
    ctx = CodecContext(microbatch=0, iteration=5, sample_ids=torch.arange(B))
    return nbytes(codec.encode(x, ctx))


@pytest.mark.parametrize("name", sorted(FWD))
def test_forward_bytes_equal_the_encoded_payload(name):
    from megatron.training.compression.pipeline_codecs import forward_codec
    args, shape, layout = _setup(FWD[name])
    codec = forward_codec(args, capacity=B, seed=1, ram_limit=None)   # the driver's codec
    t = channel_bytes(shape, layout, args.compression)["pp-fwd"]
    assert t["messages"] == layout.num_microbatches   # pp - 1 = 1 sender, tp = dp = 1
    assert t["sent"] == t["messages"] * _encoded_bytes(codec)
    assert t["raw"] == t["messages"] * S * B * H * 4
    assert t["sent"] < t["raw"]


@pytest.mark.parametrize("name", sorted(BWD))
def test_backward_bytes_equal_the_encoded_payload(name):
    args, shape, layout = _setup(BWD[name])
    c = args.compression
    codec = pp_codec(c, "pp-bwd", LinkEnd("pp-bwd", seed=1, comp_seed=1))   # the driver's
    t = channel_bytes(shape, layout, c)["pp-bwd"]
    assert t["sent"] == t["messages"] * _encoded_bytes(codec)
    assert t["raw"] == t["messages"] * S * B * H * 4


def test_warmups_and_epilogue_only_decide_per_message():
    """Iterations before --compress-warmup-iters / the CB warm-up send raw; epilogue-only CB
    compresses only the critical-path sends (megatron.cc.pipeline.policy), here pp=2, M=4: the last."""
    args, shape, layout = _setup(FWD["fixpoint-4"] + ["--inter-grad-comp",
                                                       "--inter-grad-comp-epilogue-only",
                                                       "--inter-grad-comp-warm-up", "0.3",
                                                       "--compress-warmup-iters", "2"])
    c = args.compression
    early = channel_bytes(shape, layout, c, iteration=1)
    assert early["pp-fwd"]["sent"] == early["pp-fwd"]["raw"]
    assert early["pp-bwd"]["sent"] == early["pp-bwd"]["raw"]
    mid = channel_bytes(shape, layout, c, iteration=2)   # fwd on, CB still warming (3 iters)
    assert mid["pp-fwd"]["sent"] < mid["pp-fwd"]["raw"]
    assert mid["pp-bwd"]["sent"] == mid["pp-bwd"]["raw"]
    late = channel_bytes(shape, layout, c, iteration=3)
    one = _encoded_bytes(pp_codec(c, "pp-bwd", LinkEnd("pp-bwd", comp_seed=1)))
    raw = S * B * H * 4
    assert late["pp-bwd"]["sent"] == 3 * raw + one   # micro-batches 0..2 raw, 3 compressed
    assert channel_bytes(shape, layout, c) == late    # steady state


def test_tp_and_dp_multiply_the_messages():
    """Without scatter-gather every tp rank sends the whole message (tp x dp = 6 copies);
    with it (the default) each tp rank sends its (S/tp, B, H) slice: raw is one message per
    replica, and the payload is the codec's on the slice (fixpoint: H scales per slice)."""
    from megatron.training.compression.pipeline_codecs import forward_codec
    args, shape, _ = _setup(FWD["fixpoint-4"])
    c = args.compression
    one = channel_bytes(shape, Layout(1, 2, 1, B, 4), c)["pp-fwd"]
    many = channel_bytes(shape, Layout(2, 2, 3, B, 4, scatter_gather=False), c)["pp-fwd"]
    assert many == {k: 6 * v for k, v in one.items()}
    sg = channel_bytes(shape, Layout(2, 2, 3, B, 4), c)["pp-fwd"]
    codec = forward_codec(args, capacity=B, seed=1, ram_limit=None)
    assert sg["messages"] == 6 * one["messages"] and sg["raw"] == 3 * one["raw"]
    assert sg["sent"] == sg["messages"] * codec.payload_nbytes((S // 2, B, H), torch.float32)
    bwd = channel_bytes(shape, Layout(2, 2, 3, B, 4), c)["pp-bwd"]
    assert bwd["raw"] == bwd["messages"] * (S // 2) * B * H * 4
