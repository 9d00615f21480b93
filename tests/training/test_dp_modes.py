"""The dp modes inside the trainer: equivalences with all-reduce, resume, bad flags.

- DiLoCo with H = 1, outer lr 1, momentum 0 and preduce with --ssp-bound 1, both over plain
  SGD, train exactly like gradient all-reduce (parameter averaging after one linear step ==
  stepping with the averaged gradient), to float rounding;
- resume is bit-exact at (tp, pp, dp) = (1, 2, 2) with each mode on (8 straight iterations of
  losses == 4 + save + load + 4), with every piece of mode state in the checkpoint: the
  CocktailSGD exchange in flight at the save, its server errors and stochastic-rounding
  generators, DiLoCo's global copy / momentum / residuals mid-period with streaming fragments,
  low-rank DiLoCo's Qs and residuals,
  SparseLoCo's error buffers, rounding generators and an exchange in flight.
  preduce runs at --ssp-bound 1 here: its partial groups depend on arrival timing, so no two
  runs with partial groups are reproducible, interrupted or not.
"""
import pytest

from megatron.training.flags.arguments import parse_args
from megatron.training.config.config_flags import ConfigError
from tests.conftest import tiny_gpt_argv
from tests.distributed import run_distributed
from tests.training import runner

SGD = {"optimizer": "sgd", "sgd-momentum": 0.5, "lr": 0.05, "clip-grad": 0.0}


def _final_params(trainer):
    return [p.detach().reshape(-1).numpy().copy() for p in trainer.model.parameters()]


def _equiv_worker(rank, world, corpus):
    def run(**flags):
        return runner._run(tiny_gpt_argv(corpus, **SGD, **flags), world, _final_params)
    ref = run()
    diloco = run(**{"dp-mode": "diloco", "diloco-inner-steps": 1, "diloco-outer-lr": 1.0,
                    "diloco-outer-momentum": 0.0})
    preduce = run(**{"dp-mode": "preduce", "ssp-bound": 1})
    return ref, diloco, preduce


def test_diloco_h1_and_preduce_ssp1_equal_allreduce(tiny_corpus):
    import numpy as np
    (ref, ref_w), (diloco, diloco_w), (_, preduce_w) = run_distributed(
        _equiv_worker, 2, (tiny_corpus,), timeout=600)[-1]
    assert ref[-1] < ref[0]
    assert diloco == pytest.approx(ref, rel=1e-5, abs=1e-5)
    # weights after 5 steps (preduce logs each replica's own loss, so compare the weights)
    for w in (diloco_w, preduce_w):
        for a, b in zip(ref_w, w):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


MODES = {
    "cocktail": {"dp-mode": "cocktail_sgd", "cocktail-warmup-steps": 2,
                 "stochastic-rounding": True, "cocktail-random-ratio": 0.5},
    "diloco": {"dp-mode": "diloco", "diloco-inner-steps": 4, "diloco-fragments": 2,
               "diloco-compression": "int8"},
    # a reduce in flight at the save (fragment 1 starts after step 4, applied after step 6)
    "diloco-delay": {"dp-mode": "diloco", "diloco-inner-steps": 8, "diloco-fragments": 2,
                     "diloco-sync-delay": 2, "diloco-outer-momentum": 0.5},
    # low rank: the reduce of step 4 in flight at the save (applied after step 5); the Qs and
    # residuals it leaves are used at step 6, whose update (after step 7) moves step 8's loss
    "diloco-powersgd": {"dp-mode": "diloco", "diloco-inner-steps": 2, "diloco-sync-delay": 1,
                        "diloco-compression": "powersgd-2"},
    # SparseLoCo: error buffers of two fragments, a stochastic-rounding generator and an
    # exchange in flight at the save (fragment 0 syncs after step 4, applied after step 5)
    "sparseloco": {"dp-mode": "sparseloco", "diloco-inner-steps": 4, "diloco-fragments": 2,
                   "diloco-sync-delay": 1, "sparseloco-chunk-size": 256,
                   "sparseloco-density": 0.125, "stochastic-rounding": True},
    "preduce": {"dp-mode": "preduce", "ssp-bound": 1},
    # with the replica Adam correction: its state is AdamW's, saved and loaded by name
    "adpsgd": {"dp-mode": "adpsgd", "dp-adam-correction": True},
}


