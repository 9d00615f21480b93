"""Optimus-CC's remaining compression options inside the trainer, at (tp, pp, dp) = (1, 2, 2).

    --emb_grad_comp (+ _type, _rank, _warm_up, --emb_use_error_feedback), --grad_comp_type,
    --grad_comp_niter (ours), --inter_grad_comp_type, --comp_seed, --check_comp_speed

- both spellings parse to the same config; contradictions are refused naming the flag;
- each against the exact path it replaces, 4 iterations:
    --emb-grad-comp at a rank that does not pay == the exact emb sum, bit for bit (plain and
    fused), with the same bytes; at rank 2 its emb bytes are exactly r (V + H) * 4 per member
    and iteration after the warm-up's exact ones;
    --grad-comp-type RandomizedSVD at full rank == the plain all-reduce, bit for bit; at rank 2
    its dp bytes are (1 + niter) r (n + m) * 4 per compressed matrix + the exact tensors';
    --inter-grad-comp-type RandomizedSVD sends the bytes of PowerSGD's CB at the same rank;
    --comp-seed: equal seeds give equal losses, other seeds other losses, no flag = --seed;
    --check-comp-speed: the log line's speeds for pp-bwd, dp and emb;
- resume is bit-exact with each new state (8 straight == 4 + save + load + 4), and the
  checkpoint records --comp-seed.
"""
import glob
import os

import pytest
import torch

from megatron.training.flags.arguments import parse_args
from megatron.training.config.config_flags import ConfigError
from tests.conftest import tiny_gpt_argv
from tests.distributed import run_distributed
from tests.training import runner

PP2 = {"pipeline-model-parallel-size": 2, "train-iters": 4}
V, H = 1024, 32                        # tiny GPT: vocabulary (tp 1) and hidden size
EMB = {"emb-grad-comp": True, "emb-grad-comp-warm-up": 0.0}
SC = {"grad-comp": True, "grad-comp-warm-up": 0.0}
CB = {"inter-grad-comp": True, "inter-grad-comp-rank": 2, "use-error-feedback": True}


# ----------------------------------------------------------------------------- flags

def _config(corpus, flags, world=4):
    return parse_args(tiny_gpt_argv(corpus, **PP2, **flags), world_size=world).compression


def test_both_spellings(tiny_corpus):
    flags = {"emb-grad-comp": True, "emb-grad-comp-type": "PowerSGD", "emb-grad-comp-rank": 8,
             "emb-grad-comp-warm-up": 0.2, "emb-use-error-feedback": True, "grad-comp": True,
             "grad-comp-type": "RandomizedSVD", "grad-comp-niter": 2, "inter-grad-comp": True,
             "inter-grad-comp-type": "RandomizedSVD", "comp-seed": 714, "check-comp-speed": True}
    dash = _config(tiny_corpus, flags)
    under = _config(tiny_corpus, {k.replace("-", "_"): v for k, v in flags.items()})
    assert dash == under
    assert (dash.emb_grad_comp_rank, dash.grad_comp_niter, dash.comp_seed) == (8, 2, 714)
    default = _config(tiny_corpus, {})
    assert (default.emb_grad_comp_rank, default.emb_grad_comp_warm_up, default.comp_seed,
            default.grad_comp_type, default.inter_grad_comp_type) == (4, 0.1, None, "PowerSGD",
                                                                       "PowerSGD")


