"""Optimus-CC compressed backprop (PowerSGD step) and lazy error propagation."""
import importlib.util
import math
import pathlib

import pytest
import torch
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _orthogonalize_gram_schmidt

from megatron.cc.codecs import CodecContext, get_codec, orthogonalize_, payload_bytes
from megatron.cc.codecs.lowrank import LowRankCodec, matrix_dims

CTX = CodecContext()


@pytest.mark.parametrize("n,r", [(50, 1), (64, 8), (33, 16)])
def test_orthogonalize_matches_torch_powersgd(n, r):
    p = torch.randn(3, n, r, dtype=torch.float64)
    ours = orthogonalize_(p.clone(), eps=1e-8)
    oracle = p.clone()
    _orthogonalize_gram_schmidt(oracle, epsilon=1e-8)
    torch.testing.assert_close(ours, oracle)
    eye = torch.eye(r, dtype=torch.float64).expand(3, r, r)
    torch.testing.assert_close(ours.transpose(1, 2) @ ours, eye, atol=1e-6, rtol=0)


def test_orthogonalize_zero_column_stays_finite():
    p = torch.randn(10, 3)
    p[:, 1] = 0
    orthogonalize_(p)
    assert bool(torch.isfinite(p).all()) and float(p[:, 1].abs().max()) < 1e-6


@pytest.mark.parametrize("scale", [1e-7, 1.0, 1e5])
def test_orthogonalize_is_scale_invariant(scale):
    """Gradients of ~1e-5 per element are normal; an absolute eps would shrink their residual
    columns instead of normalising them (the codec then keeps far less than rank r allows)."""
    torch.manual_seed(6)
    p = torch.randn(128, 4) @ torch.randn(4, 16) + 1e-3 * torch.randn(128, 16)  # ill-conditioned
    q = orthogonalize_((p * scale).clone())
    torch.testing.assert_close(q, orthogonalize_(p.clone()), atol=1e-3, rtol=0)
    torch.testing.assert_close(q.t() @ q, torch.eye(16), atol=2e-3, rtol=0)


def test_codec_is_scale_equivariant():
    torch.manual_seed(7)
    A = torch.randn(64, 6) @ torch.randn(6, 48) + 0.1 * torch.randn(64, 48)
    small, unit = get_codec("lowrank", rank=4), get_codec("lowrank", rank=4)
    for _ in range(5):
        a = unit.decode(unit.encode(A, CTX), A.shape, A.dtype, CTX)
        b = small.decode(small.encode(A * 1e-6, CTX), A.shape, A.dtype, CTX)
    torch.testing.assert_close(b / 1e-6, a, rtol=1e-3, atol=1e-3)


def powersgd_oracle(M, Q):
    """One PowerSGD step written out: P = M Q, orth(P), Q' = M^T P."""
    P = M @ Q
    _orthogonalize_gram_schmidt(P.unsqueeze(0), epsilon=1e-8)
    return P, M.t() @ P


