"""Smoke test of bench/bench_subspace.py: its pieces on tiny inputs, no training."""
import importlib.util
import pathlib
import subprocess
import sys

import pytest

BENCH = pathlib.Path(__file__).parents[2] / "bench" / "bench_subspace.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_subspace", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_help_labels_and_table():
    out = subprocess.run([sys.executable, str(BENCH), "--help"], capture_output=True,
                         text=True, check=True).stdout
    for flag in ("--iters", "--runs", "--layout", "--nproc", "--save-baseline",
                 "--finetune-iters"):
        assert flag in out
    bench = load_bench()
    assert bench.run_flags("none") == []
    assert bench.run_flags("sub-k8-b4") == ["--forward-compress-method", "subspace",
                                            "--subspace-rank", "8", "--subspace-bits", "4",
                                            "--subspace-constrain", "writes"]
    with pytest.raises(SystemExit):
        bench.run_flags("sub-8")
    from runlog import RunResult
    base = RunResult("none", losses={10: 6.1}, valid={10: 6.0}, ms_per_iter=[1.0, 2.0],
                     bytes_per_iter={"pp-fwd": 2048.0, "pp-bwd": 2048.0}, ratio={"pp-fwd": 1.0})
    sub = RunResult("sub-k8-b4", losses={10: 6.2}, valid={10: 6.06}, ms_per_iter=[1.0, 2.0],
                    bytes_per_iter={"pp-fwd": 16.0}, ratio={"pp-fwd": 127.0})
    rows = bench.table([base, sub], 6.0)
    assert len(rows) == 4 and "x127.0" in rows[3] and "+1.00%" in rows[3]
    # fine-tuned rows compare with the fine-tuned none run
    tuned = RunResult("none-ft", losses={5: 5.9}, valid={5: 5.0}, ms_per_iter=[1.0, 2.0])
    sub_ft = RunResult("sub-k8-b4-ft", losses={5: 5.9}, valid={5: 5.1}, ms_per_iter=[1.0, 2.0],
                       bytes_per_iter={"pp-fwd": 16.0}, ratio={"pp-fwd": 127.0})
    rows = bench.table([base, sub, tuned, sub_ft], 6.0)
    assert "+0.00%" in rows[4] and "+2.00%" in rows[5]