@pytest.mark.parametrize("flags,needle", [
    ({"emb-grad-comp-rank": 8}, "--emb-grad-comp-rank configures --emb-grad-comp"),
    ({"emb-use-error-feedback": True}, "--emb-use-error-feedback configures --emb-grad-comp"),
    ({"emb-grad-comp-warm-up": 0.5}, "--emb-grad-comp-warm-up configures --emb-grad-comp"),
    ({"emb-grad-comp": True, "emb-grad-comp-rank": 0}, "--emb-grad-comp-rank must be >= 1"),
    ({"emb-grad-comp": True, "emb-grad-comp-warm-up": 1.0}, "--emb-grad-comp-warm-up is a"),
    ({"emb-grad-comp": True, "pipeline-model-parallel-size": 1},
     "--pipeline-model-parallel-size 1"),
    ({"emb-grad-comp": True, "untie-embeddings-and-output-weights": True},
     "--untie-embeddings-and-output-weights"),
    ({"grad-comp-type": "RandomizedSVD"}, "--grad-comp-type configures --grad-comp"),
    ({"grad-comp": True, "grad-comp-niter": 1}, "--grad-comp-niter configures --grad-comp-type"),
    ({"grad-comp": True, "grad-comp-type": "RandomizedSVD", "grad-comp-niter": -1},
     "--grad-comp-niter must be >= 0"),
    ({"grad-comp": True, "grad-comp-type": "RandomizedSVD", "overlap-grad-reduce": True},
     "drop --overlap-grad-reduce"),
    ({"inter-grad-comp-type": "RandomizedSVD"}, "--inter-grad-comp-type configures"),
])
def test_contradictions_are_refused(tiny_corpus, flags, needle):
    flags = {**PP2, **flags}
    with pytest.raises(ConfigError, match=needle.replace("-", r"\-")):
        parse_args(tiny_gpt_argv(tiny_corpus, **flags), world_size=4)


def test_argparse_names_a_bad_type(tiny_corpus, capsys):
    with pytest.raises(SystemExit):
        parse_args(tiny_gpt_argv(tiny_corpus, **PP2, **{"grad-comp": True,
                                                        "grad_comp_type": "TopK"}), world_size=4)
    assert "--grad-comp-type" in capsys.readouterr().err


# ----------------------------------------------------------------------------- runs

RUNS = {
    "exact": {},
    "fe": {"emb-comm-opt": True},
    "emb-full": {**EMB, "emb-grad-comp-rank": H},           # r (V + H) >= V H: exact sum
    "emb-fe-full": {**EMB, "emb-grad-comp-rank": H, "emb-comm-opt": True},
    "emb-low": {"emb-grad-comp": True, "emb-grad-comp-rank": 2, "emb-grad-comp-warm-up": 0.25,
                "emb-use-error-feedback": True},
    "emb-fe-low": {**EMB, "emb-grad-comp-rank": 2, "emb-comm-opt": True},
    "rsvd-full": {**SC, "grad-comp-type": "RandomizedSVD", "grad-comp-rank": 4096},
    "psgd-low": {**SC, "grad-comp-rank": 2},
    "rsvd-low0": {**SC, "grad-comp-type": "RandomizedSVD", "grad-comp-rank": 2,
                  "grad-comp-niter": 0},
    "rsvd-low1": {**SC, "grad-comp-type": "RandomizedSVD", "grad-comp-rank": 2},
    "cb-psgd": CB,
    "cb-rsvd": {**CB, "inter-grad-comp-type": "RandomizedSVD"},
    "seed5": {**SC, "grad-comp-rank": 2, "comp-seed": 5},
    "seed5-again": {**SC, "grad-comp-rank": 2, "comp-seed": 5},
    "seed6": {**SC, "grad-comp-rank": 2, "comp-seed": 6},
    "seed-is-seed": {**SC, "grad-comp-rank": 2, "comp-seed": 1234},   # tiny_gpt_argv's --seed
    # a parameter-syncing dp mode keeps the plain emb sum, which --emb-grad-comp compresses
    "diloco-emb": {"dp-mode": "diloco", "diloco-inner-steps": 2, **EMB, "emb-grad-comp-rank": 2},
    "speed": {**CB, **SC, "grad-comp-type": "RandomizedSVD", "grad-comp-rank": 2,
              "emb-grad-comp": True, "emb-grad-comp-warm-up": 0.0, "check-comp-speed": True},
}

RESUME = {   # 8 iterations; each new piece of state mid-flight at the save after 4
    "emb-ef-fe": {"emb-grad-comp": True, "emb-grad-comp-rank": 2, "emb-use-error-feedback": True,
                  "emb-comm-opt": True, "emb-grad-comp-warm-up": 0.25},
    "rsvd": {"grad-comp": True, "grad-comp-type": "RandomizedSVD", "grad-comp-rank": 2,
             "grad-comp-warm-up": 0.25, "comp-seed": 11},
    "cb-rsvd-lep": {**CB, "inter-grad-comp-type": "RandomizedSVD", "comp-seed": 11},
}


