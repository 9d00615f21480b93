"""bench/bench_codec_fidelity.py: its references are right and the issue-23 targets hold on
the Gaussian and near-low-rank data (the real-activation part needs a trained checkpoint and
runs in the benchmark only)."""
import importlib.util
import pathlib

import pytest

BENCH = pathlib.Path(__file__).parents[2] / "bench" / "bench_codec_fidelity.py"
_spec = importlib.util.spec_from_file_location("bench_codec_fidelity", BENCH)
fid = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fid)

# Max (1960), optimal non-uniform quantiser of N(0, 1): mean squared error at 1..5 bits
MAX_TABLE = {1: 0.3634, 2: 0.1175, 3: 0.03454, 4: 0.009497, 5: 0.002499}


@pytest.mark.parametrize("bits", sorted(MAX_TABLE))
def test_lloyd_max_reference_matches_max_table(bits):
    assert fid.lloyd_max_mse(bits) == pytest.approx(MAX_TABLE[bits], rel=5e-3)


def test_gaussian_targets_and_seed_comparison():
    lm = {b: fid.lloyd_max_mse(b) for b in range(1, 9)}
    rows = fid.scalar_rows("(a) Gaussian", fid.gaussian(), "gauss", lm)
    assert len(rows) == 8 + 7 + 8
    for r in rows:
        assert r["vs_seed"] <= 1.0, r                  # never worse than the seed, same bytes
        if r["bits"] >= 2:
            assert r["vs_lm"] <= fid.TARGET_LM, r      # within 1.25x Lloyd-Max
        assert r["mse"] >= r["rd"]                     # nothing beats the Shannon limit
    fix4 = next(r for r in rows if r["codec"] == "fixpoint channel 4b")
    assert fix4["rate"] == pytest.approx(4 + 16 / 256)  # 4-bit codes + one fp16 scale / 256


def test_lowrank_sequence_at_the_svd_floor():
    for s in fid.lowrank_sequence_rows():
        assert len(s["errors"]) == 8 and s["worst_vs_floor"] <= 2.0, s