def _resume_worker(rank, world, corpus, root):
    import torch.distributed as dist
    out = {}
    for name, flags in MODES.items():
        common = {"pipeline-model-parallel-size": 2, "train-iters": 8, **flags}
        ckpt = f"{root}/{name}"
        straight = runner.train(tiny_gpt_argv(corpus, **common), world)
        first = runner.train(tiny_gpt_argv(corpus, **common, save=ckpt,
                                           **{"exit-interval": 4}), world)
        dist.barrier()
        resumed = runner.train(tiny_gpt_argv(corpus, **common, load=ckpt), world)
        out[name] = (straight, first, resumed)
    out["composed"] = runner._run(tiny_gpt_argv(corpus, **COMPOSED), world, _embedding)
    return out


# CocktailSGD with every other channel compressed: fixpoint fwd, CB + LEP bwd, FE flag
COMPOSED = {"pipeline-model-parallel-size": 2, "dp-mode": "cocktail_sgd",
            "forward-compress-method": "fixpoint", "inter-grad-comp": True,
            "inter-grad-comp-rank": 2, "use-error-feedback": True, "emb-comm-opt": True}


def _embedding(trainer):
    from megatron.core import parallel_state as ps
    from megatron.cc.grad_sync.sync import shared_embedding_weight
    w = shared_embedding_weight(trainer.model)
    return (ps.get_pipeline_model_parallel_rank(), ps.get_data_parallel_rank(),
            None if w is None else w.detach().numpy().copy())


def test_resume_bit_exact_with_each_dp_mode(tiny_corpus, tmp_path):
    import numpy as np
    everyone = run_distributed(_resume_worker, 4, (tiny_corpus, str(tmp_path)), timeout=900)
    res = everyone[-1]
    for name in MODES:
        straight, first, resumed = res[name]
        assert len(straight) == 8 and first == straight[:4], name
        assert resumed == straight[4:], (name, resumed, straight[4:])
    # composed run: it learns, and the tied embedding's two copies (first and last stage of a
    # replica) stay bit-identical although each stage runs its own compressed exchange
    losses, _ = res["composed"]
    assert losses[-1] < losses[0]
    emb = {(st, d): w for _, (st, d, w) in (r["composed"] for r in everyone)}
    for d in range(2):
        np.testing.assert_array_equal(emb[(0, d)], emb[(1, d)])
    assert not np.array_equal(emb[(0, 0)], emb[(0, 1)])   # replicas differ (worker error)


