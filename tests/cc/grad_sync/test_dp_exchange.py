"""Library-level checks of the parameter-syncing dp modes on plain tensors (4 gloo ranks).

- CocktailSGD at random ratio 1 / top-k 1 / 8 bits == the exact replica mean within the
  bound of its two 8-bit quantisations;
- the sharded exchange's result is bit-identical on every replica (default 0.1/0.2/4 with
  stochastic rounding, so the replicas' generators and payloads differ);
- error buffers telescope: per worker, sum of what it sent + its remaining error == sum of its
  true deltas; per group, sum of the agreed updates + the owners' server errors == the mean of
  what the workers sent;
- the owners' server error weighed by --diloco-error-decay (0: forgotten, 0.5: half, 1: all);
- AD-PSGD's pairwise averaging keeps the replicas' mean (and mixes them);
- preduce's window scheduler: every member of a window sees the same group;
- DiLoCo's outer step == torch.optim.SGD(nesterov=True) on the mean pseudo-gradient, and
  DiLoCo with H = 1, outer lr 1, momentum 0 over plain SGD == synchronous SGD on the averaged
  gradient.
One spawn of 4 ranks computes everything (module fixture); the tests check its results.
"""
import pytest
import torch
import torch.distributed as dist

from tests.distributed import by_value as _np, run_distributed

N = 1000   # not a multiple of 4 x 128: padding of the last shard and of the last bucket


def _t(x):
    if isinstance(x, (tuple, list)):
        return type(x)(_t(v) for v in x)
    if isinstance(x, dict):
        return {k: _t(v) for k, v in x.items()}
    return torch.from_numpy(x) if hasattr(x, "dtype") and not torch.is_tensor(x) else x


def _exchange(kind, error_decay=1.0, **kw):
    from megatron.cc.data_parallel.flat_codecs import make_flat_codec
    from megatron.cc.data_parallel.sharded_exchange import ShardedExchange
    rank = dist.get_rank()
    return ShardedExchange(dist.group.WORLD, make_flat_codec(kind, seed=rank, **kw),
                           make_flat_codec(kind, seed=rank + 100, **kw), error_decay)


def _worker(rank, world):
    out = {}
    gen = torch.Generator().manual_seed(rank)
    # 1. lossless-ish settings against the exact mean
    x = torch.randn(N, generator=gen) * (1 + rank)
    ex = _exchange("cocktail", random_ratio=1.0, topk_ratio=1.0, bits=8)
    ex.worker_codec.seed = ex.server_codec.seed = 0   # the rolling mask must agree
    update, dq, counted = ex(x, step=0)
    mean = x.clone()
    dist.all_reduce(mean)
    mean /= world
    xs = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(xs, x)
    out["exact"] = (update, mean, torch.stack(xs), counted)
    # 2. default settings, stochastic rounding: identical everywhere
    from megatron.cc.data_parallel.flat_codecs import make_flat_codec
    from megatron.cc.data_parallel.sharded_exchange import ShardedExchange
    worker = make_flat_codec("cocktail", seed=0, stochastic=True)
    worker.rng.seed = rank           # different rounding noise per replica (seeded on first use)
    server = make_flat_codec("cocktail", seed=0, stochastic=True)
    server.rng.seed = 50 + rank
    ex = ShardedExchange(dist.group.WORLD, worker, server)
    theta = torch.zeros(N)           # the replica's parameters, starting from the agreed copy
    g = torch.zeros(N)               # the agreed copy
    sum_true = torch.zeros(N, dtype=torch.float64)
    sum_sent = torch.zeros(N, dtype=torch.float64)
    sum_update = torch.zeros(N, dtype=torch.float64)
    updates = []
    for step in range(12):
        true = torch.randn(N, generator=gen)
        theta += true
        sum_true += true.double()
        u, dq, _ = ex(theta - g, step)
        g += u
        theta += u - dq
        sum_sent += dq.double()
        sum_update += u.double()
        updates.append(u)
    sent_all = sum_sent.clone()
    dist.all_reduce(sent_all)
    server_err = torch.zeros(ex.shard_size(N) * world, dtype=torch.float64)
    s = ex.shard_size(N)
    server_err[rank * s:(rank + 1) * s] = ex.server_error[""].double()
    dist.all_reduce(server_err)
    out["telescope"] = (sum_true, sum_sent, (theta - g).double(), sum_update,
                        server_err[:N], sent_all / world)
    out["updates"] = torch.stack(updates)
    out["bytes"] = counted
    out["adpsgd"] = _adpsgd(rank)
    out["windows"] = _windows(rank, world)
    out["diloco"] = _diloco_worker(rank, world)
    out["decay"] = _decay_worker(rank)
    return _np(out)


