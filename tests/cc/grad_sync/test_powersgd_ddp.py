"""PowerSGD on megatron DDP's buffers (pp=1, dp=2): warm-up, what is compressed, bytes, state.

Last, a resume through the real checkpoint continues bit for bit (Q and E are saved).

One 2-rank job on the tiny GPT. After one backward the local gradients are saved, and each
variant of the dp sync runs on a fresh copy of them.
"""
import pytest

from tests.distributed import run_distributed


def _worker(rank, world, corpus, ckpt):
    import io

    import torch
    from megatron.core import parallel_state as ps

    from megatron.cc.data_parallel.powersgd import PowerSGDDataParallelSync
    from megatron.cc.grad_sync.sync import ExactDataParallelSync
    from megatron.cc.data_parallel.powersgd import worth_compressing
    from megatron.cc.common.stats import ChannelStats
    from tests.cc.grad_sync import helpers as h

    t = h.make_trainer(corpus, world, **{"grad-comp": True, "grad-comp-rank": 2,
                                         "grad-comp-warm-up": 0.4, "train-iters": 5})
    model, group, out = t.model, ps.get_data_parallel_group(), {}
    psgd = t.grad_sync.dp
    out["type"], out["warm_up_iters"] = type(psgd).__name__, psgd.warm_up_iters
    h.backward_once(t)
    local_buf, local = h.save_buffers(model), h.named_grads(model)

    ExactDataParallelSync(group, ChannelStats())(model, 0)
    exact = h.named_grads(model)

    h.restore_buffers(model, local_buf)
    t.stats.reset()
    psgd(model, 1)                              # warm-up: megatron's own all-reduce
    out["warm_up_equal"] = all(torch.equal(g, exact[n]) for n, g in h.named_grads(model).items())
    out["warm_up_bytes"] = t.stats.snapshot()["dp"]

    h.restore_buffers(model, local_buf)
    t.stats.reset()
    psgd(model, 2)                              # first compressed step
    comp = h.named_grads(model)
    params = dict(model.named_parameters())
    expected = {n for n, p in params.items()
                if worth_compressing(p.shape, 2) and not getattr(p, "is_embedding_or_output_parameter", False)}
    out["compressed"], out["expected"] = sorted(psgd.errors), sorted(expected)
    out["embedding"] = h.embedding_name(model)
    out["one_d_max_diff"] = h.max_diff(comp, exact, [n for n, p in params.items() if p.dim() == 1])
    out["embedding_diff"] = h.max_diff(comp, exact, [out["embedding"]])
    out["compressed_vs_exact"] = h.max_diff(comp, exact, expected)
    # first step: E = local gradient - shared estimate
    out["error_identity"] = max(float((psgd.errors[n] - (local[n] - comp[n])).abs().max())
                                for n in expected)
    out["replicas_differ"] = max(h.allclose_across(group, g) for g in comp.values())
    out["bytes"] = t.stats.snapshot()["dp"]
    pq = sum((params[n].shape[0] + params[n].numel() // params[n].shape[0]) * 2 * 4
             for n in expected)
    exact_bytes = sum(p.numel() * 4 for n, p in params.items() if n not in expected)
    out["expected_bytes"] = (pq + exact_bytes, sum(p.numel() * 4 for p in params.values()))

    # state: a fresh object loaded from a torch.save round trip continues identically
    blob = io.BytesIO()
    torch.save(psgd.state_dict(), blob)
    blob.seek(0)
    resumed = PowerSGDDataParallelSync(group, ChannelStats(), rank=2, warm_up_iters=2,
                                       seed=t.args.training.seed)
    resumed.load_state_dict(torch.load(blob, weights_only=False))
    h.restore_buffers(model, local_buf)
    psgd(model, 3)
    cont = h.named_grads(model)
    h.restore_buffers(model, local_buf)
    resumed(model, 3)
    res = h.named_grads(model)
    out["resume_equal"] = (all(torch.equal(cont[n], res[n]) for n in cont)
                           and all(torch.equal(psgd.errors[n], resumed.errors[n]) for n in expected)
                           and all(torch.equal(psgd.qs[n], resumed.qs[n]) for n in expected))
    late = PowerSGDDataParallelSync(group, ChannelStats(), rank=2, seed=123)
    h.restore_buffers(model, local_buf)
    late(model, 0)                               # initialised, then loaded
    late.load_state_dict(psgd.state_dict())
    out["late_load_equal"] = all(torch.equal(psgd.qs[n], late.qs[n]) and
                                 torch.equal(psgd.errors[n], late.errors[n]) for n in expected)
    t.close()
    h.teardown()

    # through the real checkpoint: 4 straight iterations == 2 + save + load + 2
    from tests.conftest import tiny_gpt_argv
    from tests.training import runner
    common = {"train-iters": 4, "grad-comp": True, "grad-comp-rank": 2, "grad-comp-warm-up": 0.25}
    out["straight"] = runner.train(tiny_gpt_argv(corpus, **common), world)
    out["first"] = runner.train(tiny_gpt_argv(corpus, **common, save=ckpt,
                                              **{"exit-interval": 2}), world)
    out["resumed"] = runner.train(tiny_gpt_argv(corpus, **common, load=ckpt), world)
    return out


@pytest.fixture(scope="module")
def results(tiny_corpus, tmp_path_factory):
    ckpt = str(tmp_path_factory.mktemp("powersgd_ckpt"))
    return run_distributed(_worker, 2, (tiny_corpus, ckpt), timeout=120)


def test_warm_up_is_the_exact_all_reduce(results):
    for r in results:
        assert r["type"] == "PowerSGDDataParallelSync" and r["warm_up_iters"] == 2
        assert r["warm_up_equal"]
        assert r["warm_up_bytes"]["sent"] == r["warm_up_bytes"]["raw"]


def test_what_is_compressed(results):
    for r in results:
        assert r["compressed"] == r["expected"] and r["compressed"]
        assert r["embedding"] not in r["compressed"]
        assert r["one_d_max_diff"] == 0.0          # 1-D tensors: the exact all-reduce
        assert r["embedding_diff"] == 0.0          # embedding: exact too
        assert r["compressed_vs_exact"] > 0.0      # 2-D weights: rank-2 estimate
        assert r["error_identity"] < 1e-6
        assert r["replicas_differ"] == 0.0         # every replica takes the same step


def test_bytes(results):
    for r in results:
        sent, raw = r["expected_bytes"]
        assert (r["bytes"]["sent"], r["bytes"]["raw"]) == (sent, raw)
        assert sent < raw


def test_state_dict_round_trip(results):
    for r in results:
        assert r["resume_equal"] and r["late_load_equal"]


def test_resume_through_checkpoint_is_exact(results):
    r = results[-1]
    assert len(r["straight"]) == 4 and r["first"] == r["straight"][:2]
    assert r["resumed"] == r["straight"][2:], (r["resumed"], r["straight"])
