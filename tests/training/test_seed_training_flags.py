"""Training flags from the seeds that change how an iteration runs: recompute (both spellings),
--pp-mode gpipe, --rampup-batch-size / --train-samples, --check-comp-ratio, --experiment-name.

One 2-rank job (pp=2) trains the same tiny GPT under each flag set; recompute and the GPipe
schedule must reproduce the reference losses (fp32 on CPU: the same operations in the same
order, so equal to float rounding).
"""
import os
import re

import pytest

from tests.conftest import tiny_gpt_argv
from tests.distributed import run_distributed
from tests.training.runner import train

RUNS = {
    "reference": {},
    "gpipe": {"pp-mode": "gpipe"},
    "recompute-full-uniform": {"recompute-granularity": "full", "recompute-method": "uniform",
                               "recompute-num-layers": 1},
    "v2.5-checkpoint-activations": {"checkpoint-activations": True},
    "v2.5-block": {"activations-checkpoint-method": "block",
                   "activations-checkpoint-num-layers": 1},
    "recompute-selective": {"recompute-activations": True},
}


def _job(rank, world, corpus, root):
    out = {}
    for name, extra in RUNS.items():
        argv = tiny_gpt_argv(corpus, **{"pipeline-model-parallel-size": 2, "train-iters": 3,
                                        "global-batch-size": 4, "attention-dropout": 0.1,
                                        "hidden-dropout": 0.1, **extra})
        out[name] = train(argv, world)
    return out


@pytest.fixture(scope="module")
def runs(tiny_corpus, tmp_path_factory):
    return run_distributed(_job, 2, (tiny_corpus, str(tmp_path_factory.mktemp("r"))),
                           timeout=600)[-1]


@pytest.mark.parametrize("name", [n for n in RUNS if n != "reference"])
def test_same_losses_as_reference(runs, name):
    ref = runs["reference"]
    assert len(runs[name]) == len(ref) == 3
    for a, b in zip(runs[name], ref):
        assert abs(a - b) <= 1e-6 * abs(b), (name, runs[name], ref)


@pytest.mark.parametrize("flags,expected", [
    ([], (None, None, None, False)),
    (["--checkpoint-activations"], ("full", "uniform", 1, False)),
    (["--activations-checkpoint-method", "block", "--activations-checkpoint-num-layers", "2"],
     ("full", "block", 2, False)),
    (["--recompute-granularity", "full", "--recompute-method", "uniform",
      "--recompute-num-layers", "2", "--distribute-checkpointed-activations",
      "--tensor-model-parallel-size", "2"], ("full", "uniform", 2, True)),
    (["--recompute-activations"], ("selective", None, None, False)),
])
def test_recompute_flags_reach_megatron_core(tiny_corpus, flags, expected):
    from megatron.training.flags.arguments import parse_args
    from megatron.training.model.model import transformer_config
    args = parse_args(tiny_gpt_argv(tiny_corpus) + flags, world_size=2)
    c = transformer_config(args)
    assert (c.recompute_granularity, c.recompute_method, c.recompute_num_layers,
            c.distribute_saved_activations) == expected


@pytest.mark.parametrize("flags,fragment", [
    (["--distribute-checkpointed-activations", "--checkpoint-activations"],
     "needs --tensor-model-parallel-size > 1"),
    (["--recompute-method", "block"], "need --recompute-granularity full"),
    (["--recompute-granularity", "full", "--recompute-num-layers", "9"],
     "--recompute-num-layers 9 must be between 1 and the layers of one pipeline stage (4)"),
    (["--data-impl", "lazy"], "--data-impl lazy"),
    (["--DDP-impl", "torch"], "--DDP-impl torch"),
    (["--train-samples", "64"], "drop --train-iters"),
    (["--lr-decay-samples", "64"], "needs --train-samples"),
    (["--pp-mode", "gpipe", "--pipeline-model-parallel-size", "2", "--inter-grad-comp",
      "--inter-grad-comp-epilogue-only"], "--pp-mode gpipe"),
    (["--train-iters", None, "--train-samples", "64", "--rampup-batch-size", "3", "1", "8"],
     "multiples of --micro-batch-size x data-parallel size (2)"),
])
def test_seed_flag_contradictions_are_refused(tiny_corpus, flags, fragment):
    from megatron.training.flags.arguments import parse_args
    from megatron.training.config.config_flags import ConfigError
    argv = tiny_gpt_argv(tiny_corpus, **{"micro-batch-size": 1})
    if flags[:2] == ["--train-iters", None]:
        i = argv.index("--train-iters")
        del argv[i:i + 2]
        flags = flags[2:]
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        parse_args(argv + flags, world_size=2)
