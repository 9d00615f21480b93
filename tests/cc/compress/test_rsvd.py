"""The randomized-SVD pieces (codecs/rsvd.py) and the CB codec 'rsvd'.

- orthogonalize_ (Gram-Schmidt twice) keeps P P^T M == M when M's rank is below r, where one
  pass of Gram-Schmidt loses most of M (measured here, 0.5+ relative error);
- the range finder against the SVD: exact below rank r, and within Halko et al.'s expected
  Frobenius bound (Thm. 10.5) on a decaying spectrum; subspace iterations bring it to within
  1.15x of the best rank-r error;
- the codec: payload spec and bytes equal the 'lowrank' codec's at the same rank; full rank
  sends M exactly; LEP's invariant (sum of what was delivered + E == sum of what was given);
  Omega follows (seed, iteration, micro-batch) only; its state round-trips and keeps the seed.
"""
import pytest
import torch

from megatron.cc.codecs import CodecContext, get_codec, payload_bytes
from megatron.cc.codecs.lowrank import orthogonalize_
from megatron.cc.codecs.rsvd import (SeededGaussian, message_seed, range_and_coefficients)
from tests.sync_guard import no_host_sync


def _spectrum(n, m, decay, seed=0):
    g = torch.Generator().manual_seed(seed)
    U, _ = torch.linalg.qr(torch.randn(n, m, generator=g))
    V, _ = torch.linalg.qr(torch.randn(m, m, generator=g))
    s = decay ** torch.arange(m, dtype=torch.float32)
    return U @ torch.diag(s) @ V.t(), s


def _low_rank(n, m, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) @ torch.randn(k, m, generator=g)


def _rel(a, b):
    return float((a - b).norm() / b.norm())


def test_gram_schmidt_twice_is_exact_below_rank_r():
    M = _low_rank(200, 64, k=3)
    Y = M @ torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
    twice = orthogonalize_(Y.clone())               # two passes inside (lowrank.py)
    assert _rel(twice @ (twice.t() @ M), M) < 1e-5
    assert float((twice.t() @ twice - torch.eye(8)).abs().max()) < 1e-5


def test_orthogonalize_keeps_zero_columns_finite():
    P = orthogonalize_(torch.zeros(10, 3))
    assert torch.equal(P, torch.zeros(10, 3))


@pytest.mark.parametrize("niter", [0, 1])
def test_range_finder_recovers_a_matrix_of_rank_below_r(niter):
    M = _low_rank(120, 48, k=5)
    omega = torch.randn(48, 8, generator=torch.Generator().manual_seed(3))
    P, B = range_and_coefficients(M, omega, niter, 1e-8)
    assert _rel(P @ B.t(), M) < 1e-5


def test_range_finder_meets_the_halko_bound_on_a_decaying_spectrum():
    """E ||A - P P^T A||_F <= sqrt(1 + k / (p - 1)) * (sum_{j>k} s_j^2)^1/2 with l = k + p
    columns (Halko, Martinsson & Tropp 2011, Thm. 10.5); averaged over 32 Omegas."""
    A, s = _spectrum(160, 48, decay=0.75)
    l, k = 8, 4
    bound = (1 + k / (l - k - 1)) ** 0.5 * float(s[k:].norm())
    best_l = float(s[l:].norm())   # Eckart-Young: the best rank-l error
    errs = {0: [], 1: []}
    for seed in range(32):
        omega = torch.randn(48, l, generator=torch.Generator().manual_seed(seed))
        for niter in errs:
            P, B = range_and_coefficients(A, omega, niter, 1e-8)
            errs[niter].append(float((A - P @ B.t()).norm()))
    mean = {n: sum(e) / len(e) for n, e in errs.items()}
    print("bound", bound, "best rank-l", best_l, "mean error", mean)
    assert best_l <= mean[1] <= mean[0] <= bound
    assert mean[1] <= 1.15 * best_l       # one subspace iteration: near the SVD floor


def test_message_seed_separates_counters():
    seeds = {message_seed(s, i, j) for s in (0, 714) for i in range(50) for j in range(4)}
    assert len(seeds) == 2 * 50 * 4
    assert all(0 <= x < 2**63 for x in seeds)


def test_seeded_gaussian_follows_the_seed_only():
    g1, g2 = SeededGaussian(), SeededGaussian()
    like = torch.empty(0)
    a = g1.draw([(4, 3), (5, 3)], like, 11)
    g1.draw([(7, 2)], like, 99)                        # other draws in between do not matter
    b = g2.draw([(4, 3), (5, 3)], like, 11)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], g2.draw([(4, 3)], like, 12)[0])


# ------------------------------------------------------------------------------ the codec

SHAPE = (16, 2, 24)   # (S, B, H): n = 32, m = 24


