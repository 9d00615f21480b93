"""FE and SC on 8 ranks (tp2/pp2/dp2 and tp1/pp4/dp2): lossless, exactly once, per TP rank.

Per layout, one backward; then every combination of SC (PowerSGD on stages < k) and FE runs
on a copy of the same local gradients (fresh channel objects, identically seeded Qs):
  * FE's synchronised gradients equal the unfused path's to float rounding, with and without
    SC (the embedding gradient non-zero and identical on every first/last-stage rank of the
    same TP rank);
  * only stages < k hold a PowerSGD dp channel and put fewer bytes on the wire.
Then two short training runs with SC (k=1, 1 exact warm-up step), with and without FE, give
the same losses.
"""
import pytest

from tests.distributed import run_distributed

LAYOUTS = [(2, 2, 1), (1, 4, 3)]   # (tp, pp, k); dp = 8 / (tp pp) = 2
SC_FLAGS = {"grad-comp": True, "grad-comp-rank": 2, "selective-grad-comp": True}


def _grads_after(args, model, stats_cls, local_buf, h, topo):
    from megatron.training.compression.channels import build_grad_sync
    h.restore_buffers(model, local_buf)
    stats = stats_cls()
    sync = build_grad_sync(args, model, stats, topo)
    sync(model, 0)
    return h.named_grads(model), type(sync.dp).__name__, type(sync.emb).__name__, stats.snapshot()


def _layout_worker(rank, world, corpus, tp, pp, k):
    from megatron.core import parallel_state as ps

    from megatron.cc.common.stats import ChannelStats
    from tests.cc.grad_sync import helpers as h
    from tests.training import runner
    from tests.conftest import tiny_gpt_argv

    t = h.make_trainer(corpus, world, tp, pp, **{"train-iters": 4})
    model = t.model
    h.backward_once(t)
    local_buf = h.save_buffers(model)
    emb = h.embedding_name(model)
    out = {"stage": ps.get_pipeline_model_parallel_rank(), "tp_rank": ps.get_tensor_model_parallel_rank(),
           "embedding": emb}
    runs = {}
    for sc in (False, True):
        for fe in (False, True):
            args = h.with_compression(t.args, grad_comp=sc, selective_grad_comp=sc,
                                      selective_grad_comp_way=k if sc else None,
                                      grad_comp_rank=2, grad_comp_warm_up=0.0, emb_comm_opt=fe)
            runs[(sc, fe)] = _grads_after(args, model, ChannelStats, local_buf, h, t.topo)
    for sc in (False, True):
        unfused, fused = runs[(sc, False)][0], runs[(sc, True)][0]
        out[f"fe_diff_sc{int(sc)}"] = h.max_diff(unfused, fused)
        out[f"others_diff_sc{int(sc)}"] = h.max_diff(unfused, fused,
                                                     [n for n in unfused if n != emb])
        out[f"types_sc{int(sc)}"] = runs[(sc, True)][1:3]
        out[f"bytes_sc{int(sc)}"] = {fe: runs[(sc, fe)][3] for fe in (False, True)}
    if emb is not None:
        g = runs[(True, True)][0][emb]
        out["emb_norm"] = float(g.norm())
        out["emb_vs_exact"] = h.max_diff(runs[(False, False)][0], runs[(True, True)][0], [emb])
        out["emb_grad"] = g  # compared across ranks by the test
    t.close()
    h.teardown()

    losses = {}
    for fe in (False, True):
        argv = tiny_gpt_argv(corpus, **{"tensor-model-parallel-size": tp,
                                        "pipeline-model-parallel-size": pp, "train-iters": 4,
                                        **SC_FLAGS, "selective-grad-comp-way": k,
                                        "grad-comp-warm-up": 0.25, "emb-comm-opt": fe})
        losses[fe] = runner.train(argv, world)
    out["losses"] = losses
    return out


def _worker(rank, world, corpus):
    return {(tp, pp, k): _layout_worker(rank, world, corpus, tp, pp, k) for tp, pp, k in LAYOUTS}


@pytest.fixture(scope="module")
def results(tiny_corpus):
    return run_distributed(_worker, 8, (tiny_corpus,), timeout=300)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: "tp%d-pp%d-k%d" % l)
def test_fused_equals_unfused(results, layout):
    tp, pp, k = layout
    for r in results:
        o = r[layout]
        print(layout, o["stage"], {key: o[key] for key in ("fe_diff_sc0", "fe_diff_sc1",
                                                             "others_diff_sc0", "others_diff_sc1")})
        for sc in (0, 1):
            assert o[f"fe_diff_sc{sc}"] <= 1e-6, (layout, o)
            assert o[f"others_diff_sc{sc}"] == 0.0
        if o["stage"] in (0, pp - 1):
            assert o["embedding"] is not None and o["emb_norm"] > 0
            assert o["emb_vs_exact"] <= 1e-6  # SC never touches the embedding gradient
            assert o["types_sc1"][1] == "FusedEmbeddingSync"


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: "tp%d-pp%d-k%d" % l)
def test_embedding_grad_identical_within_tp_rank(results, layout):
    """Every first/last-stage rank of one TP rank (all replicas) holds the same gradient."""
    by_tp = {}
    for r in results:
        o = r[layout]
        if o["embedding"] is not None:
            by_tp.setdefault(o["tp_rank"], []).append(o["emb_grad"])
    tp, pp, _ = layout
    assert sorted(by_tp) == list(range(tp)) and all(len(g) == 4 for g in by_tp.values())
    for grads in by_tp.values():
        for g in grads[1:]:
            assert float((g - grads[0]).abs().max()) == 0.0
    if tp > 1:  # different vocabulary slices
        assert float((by_tp[0][0] - by_tp[1][0]).abs().max()) > 0


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: "tp%d-pp%d-k%d" % l)
def test_only_stages_below_k_compress(results, layout):
    tp, pp, k = layout
    for r in results:
        o = r[layout]
        dp_type = o["types_sc1"][0]
        assert dp_type == ("PowerSGDDataParallelSync" if o["stage"] < k else "ExactDataParallelSync")
        for fe in (False, True):
            b = o["bytes_sc1"][fe]["dp"]
            assert (b["sent"] < b["raw"]) == (o["stage"] < k)
        # FE: the embedding leaves the dp channel and crosses the wire once, not twice
        if o["embedding"] is not None:
            unfused, fused = o["bytes_sc0"][False], o["bytes_sc0"][True]
            assert fused["dp"]["raw"] < unfused["dp"]["raw"]
            assert fused["emb"]["raw"] == 2 * fused["emb"]["sent"]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: "tp%d-pp%d-k%d" % l)
def test_training_losses_with_and_without_fe(results, layout):
    losses = results[-1][layout]["losses"]
    print(layout, losses)
    assert len(losses[False]) == 4 and all(x == x for x in losses[False])
    for a, b in zip(losses[False], losses[True]):
        assert abs(a - b) <= 1e-6 * max(1.0, abs(a)), (a, b)
