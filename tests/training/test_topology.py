"""Topology: its fields equal megatron-core's parallel_state at 8 ranks, tp2 x pp2 x dp2
(and at tp1 x pp4 x dp2), and the driver asks parallel_state and torch.cuda.is_available only
where the topology is built (an ast walk, like tests/test_import_direction.py)."""
import ast
from pathlib import Path

import pytest

from tests.distributed import run_distributed

ROOT = Path(__file__).resolve().parents[2]
# initialize.py creates and destroys megatron-core's groups (no facts read); topology.py reads
# them once; cpu_shim.py decides whether it applies. megatron/cc (the library) is not walked:
# it takes groups in constructors; config.py's flag check and background.py's thread state
# ask torch.cuda themselves.
ALLOWED = {"parallel_state": {"initialize.py", "topology.py"},
           "is_available": {"topology.py", "cpu_shim.py"}}


def _worker(rank, world):
    # one spawn (imports are slow) of 4 ranks: tp and pp, then pp and dp
    return [_check(world, tp, pp) for tp, pp in ((2, 2), (1, 2))]


def _check(world, tp, pp):
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.training.runtime.topology import Topology
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    try:
        t = Topology.from_parallel_state()
        member = ps.is_pipeline_first_stage() or ps.is_pipeline_last_stage()
        assert (t.rank, t.world_size) == (dist.get_rank(), dist.get_world_size())
        assert (t.tp_rank, t.tp_size) == (ps.get_tensor_model_parallel_rank(), tp)
        assert (t.pp_rank, t.pp_size) == (ps.get_pipeline_model_parallel_rank(), pp)
        assert (t.dp_rank, t.dp_size) == (ps.get_data_parallel_rank(), world // (tp * pp))
        assert (t.is_first, t.is_last) == (ps.is_pipeline_first_stage(),
                                           ps.is_pipeline_last_stage())
        assert (t.prev_rank, t.next_rank) == (ps.get_pipeline_model_parallel_prev_rank(),
                                              ps.get_pipeline_model_parallel_next_rank())
        assert t.tp_group is ps.get_tensor_model_parallel_group()
        assert t.pp_group is ps.get_pipeline_model_parallel_group()
        assert t.dp_group is ps.get_data_parallel_group()
        assert t.emb_group is (ps.get_embedding_group() if member else None)
        assert list(t.pp_ranks) == dist.get_process_group_ranks(t.pp_group)
        assert list(t.dp_ranks) == dist.get_process_group_ranks(t.dp_group)
        assert t.pp_ranks[t.pp_rank] == t.rank and t.dp_ranks[t.dp_rank] == t.rank
        assert t.device == torch.device("cpu") == t.collective_device and t.backend == "gloo"
        return t.tp_rank, t.pp_rank, t.dp_rank
    finally:
        ps.destroy_model_parallel()


def test_topology_matches_parallel_state():
    out = run_distributed(_worker, world_size=4, timeout=300)
    assert all(len({places[i] for places in out}) == 4 for i in range(2))   # one place each


def _reads(path: Path):
    """(line, what) for each parallel_state import and each `.is_available()` call."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [getattr(node, "module", None) or ""] + [a.name for a in node.names]
            if any(n.endswith("parallel_state") for n in names):
                yield node.lineno, "parallel_state"
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "is_available":
            yield node.lineno, "is_available"


def test_driver_reads_parallel_state_and_cuda_only_where_allowed():
    found = [f"{p.relative_to(ROOT)}:{line}: {what}"
             for p in sorted((ROOT / "megatron" / "training").rglob("*.py"))
             for line, what in _reads(p) if p.name not in ALLOWED[what]]
    assert not found, "ask the Topology (megatron/training/runtime/topology.py) instead:\n" + \
        "\n".join(found)


def test_checker_sees_both_reads(tmp_path):
    src = tmp_path / "x.py"
    src.write_text("def f():\n    from megatron.core import parallel_state as ps\n"
                   "    import torch\n    return torch.cuda.is_available()\n")
    assert list(_reads(src)) == [(2, "parallel_state"), (4, "is_available")]