@pytest.mark.parametrize("flags,world,needle", [
    ({"dp-mode": "cocktail_sgd", "grad-comp": True}, 2, "--grad-comp"),
    ({"dp-mode": "cocktail", "cocktail-topk-ratio": 1.5}, 2, "--cocktail-topk-ratio"),
    ({"dp-mode": "cocktail", "cocktail-random-ratio": 0.0}, 2, "--cocktail-random-ratio"),
    ({"dp-mode": "cocktail", "cocktail-bits": 9}, 2, "--cocktail-bits"),
    ({"dp-mode": "diloco", "diloco-inner-steps": 0}, 2, "--diloco-inner-steps"),
    ({"dp-mode": "diloco", "diloco-inner-steps": 10, "diloco-fragments": 3}, 2,
     "--diloco-fragments"),
    ({"dp-mode": "diloco", "diloco-compression": "int3"}, 2, "--diloco-compression"),
    ({"dp-mode": "diloco", "diloco-compression": "powersgd-0"}, 2,
     "--diloco-compression 'powersgd-0': expected powersgd-<rank>"),
    ({"dp-mode": "diloco", "diloco-compression": "powersgd-x"}, 2,
     "--diloco-compression 'powersgd-x': expected powersgd-<rank>"),
    ({"dp-mode": "diloco", "diloco-compression": "powersgd"}, 2,
     "--diloco-compression 'powersgd': expected powersgd-<rank>"),
    ({"dp-mode": "diloco", "diloco-inner-steps": 4, "diloco-fragments": 2,
      "diloco-sync-delay": 2}, 2, "--diloco-sync-delay"),
    ({"dp-mode": "diloco", "diloco-outer-momentum": 1.0}, 2, "--diloco-outer-momentum"),
    ({"dp-mode": "diloco", "diloco-compression": "int8", "diloco-error-decay": 1.5}, 2,
     "--diloco-error-decay must be in"),
    ({"dp-mode": "diloco", "diloco-sync-steps": "10,x"}, 2,
     "--diloco-sync-steps '10,x': give inner steps as integers"),
    ({"dp-mode": "diloco", "diloco-sync-steps": "10,10,20"}, 2, "strictly increasing"),
    ({"dp-mode": "sparseloco", "diloco-sync-steps": "0,10"}, 2, "must be >= 1"),
    ({"dp-mode": "diloco", "diloco-inner-steps": 10, "diloco-fragments": 2,
      "diloco-sync-steps": "10,30"}, 2, "--diloco-sync-steps schedules one fragment"),
    ({"dp-mode": "diloco", "diloco-inner-steps": 10, "diloco-sync-delay": 3,
      "diloco-sync-steps": "5,8,20"}, 2, "shortest window of --diloco-sync-steps"),
    ({"dp-mode": "diloco", "diloco-sync-steps": "lr0:4"}, 2, "give lr<p>:<K> with p > 0"),
    ({"dp-mode": "diloco", "diloco-final-compression": "int3"}, 2,
     "--diloco-final-compression 'int3': expected none"),
    ({"dp-mode": "diloco", "diloco-compression": "powersgd-4",
      "diloco-final-compression": "none"}, 2, "with a flat --diloco-compression"),
    ({"dp-mode": "diloco", "diloco-inner-steps": 3, "diloco-final-compression": "int8"}, 2,
     "none falls after --train-iters 5"),
    ({"dp-mode": "diloco", "diloco-inner-steps": 3, "diloco-final-average": True}, 2,
     "--diloco-final-average is the outer step of the sync after the last iteration, but none"),
    ({"dp-mode": "diloco", "diloco-sync-steps": "lr2:6"}, 2, "1 <= K <= --train-iters"),
    ({"dp-mode": "diloco", "diloco-capture-dir": "pyproject.toml"}, 2,
     "--diloco-capture-dir pyproject.toml is a file"),
    ({"dp-mode": "diloco", "diloco-error-decay": 0.5}, 2,
     "--diloco-compression none keeps none of its own: drop the flag"),
    ({"dp-mode": "diloco", "diloco-compression": "powersgd-4", "diloco-error-decay": 0.0}, 2,
     "--diloco-compression powersgd-4 keeps none of its own"),
    ({"dp-mode": "diloco", "diloco-compression": "fp16", "diloco-residual-in-model": True}, 2,
     "it needs --diloco-compression int8, fixpoint-<bits> or cocktail \\(got fp16"),
    ({"dp-mode": "sparseloco", "diloco-residual-in-model": True}, 2,
     "--diloco-residual-in-model configures --dp-mode diloco"),
    ({"dp-mode": "sparseloco", "sparseloco-density": 0.0}, 2, "--sparseloco-density"),
    ({"dp-mode": "sparseloco", "sparseloco-density": 1.5}, 2, "--sparseloco-density"),
    ({"dp-mode": "sparseloco", "sparseloco-chunk-size": 0}, 2, "--sparseloco-chunk-size"),
    ({"dp-mode": "sparseloco", "sparseloco-bits": 9}, 2, "--sparseloco-bits"),
    ({"dp-mode": "sparseloco", "sparseloco-error-decay": 1.5}, 2, "--sparseloco-error-decay"),
    ({"dp-mode": "sparseloco", "sparseloco-outer-lr": 0.0}, 2, "--sparseloco-outer-lr"),
    ({"dp-mode": "sparseloco", "sparseloco-outer-momentum": 1.0}, 2,
     "--sparseloco-outer-momentum"),
    ({"dp-mode": "sparseloco", "diloco-inner-steps": 4, "diloco-fragments": 3}, 2,
     "--diloco-fragments"),
    ({"dp-mode": "sparseloco", "diloco-outer-momentum": 0.5}, 2,
     "--diloco-outer-momentum configures --dp-mode diloco"),
    ({"dp-mode": "diloco", "sparseloco-bits": 4}, 2,
     "--sparseloco-bits configures --dp-mode sparseloco"),
    ({"dp-mode": "sparseloco"}, 1, "data-parallel size is 1"),
    ({"dp-mode": "preduce"}, 1, "data-parallel size is 1"),
    ({"dp-mode": "preduce", "ssp-bound": 0}, 2, "--ssp-bound"),
    ({"dp-mode": "adpsgd", "hetero": 1.0}, 2, "--hetero"),
    ({"diloco-inner-steps": 5}, 2, "--diloco-inner-steps configures --dp-mode diloco"),
    ({"dp-mode": "preduce", "cocktail-topk-ratio": 0.5}, 2, "--cocktail-topk-ratio"),
    ({"dp-mode": "preduce", "dp-backend": "gloo"}, 2, "--dp-backend"),
    ({"preduce-scope": "replica"}, 2, "--preduce-scope configures --dp-mode preduce"),
    ({"dp-mode": "adpsgd", "preduce-groups": "pairwise"}, 2, "--preduce-groups configures"),
    ({"dp-adam-correction": True}, 2, "--dp-adam-correction corrects the local Adam"),
    ({"dp-mode": "diloco", "dp-adam-correction": True, "optimizer": "sgd"}, 2,
     "--dp-adam-correction corrects Adam"),
])
def test_bad_dp_mode_flags_are_rejected(tiny_corpus, flags, world, needle):
    with pytest.raises(ConfigError, match=needle.replace("-", r"\-")):
        parse_args(tiny_gpt_argv(tiny_corpus, **flags), world_size=world)