def _decay_worker(rank):
    """The same vector exchanged twice (deterministic fixpoint-2) under server error decays 0,
    0.5 and 1, and a decay-1 exchange preloaded with half the first round's server error."""
    x = torch.randn(N, generator=torch.Generator().manual_seed(70 + rank))
    out = {}
    for decay in (0.0, 0.5, 1.0):
        ex = _exchange("fixpoint-2", error_decay=decay)
        u1 = ex(x, 0)[0]
        err = ex.server_error[""].clone()
        out[decay] = (u1, ex(x, 1)[0], err)
    ref = _exchange("fixpoint-2")
    ref.server_error[""] = 0.5 * out[0.5][2]
    out["half_by_hand"] = ref(x, 1)[0]
    return out


def _adpsgd(rank):
    """Three rounds of pairwise averaging on rank-dependent weights: (mean before, after)."""
    from megatron.cc.data_parallel.preduce_sync import ADPSGDSync
    from megatron.cc.common.stats import ChannelStats
    lin = torch.nn.Linear(5, 3)
    with torch.no_grad():
        for p in lin.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(rank)))
    before = torch.cat([p.detach().reshape(-1) for p in lin.parameters()])
    sync = ADPSGDSync(dist.group.WORLD, ChannelStats(), seed=3)
    for it in range(3):
        sync.after_optimizer_step(lin, it)
    after = torch.cat([p.detach().reshape(-1) for p in lin.parameters()])
    return before, after


def _windows(rank, world):
    """Each rank joins 6 windows with random delays: (window id, members) per join."""
    import random
    import time
    from megatron.cc.data_parallel.preduce_sync import WindowScheduler
    store = dist.PrefixStore("test_windows/", dist.distributed_c10d._get_default_store())
    from megatron.cc.data_parallel.preduce_sync import _average, _GroupCache
    sched = WindowScheduler(store, world)
    groups = _GroupCache(dist.group.WORLD, store)
    rng = random.Random(rank)
    out = []
    for _ in range(6):
        time.sleep(rng.random() * 0.004)
        k, members = sched.join(rank)
        # average over the group, created on demand by the members only (whose histories of
        # groups differ): each member holds its rank, so the mean is the members' mean
        p = torch.full((3,), float(rank))
        if len(members) > 1:
            _average([p], groups.get(members), len(members))
        out.append((k, members, float(p[0])))
    return out


@pytest.fixture(scope="module")
def results():
    """One spawn of 4 ranks runs every check's distributed part."""
    return _t(run_distributed(_worker, 4, timeout=300))


def test_cocktail_exchange(results):
    res = results
    # 1. ratio 1, top-k 1, 8 bits: two roundings, each <= half a step of its bucket's scale
    update, mean, xs, counted = res[0]["exact"]
    buckets = torch.nn.functional.pad(xs.abs(), (0, 4 * 256 - N)).view(4, -1, 128)
    # worker scale <= max|x_i| of the bucket; the owner's scale <= max|mean| <= the same
    bound = buckets.amax(dim=(0, 2)).repeat_interleave(128)[:N] * (1 / 127) * 1.001
    assert torch.all((update - mean).abs() <= bound + 1e-7)
    assert (update - mean).abs().max() > 0   # it did quantise
    for r in res:
        assert torch.equal(r["exact"][0], update)
    # payload: shard 250 -> 250 codes + 2 scales x 2 B = 254 B per shard and phase (every
    # entry kept: no mask)
    assert counted == (4 * 254 + 4 * 254) // 2
    # 2. bit-identical agreed updates on every replica
    for r in res[1:]:
        assert torch.equal(r["updates"], res[0]["updates"])
    # 3. telescoping (float64 sums of float32 steps)
    for r in res:
        sum_true, sum_sent, err, sum_update, server_err, mean_sent = r["telescope"]
        assert torch.allclose(sum_sent + err, sum_true, atol=1e-4)
        assert torch.allclose(sum_update + server_err, mean_sent, atol=1e-4)
        assert err.abs().max() > 0.1   # lossy: something really was held back


