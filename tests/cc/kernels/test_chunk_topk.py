"""SparseLoCo's chunked top-k codec on kernels (megatron/cc/kernels/chunk_topk.py) under
Triton's interpreter: compress gives the eager payload bit for bit, decompress the eager dense
tensor, for a short last chunk (pads kept or not), position widths below and above a byte,
every entry kept (no positions), the output dtypes and several programs."""
import pytest
import torch

from megatron.cc.codecs.chunk_topk import ChunkTopKCodec
from tests.cc.kernels.interpret import kernels

chunk_topk = kernels("chunk_topk")

CASES = [
    # numel, density, chunk, bits
    (4096 * 3, 1 / 64, 4096, 2),
    (1000, 0.25, 16, 4),          # 4-bit positions
    (1000, 0.1, 300, 3),          # 9-bit positions, a short last chunk (100 real, k = 30)
    (1010, 0.5, 100, 8),          # a last chunk of 10 real entries < k = 50: pads kept
    (700, 1.0, 64, 4),            # every entry kept: no positions
]


def _x(numel, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(numel, generator=g) * torch.rand(numel, generator=g).pow(2) * 3
    x[::11] = 0                   # ties among the magnitudes
    return x.to(dtype)


@pytest.mark.parametrize("numel,density,chunk,bits", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_compress_and_decompress_equal_the_eager_ones(numel, density, chunk, bits, dtype,
                                                      monkeypatch):
    from megatron.cc.kernels import dispatch
    monkeypatch.setattr(chunk_topk, "BLOCK", 64)
    # absmax: the fitted scales' kernels sum in another order (tests/cc/kernels/test_fixpoint)
    codec = ChunkTopKCodec(density, chunk, bits, scheme="absmax")
    x = _x(numel, dtype, seed=bits)
    want = codec.compress(x)                             # CPU tensors: eager
    with monkeypatch.context() as m:
        m.setattr(dispatch, "enabled", lambda *t: True)
        got = codec.compress(x)
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, want))
    for out in (torch.float32, torch.float16, torch.bfloat16):
        ref = codec.decompress(want, numel, dtype=out)
        dec = chunk_topk.decompress(codec, want, numel, out)
        assert dec.dtype == ref.dtype and torch.equal(dec, ref), out


def test_the_codec_routes_to_the_kernels(monkeypatch):
    from megatron.cc.kernels import dispatch
    codec = ChunkTopKCodec(0.25, 16, 4)
    x = _x(500, torch.float32)
    calls = []
    for name in ("compress", "decompress"):
        orig = getattr(chunk_topk, name)
        monkeypatch.setattr(chunk_topk, name,
                            lambda *a, orig=orig, name=name: calls.append(name) or orig(*a))
    with monkeypatch.context() as m:
        m.setattr(dispatch, "enabled", lambda *t: True)
        payload = codec.compress(x)
        got = codec.decompress(payload, 500)
    assert calls == ["compress", "decompress"]
    assert torch.equal(got, codec.decompress(payload, 500))     # eager, same payload
    assert torch.equal(payload[0], codec.compress(x)[0])       # the same positions


def test_compress_of_a_strided_view(monkeypatch):
    """A 1-D view with stride 2 (reshape(-1) keeps it a view): the kernels read its values."""
    from megatron.cc.kernels import dispatch
    codec = ChunkTopKCodec(0.25, 16, 4, scheme="absmax")
    x = _x(1000, torch.float32)[::2]
    want = codec.compress(x)
    monkeypatch.setattr(dispatch, "enabled", lambda *t: True)
    assert all(torch.equal(a, b) for a, b in zip(codec.compress(x), want))
