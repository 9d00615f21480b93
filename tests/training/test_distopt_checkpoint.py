"""--use-distributed-optimizer checkpoints: the sharded Adam state is gathered by parameter name,
so resume is bit-exact, the state does not depend on the dp size, the other optimizer reads it
(and the reverse), and tools/checkpoint reshard and export it.

One spawn of 2 ranks (fp32, dropout 0) runs every training job; the comparisons run here:
  ref      dist-opt dp=2, 6 iterations, uninterrupted
  first    dist-opt dp=2 with --overlap-param-gather, saves A at 3 and stops
  resumed  dist-opt dp=2 from A                      -> ref[3:] bit for bit
  plain    without the flag, dp=2 from A             -> ref[3:] to float rounding
  E        without the flag, loads A, re-saves it    -> E's Adam state == A's
  B        A resharded to pp=2 (rank 0, the tool)
  dp1      dist-opt pp=2 dp=1 from B                 -> ref[3:] to float rounding
  C        dist-opt dp=1 loads B, re-saves it        -> C merged == A (dp-size independent)
  D        C resharded back to (1,1)
  back     dist-opt dp=2 from D                      -> ref[3:] bit for bit (dp=1 -> dp=2)
"""
import os

import pytest
import torch

from tests.conftest import tiny_gpt_argv
from tests.distributed import run_distributed
from tests.training import runner

ITERS, SAVE_AT = 6, 3
# Resuming at another dp size, or without the flag, changes only how gradients are reduced
# (reduce-scatter over 2 ranks vs. one rank's sum vs. all-reduce): measured max relative loss
# difference over iterations 4-6 is printed by the test; this bound leaves room for it.
REL_TOL = 1e-5


def _argv(corpus, dist_opt=True, **extra):
    return tiny_gpt_argv(corpus, **{"num-layers": 2, "train-iters": ITERS,
                                    "use-distributed-optimizer": dist_opt, **extra})


def _worker(rank, world, corpus, root):
    import torch.distributed as dist
    from tools.checkpoint.reshard import reshard
    ck = {k: os.path.join(root, k) for k in "ABCDE"}

    def on_rank0(fn):
        if rank == 0:
            fn()
        dist.barrier()

    ref = runner.train(_argv(corpus), world)
    # --overlap-param-gather: at the save, the other rank's slices of the weights are still
    # to be all-gathered (the next forward would); the save completes that first
    first = runner.train(_argv(corpus, save=ck["A"], **{"exit-interval": SAVE_AT,
                                                        "overlap-param-gather": True}), world)
    resumed = runner.train(_argv(corpus, load=ck["A"]), world)
    plain = runner.train(_argv(corpus, dist_opt=False, load=ck["A"]), world)
    runner.train(_argv(corpus, dist_opt=False, load=ck["A"], save=ck["E"],
                       **{"train-iters": SAVE_AT}), world)
    on_rank0(lambda: reshard(ck["A"], ck["B"], tp=1, pp=2))
    pp2 = {"pipeline-model-parallel-size": 2}
    dp1 = runner.train(_argv(corpus, load=ck["B"], **pp2), world)
    runner.train(_argv(corpus, load=ck["B"], save=ck["C"], **pp2, **{"train-iters": SAVE_AT}),
                 world)
    on_rank0(lambda: reshard(ck["C"], ck["D"], tp=1, pp=1))
    back = runner.train(_argv(corpus, load=ck["D"]), world)
    return dict(ref=ref, first=first, resumed=resumed, plain=plain, dp1=dp1, back=back)


@pytest.fixture(scope="module")
def runs(tiny_corpus, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("distopt"))
    return run_distributed(_worker, 2, (tiny_corpus, root), timeout=300)[-1], root


def _full(path):
    from tools.checkpoint.layout import merge, read_checkpoint
    return merge(read_checkpoint(path))


def _assert_same_state(a: dict, b: dict, what: str):
    assert a.keys() == b.keys() and a, what
    for name in a:
        assert a[name].keys() == b[name].keys(), f"{what}: {name}"
        for k, v in a[name].items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(b[name][k])), \
                f"{what}: {name}.{k}"


def _rel(xs, ys):
    return max(abs(x - y) / abs(y) for x, y in zip(xs, ys))


def test_resume_is_bit_exact(runs):
    r, _ = runs
    assert len(r["ref"]) == ITERS and r["first"] == r["ref"][:SAVE_AT]
    assert r["resumed"] == r["ref"][SAVE_AT:], (r["resumed"], r["ref"])
    # saved at dp=1 (C), resumed at dp=2: the same state, the same reductions
    assert r["back"] == r["ref"][SAVE_AT:], (r["back"], r["ref"])


def test_checkpoint_holds_the_whole_state_by_name(runs):
    _, root = runs
    a = _full(os.path.join(root, "A"))
    assert a.optimizer.keys() == a.params.keys()
    for name, s in a.optimizer.items():
        assert set(s) == {"step", "exp_avg", "exp_avg_sq"}, name   # fp32: no main_param
        assert s["exp_avg"].shape == a.params[name].shape, name
        assert float(s["step"]) == SAVE_AT
        assert s["exp_avg_sq"].abs().sum() > 0, f"{name}: a dp rank's slice is missing"
    # loaded at dp=1 and saved again: the same bits (nothing depends on the dp size)
    _assert_same_state(_full(os.path.join(root, "C")).optimizer, a.optimizer, "dp=2 -> dp=1")
    # loaded without the flag and saved again: the same bits
    _assert_same_state(_full(os.path.join(root, "E")).optimizer, a.optimizer, "dist -> plain")


def test_other_dp_size_and_plain_optimizer_continue_the_run(runs):
    r, _ = runs
    ref = r["ref"][SAVE_AT:]
    rel_dp1, rel_plain = _rel(r["dp1"], ref), _rel(r["plain"], ref)
    print(f"max relative loss difference, iterations {SAVE_AT + 1}-{ITERS}: "
          f"dp=2 -> dp=1 (pp=2) {rel_dp1:.3g}, dist-opt -> plain optimizer {rel_plain:.3g}")
    assert len(r["dp1"]) == len(r["plain"]) == ITERS - SAVE_AT
    assert rel_dp1 <= REL_TOL and rel_plain <= REL_TOL


def test_export_reads_a_distributed_optimizer_checkpoint(runs, tmp_path):
    from safetensors.torch import load_file
    from tools.checkpoint import export_hf
    _, root = runs
    out = str(tmp_path / "hf")
    assert export_hf.main(["--load", os.path.join(root, "A"), "--output", out,
                           "--no-progress"]) == 0
    hf = load_file(os.path.join(out, "model.safetensors"))
    wte = _full(os.path.join(root, "A")).params["embedding.word_embeddings.weight"]
    assert torch.equal(hf["transformer.wte.weight"], wte[:hf["transformer.wte.weight"].shape[0]])


def test_old_distributed_optimizer_checkpoint_names_the_flag():
    """Before the gather, such checkpoints held megatron-core's state_dict(): no moments."""
    from megatron.training.checkpointing.save_load import OptimizerState
    old = {"optimizer_by_name": None, "grad_scaler": None,
           "optimizer": {"optimizer": {"param_groups": [{"lr": 1e-3}]}}}
    with pytest.raises(ValueError, match="--no-load-optim"):
        OptimizerState(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0),
                       None).load_state_dict(old)
