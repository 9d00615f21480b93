"""--check-comp-speed on CUDA: timing by events costs no host sync; records are observed once
their events complete (drain), in order. Skipped without CUDA."""
import pytest
import torch

from megatron.cc.codecs import CodecContext, get_codec
from megatron.cc.common.speed import CompSpeed, TimedCodec
from megatron.cc.common.stats import ChannelStats
from tests.sync_guard import no_host_sync

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_timed_codec_on_cuda_without_host_sync():
    dev = torch.device("cuda", torch.cuda.current_device())
    stats = ChannelStats()
    speed = CompSpeed(stats)
    codec = TimedCodec(get_codec("rsvd", rank=4, error_feedback=True), speed, "pp-bwd")
    x = torch.randn(128, 4, 256, device=dev)
    codec.decode(codec.encode(x, CodecContext()), x.shape, x.dtype)   # warm-up
    with no_host_sync(dev):
        for t in range(4):
            ctx = CodecContext(iteration=t)
            codec.decode(codec.encode(x, ctx), x.shape, x.dtype, ctx)
    torch.cuda.synchronize()
    speed.drain()
    snap = stats.snapshot()
    assert snap["pp-bwd comp GB/s"]["count"] == 5 and snap["pp-bwd decomp GB/s"]["count"] == 5
    assert snap["pp-bwd comp GB/s"]["sum"] > 0