@pytest.mark.parametrize("schedule,want", [
    ({"lr-decay-style": "constant"}, "75,150,225,300"),        # a constant rate: every H
    ({"lr-decay-style": "cosine", "min-lr": 1e-4, "lr-warmup-fraction": 0.0667},
     "44,77,120,300"),                                         # bench_dp_modes' SYNC_Q4
])
def test_sync_rule_follows_the_learning_rate(tiny_corpus, schedule, want):
    """--diloco-sync-steps lr2:4 becomes the steps of four windows of equal sum of lr^2 under
    the run's own schedule (megatron-core's scheduler), before any check sees the flag."""
    flags = {"dp-mode": "diloco", "diloco-sync-steps": "lr2:4", "train-iters": 300,
             "global-batch-size": 8, "micro-batch-size": 1, **schedule}
    args = parse_args(tiny_gpt_argv(tiny_corpus, **flags), world_size=2)
    assert args.compression.diloco_sync_steps == want


def test_sync_rule_windows():
    """Equal sums of lr^p; a window per step where the budget runs out; rule syntax."""
    from megatron.cc.data_parallel.sync_schedule import equal_lr_windows, parse_rule
    assert equal_lr_windows([1.0] * 12, 2, 4) == (3, 6, 9, 12)
    assert equal_lr_windows([4.0, 1.0, 1.0, 1.0, 1.0], 1, 2) == (1, 5)  # half the sum at once
    assert equal_lr_windows([1.0, 0.0, 0.0, 0.0], 2, 4) == (1, 2, 3, 4)  # one step each
    steps = equal_lr_windows([1 / (1 + i / 10) for i in range(100)], 2, 5)   # a decaying rate
    lens = [b - a for a, b in zip((0,) + steps, steps)]
    assert steps[-1] == 100 and lens == sorted(lens) and lens[0] < lens[-1] / 4
    assert parse_rule("lr2:6") == (2.0, 6) and parse_rule("lr1.5:3") == (1.5, 3)
    assert parse_rule("33,54") is None and parse_rule("lr2") is None
    with pytest.raises(ValueError):
        equal_lr_windows([1.0] * 3, 2, 4)