def test_server_error_decay(results):
    """--diloco-error-decay on the owners' side: 0 forgets the server error (the same input
    gives the same update twice), 1 adds all of it (the second update differs), 0.5 adds
    half (equal to a plain exchange handed half the error by hand)."""
    for r in results:
        d = r["decay"]
        assert torch.equal(d[0.0][0], d[0.0][1])
        assert not torch.equal(d[1.0][0], d[1.0][1])
        assert torch.equal(d[0.5][1], r["decay"]["half_by_hand"])
        assert not torch.equal(d[0.5][1], d[1.0][1]) and not torch.equal(d[0.5][1], d[0.0][1])
        assert torch.equal(d[0.5][0], d[1.0][0])   # the first round has no error to weigh


def test_adpsgd_keeps_the_mean(results):
    res = results
    # AD-PSGD: pairwise averaging keeps the replicas' mean and mixes them
    before = torch.stack([r["adpsgd"][0] for r in res]).double()
    after = torch.stack([r["adpsgd"][1] for r in res]).double()
    assert torch.allclose(before.mean(0), after.mean(0), atol=1e-6)
    assert after.std(0).mean() < 0.8 * before.std(0).mean()


def test_preduce_windows_agree_on_members(results):
    res = results
    # preduce scheduler: every member of a window sees the same group, and it contains itself
    seen = {}
    for rank, r in enumerate(res):
        for k, members, value in r["windows"]:
            members = tuple(int(m) for m in members)
            assert rank in members
            assert value == pytest.approx(sum(members) / len(members))
            assert seen.setdefault(int(k), members) == members
    assert sum(len(m) for m in seen.values()) == 4 * 6   # every join in exactly one window


def _diloco_worker(rank, world):
    from megatron.cc.data_parallel.diloco_sync import DiLoCoSync
    from megatron.cc.common.stats import ChannelStats
    torch.manual_seed(0)
    a, b = torch.nn.Linear(6, 3), torch.nn.Linear(6, 3)
    b.load_state_dict(a.state_dict())
    opt_a = torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.5, weight_decay=0.01)
    opt_b = torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.5, weight_decay=0.01)
    sync = DiLoCoSync(dist.group.WORLD, ChannelStats(), inner_steps=1, outer_lr=1.0,
                      outer_momentum=0.0)
    gen = torch.Generator().manual_seed(10 + rank)
    for it in range(5):
        x, y = torch.randn(8, 6, generator=gen), torch.randn(8, 3, generator=gen)
        # a: synchronous data parallel (gradient all-reduce)
        opt_a.zero_grad()
        torch.nn.functional.mse_loss(a(x), y).backward()
        for p in a.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        opt_a.step()
        # b: DiLoCo, H = 1, outer lr 1, momentum 0
        sync(b, it)
        opt_b.zero_grad()
        torch.nn.functional.mse_loss(b(x), y).backward()
        opt_b.step()
        sync.after_optimizer_step(b, it)
    diff = max(float((p - q).abs().max()) for p, q in zip(a.parameters(), b.parameters()))
    # outer Nesterov step against torch's SGD
    outer = DiLoCoSync(dist.group.WORLD, ChannelStats(), inner_steps=2, outer_lr=0.7,
                       outer_momentum=0.9)
    lin = torch.nn.Linear(4, 2)
    for p in lin.parameters():   # same start everywhere
        dist.broadcast(p.data, 0)
    outer(lin, 0)
    ref = [p.detach().clone().requires_grad_() for p in lin.parameters()]
    ref_opt = torch.optim.SGD(ref, lr=0.7, momentum=0.9, nesterov=True)
    for it in range(6):
        with torch.no_grad():
            for p in lin.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)
        if (it + 1) % 2 == 0:
            deltas = [(r - p.detach()) for r, p in zip(ref, lin.parameters())]
            for d in deltas:
                dist.all_reduce(d)
                d /= world
            for r, d in zip(ref, deltas):
                r.grad = d
            ref_opt.step()
        outer.after_optimizer_step(lin, it)
    diff_outer = max(float((p - r).abs().max()) for p, r in zip(lin.parameters(), ref))
    return diff, diff_outer


def test_diloco_h1_equals_sync_sgd_and_outer_step_is_nesterov(results):
    for diff, diff_outer in (r["diloco"] for r in results):
        assert diff < 1e-6, diff
        assert diff_outer < 1e-6, diff_outer
