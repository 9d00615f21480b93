"""CocktailSGD on kernels (megatron/cc/kernels/sparse.py) under Triton's interpreter: compress
gives the eager payload and decompress the eager tensor, bit for bit, for masked and unmasked
payloads, every rolling offset, a tail shorter than the stride, the output dtypes, several
blocks (and running sum steps), a strided input, and a malformed mask whose extra bits the
eager code clamps."""
import pytest
import torch

from megatron.cc.codecs import get_codec
from tests.cc.kernels.interpret import kernels

sparse = kernels("sparse")


def _payload(codec, numel, step, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(numel, generator=g) * torch.rand(numel, generator=g).pow(3) * 4
    return codec.compress(x, step)


@pytest.mark.parametrize("numel,random_ratio,topk_ratio,bits,scheme,scale_dtype", [
    (1000, 0.1, 0.2, 4, "fitted", "float16"),
    (997, 0.1, 0.2, 2, "absmax", "bfloat16"),      # the last subset position past the end
    (513, 0.25, 1.0, 8, "fitted", "float16"),      # every sampled entry kept: no mask
    (7, 0.1, 0.5, 4, "fitted", "float16"),         # fewer values than the stride
    (300, 1.0, 0.3, 1, "seed", "float16"),         # stride 1
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_decompress_equals_the_eager_one(numel, random_ratio, topk_ratio, bits, scheme,
                                         scale_dtype, dtype, monkeypatch):
    monkeypatch.setattr(sparse, "BLOCK", 16)        # several blocks ...
    monkeypatch.setattr(sparse, "SCAN_CHUNK", 4)    # ... and running-sum steps
    codec = get_codec("cocktail", random_ratio=random_ratio, topk_ratio=topk_ratio,
                      bits=bits, scheme=scheme, scale_dtype=scale_dtype, seed=3)
    for step in range(codec.stride + 1):            # every offset of the rolling subset
        payload = _payload(codec, numel, step, seed=step)
        want = codec.decompress(payload, numel, step, dtype)   # CPU tensors: eager
        got = sparse.decompress(codec, payload, numel, step, dtype)
        assert got.dtype == want.dtype and torch.equal(got, want), step


def test_malformed_mask_decodes_as_the_eager_code_does(monkeypatch):
    monkeypatch.setattr(sparse, "BLOCK", 16)
    codec = get_codec("cocktail", random_ratio=0.1, topk_ratio=0.2, bits=4)
    payload = _payload(codec, 2000, 1)
    payload[0] = torch.full_like(payload[0], 0xFF)  # every bit set: more than k
    assert not codec.mask_ok(payload, 2000)
    want = codec.decompress(payload, 2000, 1)
    assert torch.equal(sparse.decompress(codec, payload, 2000, 1, torch.float32), want)


def test_the_codec_routes_to_the_kernels(monkeypatch):
    from megatron.cc.kernels import dispatch
    codec = get_codec("cocktail")
    payload = _payload(codec, 3000, 2)
    want = codec.decompress(payload, 3000, 2)
    calls = []
    orig = sparse.decompress
    monkeypatch.setattr(sparse, "decompress", lambda *a: calls.append(1) or orig(*a))
    monkeypatch.setattr(dispatch, "enabled", lambda *t: True)
    assert torch.equal(codec.decompress(payload, 3000, 2), want) and calls == [1]


@pytest.mark.parametrize("numel,random_ratio,topk_ratio,bits", [
    (1000, 0.1, 0.2, 4),
    (997, 0.1, 0.2, 2),          # the last subset position past the end
    (513, 0.25, 1.0, 8),         # every sampled entry kept: no mask
    (7, 0.1, 0.5, 4),            # fewer values than the stride
    (300, 1.0, 0.3, 1),          # stride 1, and a mask of 300 bits: not whole 32-bit words
    (5000, 0.5, 0.9, 4),         # a pad among the kept entries, several programs
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_compress_equals_the_eager_one(numel, random_ratio, topk_ratio, bits, dtype,
                                       monkeypatch):
    from megatron.cc.kernels import dispatch
    monkeypatch.setattr(sparse, "SAMPLE_BLOCK", 64)
    # absmax: the fitted scales' kernels sum in another order (tests/cc/kernels/test_fixpoint)
    codec = get_codec("cocktail", random_ratio=random_ratio, topk_ratio=topk_ratio,
                      bits=bits, seed=5, scheme="absmax")
    g = torch.Generator().manual_seed(numel)
    x = (torch.randn(numel, generator=g) * 3).to(dtype)
    x[::7] = 0                                      # ties among the magnitudes
    for step in range(codec.stride + 1):
        want = codec.compress(x, step)              # CPU tensors: eager
        with monkeypatch.context() as m:
            m.setattr(dispatch, "enabled", lambda *t: True)
            got = codec.compress(x, step)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and torch.equal(a, b), step


def test_compress_of_a_strided_view(monkeypatch):
    """A 1-D view with stride 2 (reshape(-1) keeps it a view): the kernels read its values."""
    from megatron.cc.kernels import dispatch
    codec = get_codec("cocktail", random_ratio=0.25, topk_ratio=0.5, scheme="absmax")
    x = torch.randn(2000, generator=torch.Generator().manual_seed(1))[::2]
    want = codec.compress(x, 1)
    monkeypatch.setattr(dispatch, "enabled", lambda *t: True)
    assert all(torch.equal(a, b) for a, b in zip(codec.compress(x, 1), want))
