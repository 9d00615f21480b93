"""SparseLoCo's send path on a fake GPU: the chunked top-k codec and the all-gather exchange
encode, gather, decode and average with no host sync (inside `gpu.strict()`), everything on
the message's device; the payload is the codec's formula. (The fake tier's one-rank gloo group
runs the all-gather.)"""
import torch

from tests.sync_guard import no_host_sync


# (density, chunk C, bits, stochastic) -> payload bytes of 9000 values by the formula, by hand:
# m = ceil(9000 / C) chunks of k kept values, i = ceil(log2 C) index bits (none when k = C):
# ceil(m k i / 8) + ceil(m k bits / 8) + 2 m
CODECS = {(1 / 64, 4096, 2, False): 288 + 48 + 6,     # m 3, k 64, i 12
          (1.0, 128, 8, False): 0 + 9088 + 142,        # m 71, k 128 = C: dense, no indices
          (0.1, 100, 3, True): 788 + 338 + 180}        # m 90, k 10, i 7


def test_codec_without_host_sync_on_cpu():
    """compress and decompress run under `no_host_sync()` (HostSync is an AssertionError) and
    still do their job: the payload is the formula's bytes, and the dense result keeps exactly
    each chunk's k largest magnitudes (torch.topk on the input) at their positions."""
    from megatron.cc.codecs.chunk_topk import ChunkTopKCodec
    x = torch.randn(9000, generator=torch.Generator().manual_seed(0))
    for (density, C, bits, stochastic), nbytes in CODECS.items():
        codec = ChunkTopKCodec(density, C, bits, stochastic=stochastic)
        with no_host_sync():
            payload = codec.compress(x)
            out = codec.decompress(payload, x.numel())
        assert sum(p.numel() * p.element_size() for p in payload) == nbytes == codec.nbytes(9000)
        assert out.shape == x.shape and out.dtype == torch.float32
        m, k = -(-x.numel() // C), codec.k
        mag = torch.nn.functional.pad(x.abs(), (0, m * C - x.numel()), value=-1.0).view(m, C)
        kept = torch.zeros(m, C, dtype=torch.bool).scatter_(1, mag.topk(k, dim=1).indices, True)
        kept = kept.reshape(-1)[: x.numel()]
        assert torch.all(out[~kept] == 0)
        assert (out[kept] != 0).float().mean() > 0.9   # the kept values survive quantisation
        signs = out[kept] != 0
        assert torch.equal(out[kept][signs].sign(), x[kept][signs].sign())
        if bits == 8:   # dense 8-bit: the input itself, to quantisation error
            assert ((out - x).norm() / x.norm()) < 0.02


def test_exchange_on_a_fake_gpu(gpu):
    import torch.distributed as dist
    from megatron.cc.codecs.chunk_topk import ChunkTopKCodec
    from megatron.cc.data_parallel.gather_exchange import GatherExchange
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
