"""The dp modes' background threads issue collectives only on groups no other thread uses.

Two threads issuing collectives on one group could interleave them differently on different
ranks (on NCCL: a hang). Every collective of a real training run (2 gloo ranks, the driver as
pretrain_gpt.py builds it) is recorded with its thread and group: CocktailSGD with its
overlapped exchange and DiLoCo with a sync delay must show background collectives, on groups
disjoint from the main thread's (megatron.cc.grad_sync.groups.clone_groups gives them theirs).
"""
import inspect
import threading

import pytest

from tests.conftest import tiny_gpt_argv
from tests.distributed import run_distributed
from tests.training import runner

COLLECTIVES = ["all_reduce", "all_gather", "all_gather_into_tensor", "all_to_all_single",
               "all_to_all", "broadcast", "reduce_scatter", "reduce_scatter_tensor", "barrier",
               "all_gather_object", "broadcast_object_list", "send", "recv", "isend", "irecv",
               "all_gather_single", "reduce_scatter_single"]
MODES = {
    "cocktail_sgd overlap": {"dp-mode": "cocktail_sgd", "cocktail-warmup-steps": 1},
    "diloco sync delay": {"dp-mode": "diloco", "diloco-inner-steps": 2,
                          "diloco-sync-delay": 1},
}


def _record(calls):
    import torch.distributed as dist

    def wrap(name, fn):
        sig = inspect.signature(fn)

        def recorded(*args, **kwargs):
            group = sig.bind_partial(*args, **kwargs).arguments.get("group")
            calls.append((threading.current_thread() is threading.main_thread(),
                          id(group if group is not None else dist.group.WORLD), name))
            return fn(*args, **kwargs)
        return recorded
    originals = {n: getattr(dist, n) for n in COLLECTIVES if hasattr(dist, n)}
    for n, fn in originals.items():
        setattr(dist, n, wrap(n, fn))
    batch = dist.batch_isend_irecv

    def batch_recorded(ops):
        for op in ops:
            g = op.group if op.group is not None else dist.group.WORLD
            calls.append((threading.current_thread() is threading.main_thread(), id(g),
                          "batch_isend_irecv"))
        return batch(ops)
    dist.batch_isend_irecv = batch_recorded


def _worker(rank, world, corpus):
    out = {}
    calls = []
    _record(calls)
    for name, flags in MODES.items():
        calls.clear()
        runner.train(tiny_gpt_argv(corpus, **{"train-iters": 4, **flags}), world)
        main = {g for on_main, g, _ in calls if on_main}
        bg = {g for on_main, g, _ in calls if not on_main}
        bg_ops = sorted({op for on_main, _, op in calls if not on_main})
        out[name] = (len(main), len(bg), len(main & bg), bg_ops)
    return out


@pytest.fixture(scope="module")
def groups(tiny_corpus):
    return run_distributed(_worker, 2, (tiny_corpus,), timeout=600)


@pytest.mark.parametrize("mode", list(MODES))
def test_background_collectives_use_a_group_of_their_own(groups, mode):
    for rank, out in enumerate(groups):
        main, bg, shared, bg_ops = out[mode]
        assert main and bg, f"rank {rank}: no background collectives seen ({bg_ops})"
        assert shared == 0, f"rank {rank}: {shared} group(s) used by both threads ({bg_ops})"
