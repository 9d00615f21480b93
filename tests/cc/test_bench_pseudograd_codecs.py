"""bench/bench_pseudograd_codecs.py: its bits, ratios and errors on synthetic replicas (the
captured pseudo-gradients need a training run and are measured in the benchmark only)."""
import importlib.util
import pathlib

import pytest
import torch

BENCH = pathlib.Path(__file__).parents[2] / "bench" / "bench_pseudograd_codecs.py"
_spec = importlib.util.spec_from_file_location("bench_pseudograd_codecs", BENCH)
pg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pg)


@pytest.fixture(scope="module")
def measured():
    gen = torch.Generator().manual_seed(0)
    common = torch.randn(4096 * 8, generator=gen)
    deltas = [common + torch.randn(common.shape, generator=gen) for _ in range(4)]
    return pg.measure(deltas, inner_steps=50)


def test_bits_and_ratios_follow_the_payload_formulas(measured):
    rows = {r["codec"]: r for r in measured[0]}
    # fixpoint-b: b bits + one fp16 scale per 128 values; sharded count = the payload
    assert rows["fixpoint-2"]["bits"] == pytest.approx(2 + 16 / 128)
    assert rows["fixpoint-2"]["ratio"] == pytest.approx(32 * 50 / (2 + 16 / 128))
    assert rows["int8"]["bits"] == pytest.approx(8 + 16 / 128)
    # SparseLoCo's defaults: 64 of 4096 at 12 + 2 bits and one scale per chunk; the
    # all-gather counts D / 2 = 2 payloads at dp = 4 (x1078 at H = 15 in the README)
    top = rows["sparseloco top-k 0.0156 2b"]
    assert top["bits"] == pytest.approx((64 * 14 + 16) / 4096)
    assert top["ratio"] * 15 / 50 == pytest.approx(1077.9, abs=0.1)


def test_errors_fall_with_bits_and_the_mean_averages_noise(measured):
    rows = {r["codec"]: r for r in measured[0]}
    errs = [rows[f"fixpoint-{b}"]["rel_mse_replica"] for b in (1, 2, 3, 4)]
    assert errs == sorted(errs, reverse=True) and errs[-1] < 0.01
    assert rows["fp16"]["rel_mse_replica"] < 1e-6
    # the replicas' independent errors partly cancel in their mean
    assert rows["fixpoint-2"]["rel_mse_mean"] < rows["fixpoint-2"]["rel_mse_replica"]
    info = measured[1]
    assert all(0.4 < c < 0.6 for c in info["cos_replica0"])   # shared part = half the energy
    assert info["numel"] == 4096 * 8 and info["replicas"] == 4


def test_a_directory_without_captures_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="--diloco-capture-dir"):
        pg.load(str(tmp_path), 50)


def test_captures_of_several_stages_are_refused(tmp_path):
    from megatron.cc.data_parallel.pseudo_grad_capture import save_pseudo_gradient
    for rank, shapes in ((0, [(4,)]), (1, [(2, 2)])):   # two stages, dp 1 each
        save_pseudo_gradient(str(tmp_path), torch.ones(4), shapes, 50, 0, rank, 0, 1)
    with pytest.raises(SystemExit, match="pipeline parallel size 1"):
        pg.load(str(tmp_path), 50)