def test_unresolved_sync_rule_is_refused():
    """CompressionConfig alone cannot know the schedule: it says where the rule is resolved."""
    from megatron.cc.config import CompressionConfig
    c = CompressionConfig(dp_mode="diloco", diloco_sync_steps="lr2:6")
    with pytest.raises(ConfigError, match="parse_args"):
        c.validate(pp=1, dp=2, tp=1)


def _replica_average_worker(rank, world, corpus):
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.cc.grad_sync.param_sync import replica_average

    def check_average(trainer):
        """Inside the block: the mean of the replicas' weights; after it: our own, bit for bit."""
        group = ps.get_data_parallel_group()
        own = [p.detach().clone() for p in trainer.model.parameters()]
        gathered = []
        for p in own:
            parts = [torch.empty_like(p) for _ in range(dist.get_world_size(group))]
            dist.all_gather(parts, p, group=group)
            gathered.append(torch.stack(parts))
        with replica_average(trainer.model, group):
            inside = [(p.detach() - g.mean(0)).abs().max().item()
                      for p, g in zip(trainer.model.parameters(), gathered)]
        after = all(torch.equal(p, o) for p, o in zip(trainer.model.parameters(), own))
        differ = any(not torch.equal(g[0], g[1]) for g in gathered)
        return (max(inside), after, differ, trainer.valid_history, trainer.valid_mean_history)

    common = {"pipeline-model-parallel-size": 2, "train-iters": 6, "eval-iters": 2}
    cocktail = {"dp-mode": "cocktail_sgd", **common}
    out = {"cocktail": runner._run(tiny_gpt_argv(corpus, **cocktail, **{"eval-interval": 2}),
                                   world, check_average),
           "cocktail-no-eval": runner.train(tiny_gpt_argv(corpus, **cocktail), world),
           "diloco": runner._run(tiny_gpt_argv(corpus, **common, **{
               "dp-mode": "diloco", "diloco-inner-steps": 3, "eval-interval": 3}),
               world, check_average),
           "allreduce": runner._run(tiny_gpt_argv(corpus, **common, **{"eval-interval": 2}),
                                    world, check_average)}
    return out


def test_replica_average_validation(tiny_corpus):
    """Validation of the replicas' mean weights in the parameter-syncing modes: the block holds
    the exact mean and restores each replica's weights bit for bit, so training with it is
    identical to training without it; where the replicas agree (DiLoCo right after an outer
    step) it gives exactly the plain validation loss; exact all-reduce logs no such line."""
    out = run_distributed(_replica_average_worker, 4, (tiny_corpus,), timeout=600)[-1]
    losses, (inside, after, differ, valid, mean) = out["cocktail"]
    assert inside < 1e-6 and after and differ   # CocktailSGD's replicas differ (worker error)
    assert losses == out["cocktail-no-eval"]     # validating the mean does not touch training
    assert [i for i, _ in mean] == [i for i, _ in valid] == [2, 4, 6]
    assert [v for _, v in mean] != [v for _, v in valid]
    _, (inside, after, differ, valid, mean) = out["diloco"]
    assert inside < 1e-6 and after and not differ   # training ended on an outer step
    assert mean == valid and [i for i, _ in valid] == [3, 6]
    _, (_, _, differ, valid, mean) = out["allreduce"]
    assert mean == [] and len(valid) == 3 and not differ


