"""Training flags from the seeds that change how an iteration runs: recompute (both spellings),
--pp-mode gpipe, --rampup-batch-size / --train-samples, --check-comp-ratio, --experiment-name.

One 2-rank job (pp=2) trains the same tiny GPT under each flag set; recompute and the GPipe
schedule must reproduce the reference losses (fp32 on CPU: the same operations in the same
order, so equal to float rounding).
"""
import os

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
