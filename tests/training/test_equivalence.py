"""tp/pp/dp splits are lossless: 5 iterations give (1,1,1)'s losses within 1e-5 relative.

fp32, dropout 0, same seed and data; M = global / (micro x dp) > pp micro-batches in every
layout, so 1F1B's warm-up, steady state and cool-down all run. The initial weights depend on
the seed alone (model.py), so every layout starts from the same model.
"""
import pytest

from tests.conftest import tiny_gpt_argv
from tests.distributed import run_distributed
from tests.training import runner

REL_TOL = 1e-5


def _layouts_worker(rank, world, corpus, layouts):
    out = {}
    for tp, pp in layouts:
        argv = tiny_gpt_argv(corpus, **{"tensor-model-parallel-size": tp,
                                        "pipeline-model-parallel-size": pp})
        out[(tp, pp, world // (tp * pp))] = runner.train(argv, world)
    return out


@pytest.fixture(scope="module")
def reference(tiny_corpus):
    return run_distributed(_layouts_worker, 1, (tiny_corpus, [(1, 1)]), timeout=300)[0][(1, 1, 1)]


@pytest.mark.parametrize("world,layouts", [
    (2, [(2, 1), (1, 2), (1, 1)]),   # (2,1,1), (1,2,1), (1,1,2)
    (4, [(1, 4)]),                   # (1,4,1)
    (8, [(2, 2)]),                   # (2,2,2)
])
def test_layouts_match_single_process(tiny_corpus, reference, world, layouts):
    assert len(reference) == 5 and all(l == l for l in reference)
    results = run_distributed(_layouts_worker, world, (tiny_corpus, layouts), timeout=600)[-1]
    for layout, losses in results.items():
        assert len(losses) == 5, layout
        for i, (a, b) in enumerate(zip(losses, reference)):
            assert abs(a - b) <= REL_TOL * abs(b), (layout, i, a, b)
    assert reference[-1] < reference[0]  # it trains