def _replica_adam_worker(rank, world, corpus):
    from megatron.training.checkpointing.save_load import _torch_optimizers

    def kinds(trainer):
        return [(type(o).__name__, getattr(o, "dp", None))
                for o in _torch_optimizers(trainer.optimizer)]
    flags = {"dp-mode": "adpsgd", "train-iters": 3}
    return (runner._run(tiny_gpt_argv(corpus, **flags), world, kinds),
            runner._run(tiny_gpt_argv(corpus, **flags, **{"dp-adam-correction": True}),
                        world, kinds))


def test_dp_adam_correction_swaps_the_local_adam(tiny_corpus):
    (plain, plain_kinds), (ours, our_kinds) = run_distributed(
        _replica_adam_worker, 2, (tiny_corpus,), timeout=600)[-1]
    assert {k for k, _ in plain_kinds} == {"AdamW"}
    assert set(our_kinds) == {("ReplicaAdamW", 2)}
    assert plain[0] == ours[0]          # same first forward, different steps after it
    assert plain[1:] != ours[1:]


def _preduce_worker(rank, world, corpus):
    import torch
    from megatron.core import parallel_state as ps
    from megatron.cc.grad_sync.sync import shared_embedding_weight

    def schedule(trainer):
        dp = trainer.grad_sync.dp
        dp = getattr(dp, "dp", dp)   # under --hetero, HeteroDelay wraps it
        w = shared_embedding_weight(trainer.model)
        flat = torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()])
        return (ps.get_pipeline_model_parallel_rank(), ps.get_data_parallel_rank(), dp.schedule,
                dp.decider, dp.pairwise, list(dp.rounds),
                None if w is None else w.detach().numpy().copy(), flat.numpy())
    # partial rounds (ssp bound beyond the run) between replicas made unequal by --hetero
    common = {"pipeline-model-parallel-size": 2, "train-iters": 5, "dp-mode": "preduce",
              "ssp-bound": 100, "hetero": 0.5}
    return {name: runner._run(tiny_gpt_argv(corpus, **common, **flags), world, schedule)[1]
            for name, flags in PREDUCE_RUNS.items()}


PREDUCE_RUNS = {
    "tied": {},                                                    # the default: per stage
    "untied": {"untie-embeddings-and-output-weights": True, "preduce-groups": "pairwise"},
    "replica": {"preduce-scope": "replica"},
}


def test_preduce_schedules_per_stage_in_the_trainer(tiny_corpus):
    """pp 2 x dp 2: per stage, the tied embedding's stages share the last stage's schedule and
    its two copies stay bit-identical; untied, each stage schedules itself; replica scope:
    stage 0 decides. Every stage ends on a connected round (all replicas equal)."""
    import numpy as np
    everyone = run_distributed(_preduce_worker, 4, (tiny_corpus,), timeout=600)
    expect = {"tied": ({0: 1, 1: 1}, {1}), "untied": ({0: 0, 1: 1}, {0, 1}),
              "replica": ({0: 0, 1: 0}, {0})}
    for name, (schedules, deciders) in expect.items():
        rows = {(r[name][0], r[name][1]): r[name] for r in everyone}   # (stage, dp rank)
        for (stage, d), (_, _, sched, decider, pairwise, rounds, emb, flat) in rows.items():
            assert sched == schedules[stage] and decider == (stage in deciders), (name, stage)
            assert pairwise == (name == "untied")
            assert len(rounds) == 5 and rounds[-1] == (-1, [0, 1])
            assert all(w >= 0 for w, _ in rounds[:-1])            # partial rounds before it
            np.testing.assert_array_equal(flat, rows[(stage, 1 - d)][7])   # ended equal
        if name != "untied":   # one schedule for both stages: the same partners every round
            for d in range(2):
                assert rows[(0, d)][5] == rows[(1, d)][5], name
        if name == "tied":
            for d in range(2):
                np.testing.assert_array_equal(rows[(0, d)][6], rows[(1, d)][6])
