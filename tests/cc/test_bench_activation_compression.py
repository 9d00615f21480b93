"""Smoke test of bench/bench_activation_compression.py: its pieces on tiny inputs, no training."""
import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

BENCH = pathlib.Path(__file__).parents[2] / "bench" / "bench_activation_compression.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_activation_compression", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_help_and_unknown_method():
    out = subprocess.run([sys.executable, str(BENCH), "--help"], capture_output=True,
                         text=True, check=True).stdout
    for flag in ("--iters", "--base-iters", "--methods", "--delta-warmup-epochs", "--plot-only"):
        assert flag in out
    bench = load_bench()
    with pytest.raises(SystemExit):
        bench.main(["--methods", "none,nope"])


def test_task_text_codec_speed_and_plot(tmp_path):
    bench = load_bench()
    raw = tmp_path / "task.raw"
    assert bench.write_task_text(str(raw), 3000) >= 3000
    assert raw.read_text().startswith(" = ")
    speed = bench.codec_speed([(32, 2, 64)], repeat=1)[(32, 2, 64)]
    assert set(speed) == set(bench.CODECS)
    assert speed["fixpoint-4"][0] > 7 and speed["bwd fixpoint-8"][0] > 3.5
    curves = {m: {"losses": {"10": 6.0 + i, "20": 5.5 + i}, "valid": {"20": 5.8 + i}}
              for i, m in enumerate(("none", "delta-4"))}
    (tmp_path / "activation_compression.json").write_text(json.dumps(curves))
    assert bench.main(["--plot-only", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "activation_compression_loss.png").stat().st_size > 1000