def test_one_step_equals_powersgd_oracle():
    torch.manual_seed(0)
    c = get_codec("lowrank", rank=4, seed=3)
    x = torch.randn(16, 2, 24)
    M = x.reshape(32, 24)
    Q0 = torch.randn(24, 4, generator=torch.Generator().manual_seed(3))
    P, Q = powersgd_oracle(M, Q0)
    p = c.encode(x, CTX)
    torch.testing.assert_close(p[0], P)
    torch.testing.assert_close(p[1], Q)
    torch.testing.assert_close(c.decode(p, x.shape, x.dtype, CTX), (P @ Q.t()).view_as(x))
    # warm start: the next call starts from the Q just computed
    x2 = torch.randn(16, 2, 24)
    P2, Q2 = powersgd_oracle(x2.reshape(32, 24), Q)
    p2 = c.encode(x2, CTX)
    torch.testing.assert_close(p2[1], Q2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape,r", [((3, 5), 3), ((2, 4, 6), 6), ((4, 1, 9), 12), ((7, 2), 2)])
def test_full_rank_is_exact(shape, r, dtype):
    x = torch.randn(shape).to(dtype)
    c = get_codec("lowrank", rank=r, error_feedback=True)
    n, m = matrix_dims(shape)
    assert c.full_rank(shape)
    p = c.encode(x, CTX)
    assert payload_bytes(p) == n * m * x.element_size() <= r * (n + m) * x.element_size()
    y = get_codec("lowrank", rank=r).decode(p, shape, dtype, CTX)
    assert torch.equal(y, x)
    assert float(c.error(shape).abs().max()) == 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape,r", [((16, 2, 40), 8), ((9, 3, 17), 1), ((64, 33), 16)])
@pytest.mark.parametrize("payload_dtype", [None, "bfloat16", "float32"])
def test_bytes_are_r_times_n_plus_m(shape, r, dtype, payload_dtype):
    c = get_codec("lowrank", rank=r, payload_dtype=payload_dtype)
    n, m = matrix_dims(shape)
    p = c.encode(torch.randn(shape).to(dtype), CTX)
    size = torch.empty((), dtype={None: dtype, "bfloat16": torch.bfloat16,
                                  "float32": torch.float32}[payload_dtype]).element_size()
    assert payload_bytes(p) == r * (n + m) * size == c.payload_nbytes(shape, dtype)
    assert [tuple(t.shape) for t in p] == [(n, r), (m, r)]


@pytest.mark.parametrize("payload_dtype", [None, "bfloat16"])
def test_lep_sent_plus_error_equals_true_sum(payload_dtype):
    torch.manual_seed(1)
    shape = (32, 2, 48)
    send = get_codec("lowrank", rank=4, error_feedback=True, payload_dtype=payload_dtype)
    recv = get_codec("lowrank", rank=4, payload_dtype=payload_dtype)
    total_true, total_sent = torch.zeros(shape), torch.zeros(shape)
    for it in range(3):
        for mb in range(4):
            g = torch.randn(shape)
            ctx = CodecContext(microbatch=mb, iteration=it)
            total_true += g
            total_sent += recv.decode(send.encode(g, ctx), shape, g.dtype, ctx)
    torch.testing.assert_close(total_sent + send.error(shape).view(shape), total_true,
                               atol=1e-4, rtol=1e-4)
    # the error is folded into the next send, never lost: without EF the gap is far larger
    assert float(send.error(shape).norm()) > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lep_flush_delivers_error_with_uncompressed_send(dtype):
    """Epilogue-only pattern (compressed, compressed, plain, ...): sent + E still equals the
    true sum, a plain send empties E (up to the cast's rounding), and without the flag a plain
    send leaves E and the message untouched (the reference's behaviour)."""
    torch.manual_seed(4)
    shape = (16, 2, 24)
    flush = get_codec("lowrank", rank=3, error_feedback=True, flush_on_uncompressed=True)
    hold = get_codec("lowrank", rank=3, error_feedback=True)
    total_true, total_sent = torch.zeros(shape), torch.zeros(shape)
    for i, compressed in enumerate([True, True, False, True, False, False, True]):
        g = torch.randn(shape).to(dtype)
        total_true += g.float()
        if compressed:
            total_sent += flush.decode(flush.encode(g, CTX), shape, dtype, CTX).float()
            hold.encode(g, CTX)
            continue
        sent = flush.pass_through(g, CTX)
        assert sent.dtype == dtype and sent.shape == g.shape
        total_sent += sent.float()
        err = flush.error(shape)
        bound = 0 if dtype == torch.float32 else float(sent.float().abs().max()) * 2 ** -8
        assert float(err.abs().max()) <= bound
        e_before = hold.error(shape).clone()
        assert hold.pass_through(g, CTX) is g and torch.equal(hold.error(shape), e_before)
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(total_sent + flush.error(shape).view(shape), total_true,
                               atol=tol, rtol=tol)


def test_warm_start_persists_and_is_per_shape():
    torch.manual_seed(2)
    c = get_codec("lowrank", rank=2)
    A = torch.randn(64, 3) @ torch.randn(3, 40)  # rank 3, so rank 2 converges to the top pair
    errs = []
    for _ in range(8):
        p = c.encode(A, CTX)
        errs.append(float((c.decode(p, A.shape, A.dtype, CTX) - A).norm()))
    best = torch.linalg.svdvals(A)[2:].norm().item()  # Eckart-Young optimum for rank 2
    assert errs[-1] < errs[0] and errs[-1] < best * 1.01
    c.encode(torch.randn(5, 40), CTX)
    assert set(c.qs) == {"64x40", "5x40"}


def test_power_iters_reach_eckart_young_in_one_message():
    """Extra local power steps (no extra bytes) bring a cold-started message close to the best
    rank-r approximation; one step from a random Q is far from it."""
    torch.manual_seed(5)
    A = torch.randn(96, 8) @ torch.diag(torch.logspace(0, -1, 8)) @ torch.randn(8, 64)
    A += 0.01 * torch.randn(96, 64)
    best = torch.linalg.svdvals(A)[4:].norm().item()        # optimum for rank 4
    errs = {}
    for k in (1, 2, 8):
        c = get_codec("lowrank", rank=4, power_iters=k)
        p = c.encode(A, CTX)
        assert payload_bytes(p) == 4 * (96 + 64) * 4       # bytes do not depend on k
        errs[k] = float((c.decode(p, A.shape, A.dtype, CTX) - A).norm())
    assert errs[8] < best * 1.02 and errs[8] < errs[2] < errs[1]
    with pytest.raises(ValueError, match="power_iters"):
        get_codec("lowrank", rank=4, power_iters=0)


def test_zero_gradient_keeps_warm_start():
    c = get_codec("lowrank", rank=3)
    c.encode(torch.randn(20, 10), CTX)
    q = c.qs["20x10"].clone()
    p = c.encode(torch.zeros(20, 10), CTX)
    assert all(bool(torch.isfinite(t).all()) for t in p)
    assert torch.equal(c.qs["20x10"], q)


def test_state_dict_round_trip():
    torch.manual_seed(3)
    a = get_codec("lowrank", rank=4, error_feedback=True)
    for _ in range(3):
        a.encode(torch.randn(8, 2, 30), CTX)
    b = get_codec("lowrank", rank=4, error_feedback=True)
    b.load_state_dict(a.state_dict())
    x = torch.randn(8, 2, 30)
    for p, q in zip(a.encode(x, CTX), b.encode(x, CTX)):
        assert torch.equal(p, q)
    assert torch.equal(a.error(x.shape), b.error(x.shape))


def test_full_rank_boundary_uses_formula():
    for n, m, r in [(4, 10, 3), (4, 10, 4), (10, 4, 4)]:
        c = get_codec("lowrank", rank=r)
        elems = n * m if r >= min(n, m) else r * (n + m)
        assert c.payload_nbytes((n, m), torch.float32) == 4 * elems
        assert math.prod(c.payload_spec((n, m), torch.float32)[0][0]) in (n * m, n * r)


def _slowly_varying_low_rank(t: int):
    """Message t of a rank-4 gradient whose factors rotate slowly, plus 1e-3 noise (the setting
    of the codec-fidelity table: the seed's CB stays at 0.0005 relative error); the generator of
    bench/bench_codec_fidelity.py, data (c)."""
    spec = importlib.util.spec_from_file_location(
        "bench_codec_fidelity", pathlib.Path(__file__).parents[3] / "bench" /
        "bench_codec_fidelity.py")
    fid = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fid)
    return fid.low_rank_sequence(t)