@pytest.mark.parametrize("rank", [1, 4, 12])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_payload_bytes_equal_the_lowrank_codecs(rank, dtype):
    x = torch.randn(SHAPE).to(dtype)
    ours = get_codec("rsvd", rank=rank)
    theirs = get_codec("lowrank", rank=rank)
    shape = torch.Size(SHAPE)
    assert ours.payload_spec(shape, dtype) == theirs.payload_spec(shape, dtype)
    payload = ours.encode(x, CodecContext())
    n, m = 32, 24
    expected = rank * (n + m) * x.element_size()
    assert payload_bytes(payload) == ours.payload_nbytes(SHAPE, dtype) == expected


def test_full_rank_sends_the_message_itself():
    x = torch.randn(SHAPE)
    codec = get_codec("rsvd", rank=24, error_feedback=True)
    payload = codec.encode(x, CodecContext())
    assert len(payload) == 1 and payload_bytes(payload) == x.numel() * 4
    assert torch.equal(codec.decode(payload, x.shape, x.dtype), x)
    assert float(codec.error(SHAPE).abs().max()) == 0.0


def test_exact_below_rank_r_and_near_the_svd_floor_above():
    low = _low_rank(32, 24, k=3).reshape(SHAPE)
    codec = get_codec("rsvd", rank=6)
    assert _rel(codec.decode(codec.encode(low, CodecContext()), SHAPE, torch.float32), low) < 1e-5
    A, s = _spectrum(32, 24, decay=0.7)
    x, floor = A.reshape(SHAPE), float(s[6:].norm() / s.norm())   # Eckart-Young, rank 6
    # mean over 20 messages (20 Omegas) of error / floor; measured 2.29, 1.05, 1.0001
    for power_iters, factor in ((1, 2.6), (3, 1.1), (8, 1.001)):
        codec = get_codec("rsvd", rank=6, power_iters=power_iters)
        ratios = [_rel(codec.decode(codec.encode(x, CodecContext(iteration=t)), SHAPE,
                                    torch.float32), x) / floor for t in range(20)]
        print(power_iters, sum(ratios) / 20)
        assert min(ratios) >= 1 - 1e-4 and sum(ratios) / 20 <= factor


def test_lep_delivers_everything_eventually():
    """sum_t decoded_t + E_T == sum_t x_t (the error is carried, never lost)."""
    codec = get_codec("rsvd", rank=2, error_feedback=True, seed=5)
    total, delivered = torch.zeros(32, 24), torch.zeros(32, 24)
    for t in range(6):
        x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(t))
        out = codec.decode(codec.encode(x, CodecContext(iteration=t)), SHAPE, torch.float32)
        total += x.reshape(32, 24)
        delivered += out.reshape(32, 24)
    assert float((delivered + codec.error(SHAPE) - total).abs().max()) < 1e-4


def test_flush_on_uncompressed_sends_the_pending_error():
    codec = get_codec("rsvd", rank=2, error_feedback=True, flush_on_uncompressed=True)
    x = torch.randn(SHAPE)
    codec.encode(x, CodecContext())
    pending = codec.error(SHAPE).clone()
    y = torch.randn(SHAPE)
    sent = codec.pass_through(y, CodecContext())
    assert torch.allclose(sent, y + pending.reshape(SHAPE), atol=1e-6)
    assert float(codec.error(SHAPE).abs().max()) == 0.0


def test_omega_depends_on_seed_iteration_and_microbatch_only():
    x = torch.randn(SHAPE)

    def payload(seed, it, mb):
        return get_codec("rsvd", rank=3, seed=seed).encode(x, CodecContext(iteration=it,
                                                                            microbatch=mb))
    a = payload(7, 3, 1)
    assert all(torch.equal(p, q) for p, q in zip(a, payload(7, 3, 1)))
    for other in (payload(8, 3, 1), payload(7, 4, 1), payload(7, 3, 2)):
        assert not torch.equal(a[0], other[0])


def test_state_round_trip_and_seed_check():
    codec = get_codec("rsvd", rank=2, error_feedback=True, seed=714)
    for t in range(2):
        codec.encode(torch.randn(SHAPE), CodecContext(iteration=t))
    sd = codec.state_dict()
    assert sd["seed"] == 714 and set(sd["errors"]) == {"16x2x24"}
    resumed = get_codec("rsvd", rank=2, error_feedback=True, seed=714)
    resumed.load_state_dict(sd)
    x = torch.randn(SHAPE)
    ctx = CodecContext(iteration=2)
    assert all(torch.equal(p, q) for p, q in zip(codec.encode(x, ctx), resumed.encode(x, ctx)))
    with pytest.raises(ValueError, match="--comp-seed 714"):
        get_codec("rsvd", rank=2, seed=1).load_state_dict(sd)


def test_encode_and_decode_without_host_sync():
    codec = get_codec("rsvd", rank=4, error_feedback=True, power_iters=2)
    x = torch.randn(SHAPE)
    with no_host_sync():
        out = codec.decode(codec.encode(x, CodecContext(iteration=1)), SHAPE, torch.float32)
    assert out.shape == SHAPE
