"""Gram-Schmidt kernel (megatron/cc/kernels/lowrank.py) under Triton's interpreter: bit-identical
to its torch twin (group_sums.orthogonalize_, the kernels' summation order), which agrees with
the codec's lowrank.orthogonalize_ up to rounding."""
import pytest
import torch

from megatron.cc.codecs import lowrank
from megatron.cc.kernels import group_sums
from tests.cc.kernels.interpret import kernels

kl = kernels("lowrank")


def matrix(n, r, rank=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    if rank is None:
        return torch.randn(n, r, generator=g) * torch.logspace(0, -4, r)
    return torch.randn(n, rank, generator=g) @ torch.randn(rank, r, generator=g)


CASES = [("tall", matrix(1300, 16, seed=1)),         # 3 row steps of 512, the last partial
         ("short", matrix(200, 16, seed=6)),         # one step of 256 lanes, 56 empty
         ("small", matrix(37, 5, seed=2)),           # one chunk of 64 lanes, 27 empty
         ("rank2of6", matrix(90, 6, rank=2, seed=3)),  # columns past the rank: rounding noise
         ("zero-col", torch.cat([matrix(50, 3, seed=4), torch.zeros(50, 1)], dim=1)),
         ("tiny", matrix(70, 4, seed=5) * 1e-20)]


@pytest.mark.parametrize("p", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_bit_identical_to_twin_and_close_to_codec(p):
    got = kl.orthogonalize_(p.clone(), 1e-8)
    twin = group_sums.orthogonalize_(p.clone(), 1e-8)
    assert torch.equal(got.view(torch.int32), twin.view(torch.int32))
    ref = lowrank.orthogonalize_(p.clone(), 1e-8)
    if torch.linalg.matrix_rank(p.double(), rtol=1e-5) == p.shape[1]:
        # full rank: orthonormal columns, the codec's up to rounding
        assert torch.allclose(got.t() @ got, torch.eye(p.shape[1]), atol=1e-5)
        assert torch.allclose(got, ref, atol=1e-4, rtol=0)
    else:
        # columns past the rank are rounding noise in any order: compare what P P^T keeps
        for q in (got, ref):
            assert torch.allclose(q @ (q.t() @ p), p, atol=1e-4 * float(p.abs().max()))


def test_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="contiguous fp32"):
        kl.orthogonalize_(torch.randn(8, 3).t(), 1e-8)


@pytest.mark.parametrize("n,m,r,pdtype", [(70, 150, 16, torch.bfloat16),   # 2 x 2 tiles
                                          (5, 3, 4, torch.float32),
                                          (130, 1, 1, torch.float16)])
def test_decode_product_bit_identical_to_twin_and_close_to_matmul(n, m, r, pdtype):
    g = torch.Generator().manual_seed(n)
    p = torch.randn(n, r, generator=g).to(pdtype)
    q = (torch.randn(m, r, generator=g) * 1e3).to(pdtype)
    twin = group_sums.low_rank_product(p, q)
    mm = p.float() @ q.float().t()
    assert torch.allclose(twin, mm, rtol=1e-5, atol=1e-3)
    for out in (torch.float32, torch.float16, torch.bfloat16):
        got = kl.low_rank_product(p, q, (n, 1, m), out)
        assert got.shape == (n, 1, m) and got.dtype == out
        assert torch.equal(got.view(n, m), twin.to(out))


def test_codec_decode_routes_to_the_kernel(monkeypatch):
    from megatron.cc.codecs import get_codec
    from megatron.cc.kernels import dispatch
    codec = get_codec("lowrank", rank=4)
    x = torch.randn(6, 2, 40)
    payload = codec.encode(x)
    monkeypatch.setattr(dispatch, "enabled", lambda *t: True)
    got = codec.decode(payload, x.shape, torch.bfloat16)
    want = group_sums.low_rank_product(*payload).to(torch.bfloat16).view(x.shape)
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("n,m,r", [(300, 700, 16), (37, 5, 3)])
def test_finish_equals_the_eager_steps(n, m, r, dtype, monkeypatch):
    """A dead (all-zero) column of Q takes q_old's; a column of tiny values is not dead; P and
    Q cast as torch casts them (fp16's overflow and bf16's ties included: NaN's bits differ
    between torch's CPU and CUDA casts), over several programs."""
    monkeypatch.setattr(kl, "FINISH_ROWS", 64)
    p, q, q_old = matrix(n, r, seed=7), matrix(m, r, seed=8) * 300, matrix(m, r, seed=9)
    q[:, 0] = 0
    q[:, -1] = 1e-18 * torch.arange(m)               # squares still normal in fp32
    p[0, 0] = 1e6
    p[1, 0] = 1 + 2 ** -8                            # a tie on bf16's grid
    q_in = q.clone()
    dead = torch.linalg.vector_norm(q, dim=0) == 0
    q_ref = torch.where(dead, q_old, q)
    got = kl.finish(p, q, q_old, dtype)
    want = (p.to(dtype), q_ref.to(dtype), p.to(dtype).float(), q_ref.to(dtype).float())
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    assert torch.equal(q, q_ref) and not torch.equal(q, q_in)
    assert dead.tolist()[0] and not dead.tolist()[-1]


def test_codec_encode_routes_the_payload_through_finish(monkeypatch):
    from megatron.cc.codecs import get_codec
    from megatron.cc.kernels import dispatch
    calls = []
    orig = kl.finish
    monkeypatch.setattr(kl, "finish", lambda *a: calls.append(a[3]) or orig(*a))
    codec = get_codec("lowrank", rank=4, error_feedback=True)
    x = matrix(64, 48, seed=10).to(torch.bfloat16)
    monkeypatch.setattr(dispatch, "enabled", lambda *t: True)
    payload = codec.encode(x)
    assert calls == [torch.bfloat16] and [t.dtype for t in payload] == [torch.bfloat16] * 2
    assert torch.equal(codec.qs[lowrank.shape_key(x.shape)].to(torch.bfloat16), payload[1])


@pytest.mark.parametrize("inplace", [False, True])
def test_residual_is_the_matrix_minus_the_decode(inplace):
    """low_rank_residual = mat - low_rank_product(P, Q) in fp32, bit for bit (one rounding of
    each difference), in place or not."""
    p, q = matrix(130, 7, seed=11).bfloat16(), matrix(150, 7, seed=12).bfloat16()
    mat = matrix(130, 150, seed=13)
    want = mat - kl.low_rank_product(p, q, (130, 150), torch.float32)
    src = mat.clone()
    got = kl.low_rank_residual(src, p, q, out=src if inplace else None)
    assert torch.equal(got, want) and (got is src) == inplace
    assert torch.equal(src, want if inplace else mat)


def test_rsvd_error_feedback_routes_to_the_residual(monkeypatch):
    """The randomized SVD's LEP error on the kernels: M minus what the receiver rebuilds."""
    from megatron.cc.codecs import get_codec
    from megatron.cc.kernels import dispatch
    x = matrix(96, 80, seed=14).to(torch.bfloat16)
    ref = get_codec("rsvd", rank=4, error_feedback=True)
    ref.encode(x)                                             # eager: M - decode(payload)
    calls = []
    orig = kl.low_rank_residual
    monkeypatch.setattr(kl, "low_rank_residual", lambda *a, **k: calls.append(1) or orig(*a, **k))
    codec = get_codec("rsvd", rank=4, error_feedback=True)
    monkeypatch.setattr(dispatch, "enabled", lambda *t: True)
    payload = codec.encode(x)
    key = lowrank.shape_key(x.shape)
    rebuilt = kl.low_rank_product(*payload, (96, 80), torch.float32)
    assert calls == [1] and torch.equal(codec.errors[key], x.float() - rebuilt)
    assert torch.allclose(codec.errors[key], ref.errors[key], atol=1e-2)
