"""DiLoCo's low-rank exchange (--diloco-compression powersgd-<r>) on plain tensors (4 gloo
ranks, one spawn for every check).

- full rank (r >= min(n, m), every matrix forced through PowerSGD) gives exact DiLoCo's
  parameters to float rounding; rank 2 does not (the check can fail);
- error feedback: per compressed matrix, decoded + new residual == input + old residual,
  the decoded mean is bit-identical on every replica, vectors are the exact mean;
- bytes: what the exchange counts == lowrank_exchange.sync_bytes;
- state_dict / load_state_dict resume a streaming, delayed run bit-exactly (Qs, residuals).
"""
import pytest
import torch
import torch.distributed as dist

from tests.cc.grad_sync.inner_steps import drive, final_after_resume
from tests.distributed import by_value as _np, run_distributed

SHAPES = [(50, 60), (50,), (80, 50), (80,), (3, 4, 5)]   # wide, tall, vectors, a 3-D tensor


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(60, 50), torch.nn.Linear(50, 80))
    for p in model.parameters():
        dist.broadcast(p.data, 0)
    return model


def _final(make, seed, iters=12):
    from megatron.cc.grad_sync.param_sync import flatten
    model, sync = _model(), make()
    drive(sync, model, torch.Generator().manual_seed(seed), iters)
    sync.flush(model)
    return flatten(list(model.parameters()))


def _worker(rank, world):
    from megatron.cc.data_parallel.diloco_sync import DiLoCoSync
    from megatron.cc.data_parallel.lowrank_exchange import PowerSGDExchange, sync_bytes
    from megatron.cc.common.stats import ChannelStats
    group, out = dist.group.WORLD, {}
    every_matrix = lambda shape: len(shape) == 2   # noqa: E731 (full rank would not pay)

    def diloco(exchange=None, **kw):
        return lambda: DiLoCoSync(group, ChannelStats(), inner_steps=3, outer_lr=0.7,
                                  outer_momentum=0.9, exchange=exchange() if exchange else None,
                                  **kw)
    # 1. full rank == exact DiLoCo; rank 2 is not
    out["exact"] = _final(diloco(), 100 + rank)
    out["full"] = _final(diloco(lambda: PowerSGDExchange(group, 50, compress=every_matrix)),
                         100 + rank)
    out["rank2"] = _final(diloco(lambda: PowerSGDExchange(group, 2, compress=every_matrix)),
                          100 + rank)
    # 2. error feedback and bytes, two calls on the exchange itself
    ex = PowerSGDExchange(group, 3)
    gen = torch.Generator().manual_seed(rank)
    n = sum(torch.Size(s).numel() for s in SHAPES)
    calls = []
    for step in range(2):
        x = torch.randn(n, generator=gen) * (1 + rank)
        e_old = {k: v.clone() for k, v in ex.engines["0"].errors.items()} if step else {}
        mean, dq, counted = ex(x.clone(), step, key="0", shapes=SHAPES)
        e_new = {k: v.clone() for k, v in ex.engines["0"].errors.items()}
        xs = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(xs, x)
        calls.append((x, mean.clone(), dq, counted, e_old, e_new, torch.stack(xs).mean(0)))
    out["feedback"] = (calls, sync_bytes(SHAPES, 3))
    # 3. resume: 6 (or 5) iterations, state_dict -> a fresh sync -> the rest == 12 straight;
    # H 4, F 2, delay 1: at 6 fragment 1's reduce is in flight, at 5 nothing is
    make = lambda: DiLoCoSync(group, ChannelStats(), inner_steps=4, fragments=2,   # noqa: E731
                              sync_delay=1, exchange=PowerSGDExchange(group, 2, seed=7))

    def run(split):
        return final_after_resume(make, _model(), torch.Generator().manual_seed(200 + rank),
                                  split)
    out["resume"] = (run(12), run(6), run(5))
    return _np(out)


@pytest.fixture(scope="module")
def results():
    return run_distributed(_worker, 4, timeout=300)


def test_full_rank_is_exact_diloco(results):
    import numpy as np
    for r in results:
        np.testing.assert_allclose(r["full"], r["exact"], rtol=0, atol=2e-5)
        assert np.abs(r["rank2"] - r["exact"]).max() > 1e-3   # low rank does compress


def _split(flat):
    out, off = [], 0
    for s in SHAPES:
        n = int(torch.Size(s).numel())
        out.append(flat[off:off + n])
        off += n
    return out


def test_error_feedback_and_bytes(results):
    import numpy as np
    from megatron.cc.data_parallel.powersgd import worth_compressing
    (calls, formula) = results[0]["feedback"]
    assert formula == 4 * 3 * (110 + 130) + 4 * (50 + 80 + 60)   # (3, 4, 5): 3 (3 + 20) > 60
    for step in range(2):
        for r in results:
            x, mean, dq, counted, e_old, e_new, x_mean = r["feedback"][0][step]
            assert dq is None and counted == formula
            np.testing.assert_array_equal(mean, results[0]["feedback"][0][step][1])
            parts = zip(SHAPES, _split(x), _split(mean), _split(x_mean))
            for i, (shape, xi, decoded, exact_mean) in enumerate(parts):
                if not worth_compressing(shape, 3):   # sent exactly, no residual
                    assert str(i) not in e_new
                    np.testing.assert_allclose(decoded, exact_mean, rtol=0, atol=1e-5)
                    continue
                old = e_old.get(str(i), np.zeros(shape)).reshape(-1)
                new = e_new[str(i)].reshape(-1)
                np.testing.assert_allclose(decoded + new, xi + old, rtol=0, atol=1e-5)
                assert np.abs(new).max() > 1e-3   # rank 3 of a random matrix: a residual


def test_resume_is_bit_exact(results):
    import numpy as np
    for r in results:
        straight, at6, at5 = r["resume"]
        np.testing.assert_array_equal(at6, straight)   # a reduce in flight at the save
        np.testing.assert_array_equal(at5, straight)
