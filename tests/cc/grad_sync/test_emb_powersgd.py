"""--emb-grad-comp (embedding/powersgd_sync.py) on a 3-member gloo group, against references.

Each member holds its own embedding-gradient matrix per step; the channel must deliver the
group's sum. Compared, per step, with a one-process reference (PowerSGD of the sum with
torch.linalg.qr, the same initial Q from the seed, warm start, and each member's error):
  * the compressed sum == reference to float rounding, identical bits on every member (both
    copies of the tied weight take the same step);
  * a sum of rank below r comes out exact (the all-reduce's result);
  * error feedback loses nothing: sum_t S_hat_t + sum_i E_i == sum_t S_t; the seed's rule
    (E_i = M_i - S_hat) measured against it: at a rank where every step is exact it
    delivers S_2 - (k - 1) S_1 at the second step;
  * through the channel's entry (a stand-in model): warm-up and a rank that does not pay run
    the exact sum bit for bit with its bytes; compressed bytes are r (n + m) * 4 exactly;
  * --comp-seed picks the initial Q; resume through state_dict is bit-exact, another seed is
    refused.
The trainer-level runs (plain and fused groups, pp 2 x dp 2) are in
tests/training/test_seed_compression_options.py.
"""
import pytest
import torch

from tests.distributed import run_distributed

N, M_, R, SEED, STEPS, WORLD = 48, 20, 3, 714, 4, 3


def _grad(step, member, low_rank=False):
    """Rank 1 per member with a row direction fixed per member (the sum's row space stays
    put, so the warm-started Q keeps spanning it), plus noise unless low_rank."""
    row = torch.randn(1, M_, generator=torch.Generator().manual_seed(77 + member))
    g = torch.Generator().manual_seed(1000 * step + member)
    base = torch.randn(N, 1, generator=g) @ row
    return base if low_rank else base + 0.5 * torch.randn(N, M_, generator=g)


def _reference(error_feedback, low_rank=False, seed=SEED):
    """Per step: (S_hat, S, errors per member)."""
    q = torch.randn(M_, R, generator=torch.Generator().manual_seed(seed))
    errors = [torch.zeros(N, M_) for _ in range(WORLD)]
    out = []
    for step in range(STEPS):
        Ms = [_grad(step, i, low_rank) + (errors[i] if error_feedback else 0) for i in range(WORLD)]
        S = sum(Ms)
        P = torch.linalg.qr(S @ torch.linalg.qr(q).Q).Q
        q = S.t() @ P
        S_hat = P @ q.t()
        if error_feedback:
            errors = [Mi - S_hat / WORLD for Mi in Ms]
        out.append((S_hat, sum(_grad(step, i, low_rank) for i in range(WORLD)),
                    [e.clone() for e in errors]))
    return out


class _Model:
    """What the channel asks of a model: the tied weight on a first/last stage."""
    share_embeddings_and_output_weights, pre_process = True, True

    def __init__(self, grad):
        self.w = torch.nn.Parameter(torch.zeros_like(grad))
        self.w.main_grad = grad

    def shared_embedding_or_output_weight(self):
        return self.w


def _np(t):
    return t.detach().numpy().copy()   # tensors do not survive the trip back from a spawned rank


