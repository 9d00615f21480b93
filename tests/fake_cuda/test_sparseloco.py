"""SparseLoCo's send path on a fake GPU: the chunked top-k codec and the all-gather exchange
encode, gather, decode and average with no host sync (inside `gpu.strict()`), everything on
the message's device; the payload is the codec's formula. (The fake tier's one-rank gloo group
runs the all-gather.)"""
import torch

from tests.sync_guard import no_host_sync


def test_codec_without_host_sync_on_cpu():
    from megatron.cc.compress.chunk_topk import ChunkTopKCodec
    x = torch.randn(9000)
    for codec in (ChunkTopKCodec(1 / 64, 4096, 2), ChunkTopKCodec(1.0, 128, 8),
                  ChunkTopKCodec(0.1, 100, 3, stochastic=True)):
        with no_host_sync():
            payload = codec.compress(x)
            codec.decompress(payload, x.numel())


def test_exchange_on_a_fake_gpu(gpu):
    import torch.distributed as dist
    from megatron.cc.compress.chunk_topk import ChunkTopKCodec
    from megatron.cc.grad_sync.gather_exchange import GatherExchange
    for codec in (ChunkTopKCodec(1 / 64, 4096, 2, stochastic=True), ChunkTopKCodec(1.0, 64, 8)):
        ex = GatherExchange(dist.group.WORLD, codec)
        x = torch.randn(9000).to(gpu.device)
        start = len(gpu.events)
        with gpu.strict():
            mean, dq, counted = ex(x, 0)
            payload = codec.compress(x)
        assert mean.device == dq.device == gpu.device
        assert {p.device for p in payload} == {gpu.device}
        assert counted == 1 * codec.nbytes(9000) // 2
        assert gpu.syncs(since=start) == []