@pytest.mark.parametrize("power_iters", [1, 2])
def test_lep_on_slowly_varying_low_rank_stays_near_svd_floor(power_iters):
    """Q is re-orthogonalised before reuse and between power steps: without it the reused Q's
    columns (scaled by the singular values) make M Q ill-conditioned and the error climbs to
    0.5-0.9 within three messages. Each of 8 messages stays within 2x the rank-16 SVD floor."""
    c = LowRankCodec(rank=16, error_feedback=True, power_iters=power_iters)
    for t in range(8):
        x = _slowly_varying_low_rank(t)
        m_in = x + (c.error(x.shape) if c.error(x.shape) is not None else 0)
        p = c.encode(x)
        assert payload_bytes(p) == 16 * (256 + 256) * 4
        err = torch.linalg.norm(m_in - c.decode(p, x.shape, x.dtype)) / torch.linalg.norm(m_in)
        s = torch.linalg.svdvals(m_in)
        floor = s[16:].square().sum().sqrt() / s.square().sum().sqrt()
        assert err <= 2 * floor, (t, float(err), float(floor))


@pytest.mark.parametrize("r", [8, 16])
def test_rank_deficient_message_is_exact(r):
    """A rank-3 gradient at rank r > 3: one Gram-Schmidt pass leaves the columns past rank 3
    as normalised rounding noise, not orthogonal (error 0.8-0.9); two passes are exact."""
    g = torch.Generator().manual_seed(r)
    x = torch.randn(96, 3, generator=g) @ torch.randn(3, 64, generator=g)
    c = LowRankCodec(rank=r)
    for _ in range(3):
        y = c.decode(c.encode(x), x.shape, x.dtype)
        assert torch.linalg.norm(y - x) / torch.linalg.norm(x) < 1e-4
    q = orthogonalize_(torch.randn(96, r, generator=g) @ torch.diag(torch.tensor([1.0] * 3 + [1e-9] * (r - 3))))
    assert torch.allclose(q.t() @ q, torch.eye(r), atol=1e-4)


def _reference_encode(state, x):
    """The error update as written before it moved into the error buffer: out of place."""
    from megatron.cc.codecs.lowrank import matrix_dims, shape_key
    n, m = matrix_dims(x.shape)
    key = shape_key(x.shape)
    M = x.reshape(n, m).float()
    if key in state:
        M = M + state[key]
    return M, key


@pytest.mark.parametrize("name", ["lowrank", "rsvd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rank", [3, 64])   # low rank, and full rank (M itself is sent)
def test_error_buffer_updated_in_place_as_out_of_place(name, dtype, rank):
    """LEP's error: x + E and the new E = M - P Q^T computed in E's buffer give the values of
    the out-of-place sums; an fp32 input is never written; the full-rank payload survives."""
    codec = get_codec(name, rank=rank, error_feedback=True)
    g = torch.Generator().manual_seed(0)
    errors = {}
    for step in range(3):
        x = torch.randn(5, 2, 12, generator=g).to(dtype)
        x0 = x.clone()
        M, key = _reference_encode(errors, x)
        payload = codec.encode(x, CodecContext(microbatch=0, iteration=step))
        assert torch.equal(x, x0)
        sent = [p.float() for p in payload]
        if len(sent) == 1:
            want = M - sent[0]
        elif name == "lowrank":
            want = torch.addmm(M, sent[0], sent[1].t(), alpha=-1)
        else:
            want = M - sent[0] @ sent[1].t()
        assert torch.equal(codec.error(x.shape), want)
        if len(sent) == 1:
            assert torch.equal(sent[0], M.to(dtype).float())
        errors[key] = want