def _worker(rank, world):
    import torch.distributed as dist

    from megatron.cc.embedding.powersgd_sync import EmbPowerSGDSync
    from megatron.cc.grad_sync.sync import EmbeddingSync
    from megatron.cc.common.stats import ChannelStats

    def make(ef=False, seed=SEED, rank_=R, warm_up=0, stats=None):
        stats = stats or ChannelStats()
        return EmbPowerSGDSync(EmbeddingSync(dist.group.WORLD, stats), stats, rank=rank_,
                               warm_up_iters=warm_up, error_feedback=ef, seed=seed)

    def run(sync, steps, low_rank=False):
        outs = []
        for step in steps:
            M = _grad(step, rank, low_rank)
            sent = sync.reduce(M)
            err = sync.error
            outs.append((_np(M), None if err is None else _np(err), sent))
        return outs

    class SeedRule(EmbPowerSGDSync):
        """Optimus-CC's EmbPowerSGDReducer error: E_i = M_i - S_hat (the whole estimate)."""
        def reduce(self, M):
            sent = super().reduce(M)
            self.error.sub_(M, alpha=1.0 - 1.0 / self.world)
            return sent

    out = {}
    for ef in (False, True):
        out[("run", ef)] = run(make(ef), range(STEPS))
    out["low"] = run(make(True), range(STEPS), low_rank=True)
    stats = ChannelStats()
    out["seed_rule"] = run(SeedRule(EmbeddingSync(dist.group.WORLD, stats), stats, rank=R,
                                    error_feedback=True, seed=SEED), range(2), low_rank=True)
    out["seed_other"] = run(make(seed=SEED + 1), [0])[0][0]
    first = make(True)
    run(first, range(2))
    resumed = make(True)
    resumed.load_state_dict(first.state_dict())
    out["resume"] = (run(first, [2])[0][:2], run(resumed, [2])[0][:2])
    try:
        make(True, seed=1).load_state_dict(first.state_dict())
    except ValueError as e:
        out["seed_refused"] = str(e)
    # through __call__: warm-up (exact), a rank that does not pay (exact), compressed
    entry = {}
    for name, kw, it in (("warm_up", dict(warm_up=2), 1), ("full", dict(rank_=M_), 0),
                         ("compressed", dict(warm_up=2), 2)):
        stats = ChannelStats()
        grad = _grad(0, rank)
        make(stats=stats, **kw)(_Model(grad), it)
        entry[name] = (_np(grad), stats.snapshot()["emb"])
    out["entry"] = entry
    return out


@pytest.fixture(scope="module")
def results():
    return run_distributed(_worker, WORLD, (), timeout=300)


def _close(a, b, tol=1e-5):
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    return float((a - b).abs().max()) <= tol * max(1.0, float(b.abs().max()))


@pytest.mark.parametrize("ef", [False, True])
def test_equals_powersgd_of_the_sum(results, ef):
    ref = _reference(ef)
    for step, (S_hat, S, errors) in enumerate(ref):
        outs = [r[("run", ef)][step] for r in results]
        for i, (M, err, sent) in enumerate(outs):
            assert _close(M, S_hat), (ef, step, i)
            assert (M == outs[0][0]).all()     # every member: the same bits
            assert sent == R * (N + M_) * 4
            if ef:
                assert _close(err, errors[i]), (step, i)
        assert float((S_hat - S).norm() / S.norm()) > 0.05   # rank 3 of noise: really lossy


def test_below_rank_r_the_sum_is_exact(results):
    for step in range(STEPS):
        S = sum(_grad(step, i, True) for i in range(WORLD))   # rank <= 3 = r
        for r in results:
            assert _close(r["low"][step][0], S), step


def test_error_feedback_loses_nothing(results):
    delivered = sum(torch.as_tensor(results[0][("run", True)][t][0]) for t in range(STEPS))
    given = sum(_grad(t, i) for t in range(STEPS) for i in range(WORLD))
    pending = sum(torch.as_tensor(r[("run", True)][-1][1]) for r in results)
    assert _close(delivered + pending, given, 1e-4)


def test_the_seeds_error_rule_subtracts_the_previous_sum(results):
    S1, S2 = (sum(_grad(t, i, True) for i in range(WORLD)) for t in range(2))
    seed_second = torch.as_tensor(results[0]["seed_rule"][1][0])
    ours_second = torch.as_tensor(results[0]["low"][1][0])
    assert _close(ours_second, S2)
    assert _close(seed_second, S2 - (WORLD - 1) * S1, 1e-4)
    print("seed rule relative error at step 2:",
          float((seed_second - S2).norm() / S2.norm()))


def test_comp_seed_picks_the_initial_q(results):
    for r in results:
        assert not (r["seed_other"] == r[("run", False)][0][0]).all()


def test_resume_is_bit_exact_and_keeps_the_seed(results):
    for r in results:
        (g1, e1), (g2, e2) = r["resume"]
        assert (g1 == g2).all() and (e1 == e2).all()
        assert "--comp-seed 714" in r["seed_refused"]


def test_entry_runs_the_exact_sum_where_it_should(results):
    S = sum(_grad(0, i) for i in range(WORLD))
    exact_bytes = N * M_ * 4
    for r in results:
        e = r["entry"]
        for name in ("warm_up", "full"):
            grad, b = e[name]
            assert _close(grad, S, 1e-6)
            assert (b["sent"], b["raw"], b["messages"]) == (exact_bytes, exact_bytes, 1)
        grad, b = e["compressed"]
        assert (b["sent"], b["raw"]) == (R * (N + M_) * 4, exact_bytes)
        assert not _close(grad, S, 1e-3)