def _totals(trainer):
    import torch.distributed as dist
    from megatron.cc.grad_sync.sync import shared_embedding_weight
    from megatron.cc.common.stats import ChannelStats
    w = shared_embedding_weight(trainer.model)
    trainer.final_embedding = None if w is None else w.detach().numpy().copy()
    layout = getattr(trainer.grad_sync.dp, "_layout", None)
    dp_shapes = None if layout is None else (
        [tuple(M.shape) for _, M in layout[0]], sum(t.numel() for t in layout[1]))
    snapshots = [None] * dist.get_world_size()
    dist.all_gather_object(snapshots, trainer.stats.snapshot())
    return ChannelStats.merge(snapshots), dp_shapes, trainer.final_embedding


def _worker(rank, world, corpus, root):
    import torch.distributed as dist
    out = {}
    for name, flags in RUNS.items():
        out[name] = runner._run(tiny_gpt_argv(corpus, **PP2, **flags), world, _totals)
    for name, flags in RESUME.items():
        common = {"pipeline-model-parallel-size": 2, "train-iters": 8, **flags}
        ckpt = f"{root}/{name}"
        straight = runner.train(tiny_gpt_argv(corpus, **common), world)
        first = runner.train(tiny_gpt_argv(corpus, **common, save=ckpt,
                                           **{"exit-interval": 4}), world)
        dist.barrier()
        resumed = runner.train(tiny_gpt_argv(corpus, **common, load=ckpt), world)
        out[("resume", name)] = (straight, first, resumed)
    return out


@pytest.fixture(scope="module")
def runs(tiny_corpus, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("seed_comp_ckpt"))
    everyone = run_distributed(_worker, 4, (tiny_corpus, root), timeout=1200)
    return everyone, root


def _losses(runs, name):
    return runs[0][-1][name][0]


def _stats(runs, name):
    return runs[0][-1][name][1][0]   # merged over the 4 ranks


def test_emb_grad_comp_where_rank_does_not_pay_is_the_exact_sum(runs):
    for exact, comp in (("exact", "emb-full"), ("fe", "emb-fe-full")):
        assert _losses(runs, comp) == _losses(runs, exact), comp
        assert _stats(runs, comp)["emb"] == _stats(runs, exact)["emb"], comp


def test_emb_grad_comp_bytes(runs):
    members, iters, exact = 4, 4, V * H * 4        # 2 replicas x (first, last)
    low = _stats(runs, "emb-low")["emb"]
    # --emb-grad-comp-warm-up 0.25 of 4 iterations: the first one exact
    assert low["sent"] == members * (exact + (iters - 1) * 2 * (V + H) * 4)
    assert low["raw"] == members * iters * exact and low["messages"] == members * iters
    fe = _stats(runs, "emb-fe-low")["emb"]
    assert fe["sent"] == members * iters * 2 * (V + H) * 4
    assert fe["raw"] == _stats(runs, "fe")["emb"]["raw"] == members * iters * 2 * exact
    for name in ("emb-low", "emb-fe-low"):
        losses = _losses(runs, name)
        assert losses != _losses(runs, "exact") and all(x == x for x in losses)
        assert losses[-1] < losses[0]


def test_randomized_svd_at_full_rank_is_the_all_reduce(runs):
    assert _losses(runs, "rsvd-full") == _losses(runs, "exact")
    assert _stats(runs, "rsvd-full")["dp"] == _stats(runs, "exact")["dp"]


def test_randomized_svd_bytes(runs):
    shapes, exact_numel = runs[0][0]["psgd-low"][1][1]   # one rank's layout (stage 0)
    per_round = sum(2 * (n + m) * 4 for n, m in shapes)
    assert shapes and exact_numel > 0
    for rank in range(2):        # ranks 0 and 1: stage 0 of both replicas, equal layouts
        assert runs[0][rank]["rsvd-low0"][1][1] == (shapes, exact_numel)
    psgd, r0, r1 = (_stats(runs, n)["dp"] for n in ("psgd-low", "rsvd-low0", "rsvd-low1"))
    assert r0["sent"] == psgd["sent"] and r0["raw"] == psgd["raw"]
    # niter 1: one more round of P and Q per compressed step, on each stage's 2 replicas x 4
    # iterations; stage 1's layout differs, so compare the difference on the whole job
    extra = r1["sent"] - r0["sent"]
    stage_rounds = {}
    for r in runs[0]:
        s, e = r["rsvd-low1"][1][1]
        stage_rounds[tuple(s)] = sum(2 * (n + m) * 4 for n, m in s)
    assert extra == 2 * 4 * sum(stage_rounds.values())
    assert stage_rounds[tuple(shapes)] == per_round
    assert all(x == x for x in _losses(runs, "rsvd-low1"))


