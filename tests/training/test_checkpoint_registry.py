"""The checkpoint manager works from registrations alone: no trainer, no fields read off one.

Two ranks (dp 2) register a fake shard Stateful, a fake per-rank component and a Progress;
a save writes Megatron-LM's file layout with exactly those keys, and a second manager with
fresh Statefuls restores every value. A scan of checkpointing.py fails on any `trainer`.
"""
import ast
import os
import types
from pathlib import Path

import pytest
import torch

from tests.conftest import tiny_gpt_argv
from tests.distributed import run_distributed


class Box:
    """A Stateful owning one key of its file."""

    def __init__(self, key, value):
        self.key, self.value = key, value

    def state_dict(self) -> dict:
        return {self.key: self.value}

    def load_state_dict(self, sd: dict) -> None:
        self.value = sd[self.key]


def _manager(args, iteration, weights, cache):
    from megatron.training.checkpointing.save_load import SHARD, CheckpointManager, Progress
    progress = Progress(iteration=iteration, consumed_samples=8 * iteration)
    from megatron.training.runtime.topology import Topology
    m = CheckpointManager(args, progress, padded_vocab_size=1024, vocab_size=1000,
                          topo=Topology.from_parallel_state())
    boxes = {"weights": Box("weights", weights), "cache": Box("cache", cache)}
    m.register("weights", boxes["weights"], SHARD)
    m.register("cache", boxes["cache"])   # a channel: rank file, components["cache"]
    return m, progress, boxes


def _worker(rank, world, corpus, root):
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.training.flags.arguments import parse_args
    from megatron.training.checkpointing.checkpoint_io import safe_load
    from megatron.training.checkpointing.save_load import rank_file, shard_file
    ps.initialize_model_parallel(1, 1)
    args = parse_args(tiny_gpt_argv(corpus), world_size=world)
    saved, _, _ = _manager(args, 3, torch.arange(4.0), torch.full((2,), float(rank)))
    saved.save(root)
    shard = safe_load(shard_file(root, 3, 0, 0, 1)) if rank == 0 else None
    mine = safe_load(rank_file(root, 3, rank))
    loaded, progress, boxes = _manager(args, 0, None, None)
    loaded.load(root)
    ps.destroy_model_parallel()
    dist.barrier()
    return (shard and (sorted(shard), type(shard["args"]).__name__, shard["layout"]),
            sorted(mine), (progress.iteration, progress.consumed_samples),
            boxes["weights"].value, boxes["cache"].value)


def test_manager_saves_and_restores_registered_statefuls(tiny_corpus, tmp_path):
    root = str(tmp_path / "ckpt")
    out = run_distributed(_worker, 2, (tiny_corpus, root), timeout=300)
    keys, namespace, layout = out[0][0]
    assert keys == ["args", "checkpoint_version", "consumed_samples", "iteration", "layout",
                    "weights"]
    assert namespace == "Namespace"   # Megatron-LM's args
    assert layout == {"tp": 1, "pp": 1, "tp_rank": 0, "pp_rank": 0, "padded_vocab_size": 1024,
                      "vocab_size": 1000}
    assert os.path.isfile(os.path.join(root, "iter_0000003", "mp_rank_00", "model_optim_rng.pt"))
    for rank, (_, rank_keys, progress, weights, cache) in enumerate(out):
        assert rank_keys == ["components"]   # nothing registered per rank but the component
        assert progress == (3, 24)
        assert torch.equal(weights, torch.arange(4.0))
        assert torch.equal(cache, torch.full((2,), float(rank)))   # each rank its own


def test_checkpointing_never_mentions_a_trainer():
    from megatron.training.checkpointing import save_load as checkpointing
    tree = ast.parse(Path(checkpointing.__file__).read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not {"trainer", "Trainer", "training"} & names, "checkpointing reads a trainer"


def test_trainer_counters_are_its_progress():
    from megatron.training.checkpointing.save_load import Progress
    from megatron.training.loop.training import Trainer
    t = types.SimpleNamespace(progress=Progress())
    Trainer.iteration.fset(t, 5)
    Trainer.consumed_samples.fset(t, 40)
    assert t.progress.state_dict() == {"iteration": 5, "consumed_samples": 40}
    t.progress.load_state_dict({"iteration": 7, "consumed_samples": 56, "model": None})
    assert (Trainer.iteration.fget(t), Trainer.consumed_samples.fget(t)) == (7, 56)


@pytest.mark.parametrize("flags, restored", [
    ({}, {"progress", "model", "optimizer", "opt_param_scheduler", "rng", "channel"}),
    ({"finetune": True}, {"model"}),
    ({"no_load_optim": True}, {"progress", "model", "rng", "channel"}),
    ({"no_load_rng": True}, {"progress", "model", "optimizer", "opt_param_scheduler",
                             "channel"}),
])
def test_load_flags_pick_what_is_restored(flags, restored):
    from megatron.training.checkpointing.save_load import CheckpointManager
    c = types.SimpleNamespace(finetune=False, no_load_optim=False, no_load_rng=False)
    vars(c).update(flags)
    m = CheckpointManager.__new__(CheckpointManager)   # no process groups needed here
    m.args = types.SimpleNamespace(checkpoint=c)
    names = ["progress", "model", "optimizer", "opt_param_scheduler", "rng", "channel"]
    assert {n for n in names if m._restores(n)} == restored
