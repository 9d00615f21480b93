"""Smoke test of bench/bench_codecs.py: a tiny run prints a row per codec."""
import importlib.util
import pathlib

import pytest


def load_bench():
    path = pathlib.Path(__file__).parents[3] / "bench" / "bench_codecs.py"
    spec = importlib.util.spec_from_file_location("bench_codecs", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_runs_tiny(capsys):
    bench = load_bench()
    bench.main(["--seq", "8", "--micro-batch", "2", "--models", "gpt-2.5b", "--repeat", "1",
                "--threads", "0"])
    out = capsys.readouterr().out
    for label in bench.codec_table(8, 2, 1920):
        assert label in out
    with pytest.raises(SystemExit):
        bench.main(["--codecs", "nope"])