def test_cb_type_randomized_svd_sends_powersgds_bytes(runs):
    a, b = _stats(runs, "cb-psgd")["pp-bwd"], _stats(runs, "cb-rsvd")["pp-bwd"]
    assert a == b and a["sent"] < a["raw"]
    assert _losses(runs, "cb-rsvd") != _losses(runs, "cb-psgd")
    assert all(x == x for x in _losses(runs, "cb-rsvd"))


def test_comp_seed(runs):
    assert _losses(runs, "seed5") == _losses(runs, "seed5-again")
    assert _losses(runs, "seed5") != _losses(runs, "seed6")
    assert _losses(runs, "seed-is-seed") == _losses(runs, "psgd-low")   # default: --seed


def test_emb_grad_comp_under_a_parameter_syncing_dp_mode(runs):
    emb = _stats(runs, "diloco-emb")["emb"]
    assert emb["sent"] == 4 * 4 * 2 * (V + H) * 4 and emb["raw"] == 4 * 4 * V * H * 4
    losses = _losses(runs, "diloco-emb")
    assert all(x == x for x in losses) and losses[-1] < losses[0]
    # ranks (0, 1): stage 0 of replicas 0 and 1; (2, 3): stage 1. The tied weight's two copies
    # (first and last stage of one replica) take the same compressed step
    first, last = (runs[0][r]["diloco-emb"][1][2] for r in (0, 2))
    assert first is not None and (first == last).all()


def test_start_up_notes(tiny_corpus):
    from megatron.training.flags.seed_flags import seed_notes
    args = parse_args(tiny_gpt_argv(tiny_corpus, **PP2, **RUNS["speed"]), world_size=4)
    notes = " ".join(seed_notes(args))
    assert "RandomizedSVD" in notes and "2 all-reduces" in notes
    assert "--emb-grad-comp: PowerSGD rank 4" in notes and "714" in notes
    args = parse_args(tiny_gpt_argv(tiny_corpus, **PP2, **RUNS["seed5"]), world_size=4)
    assert not any("--comp-seed" in n for n in seed_notes(args))


def test_check_comp_speed_on_the_log_line(runs):
    from megatron.cc.common.stats import ChannelStats
    totals = _stats(runs, "speed")
    for key in ("pp-bwd comp GB/s", "pp-bwd decomp GB/s", "dp comp GB/s", "dp decomp GB/s",
                "emb comp GB/s", "emb decomp GB/s"):
        assert totals[key]["count"] > 0 and totals[key]["sum"] > 0, key
    line = ChannelStats.format(totals, 4)
    assert "pp-bwd comp GB/s: " in line and "emb decomp GB/s: " in line
    assert not any("GB/s" in k for k in _stats(runs, "cb-psgd"))   # flag off: nothing


@pytest.mark.parametrize("name", list(RESUME))
def test_resume_is_bit_exact(runs, name):
    straight, first, resumed = runs[0][-1][("resume", name)]
    assert len(straight) == 8 and first == straight[:4]
    assert resumed == straight[4:], (name, resumed, straight[4:])


def test_checkpoint_records_comp_seed(runs):
    path = glob.glob(os.path.join(runs[1], "rsvd", "iter_0000004", "*", "model_optim_rng.pt"))[0]
    from megatron.training.checkpointing.checkpoint_args import args_dict
    saved = args_dict(torch.load(path, weights_only=False)["args"])
    assert saved["compression"]["comp_seed"] == 11
    ranks = glob.glob(os.path.join(runs[1], "rsvd", "iter_0000004", "rank_state", "*.pt"))
    dp_states = [torch.load(p, weights_only=False)["components"]["grad_sync"]["dp"]
                 for p in ranks]
    assert all(s["seed"] == 11 for s in dp_states) and any(s["errors"] for s in dp_states)
