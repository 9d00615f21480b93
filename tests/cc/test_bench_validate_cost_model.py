"""bench/validate_cost_model.py: the cost model's prediction of a slow-link bench run."""
import argparse
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import validate_cost_model as vcm  # noqa: E402

VOCAB = 8000


def _args(**kw):
    a = argparse.Namespace(veth_gbps=10.0, latency_us=100.0,
                           stat="ms_per_iter", vocab_size=VOCAB, tolerance=15.0)
    vars(a).update(kw)
    return a


def _rec(config, rate, ms, overlap=False, placement="pp", world=2):
    return {"config": config, "rate": rate, "overlap": overlap, "placement": placement,
            "world": world, "ms_per_iter": ms, "iterations": 3, "microbatches": 8}


def test_calibrated_on_the_unthrottled_run_and_predicts_the_link_by_hand():
    a = _args()
    none = _rec("uncompressed", "none", 3000.0)
    slow = _rec("uncompressed", "20mbit", 9000.0)
    rows, rates = vcm.validate([none, slow, _rec("subspace", "20mbit", 5000.0),
                                _rec("uncompressed", "none", 3500.0, overlap=True)], a)
    # calibrated on the faster of the two unthrottled uncompressed runs
    assert rows[0]["predicted"] == pytest.approx(3000.0, rel=1e-6)
    assert rows[3]["predicted"] < 3500.0
    # 1F1B sync at pp 2, M 8: the first activation and the last gradient alone, and M - 1 = 7
    # batches whose activation and gradient cross at once: 2 + 7 transfers of a 1 MiB message
    # (hidden 256 x seq 256 x micro-batch 4, fp32) over the link's TCP payload rate, less
    # tbf's 128 KiB burst (as payload), which the slot's compute (~0.33 s) refills in full
    bw = 20e6 * 1448 / 1514 / 8
    link = (2 + 7) * (1e-4 + (1048576 - 131072 * 1448 / 1514) / bw)
    fast = (2 + 7) * (1e-4 + 1048576 / (10e9 / 8))
    assert rows[1]["predicted"] == pytest.approx(3000.0 + 1e3 * (link - fast), rel=1e-6)
    assert rows[2]["predicted"] is None and rows[2]["note"] == "not modelled"
    assert set(rates) == {"pp"}
    text = "\n".join(vcm.table(rows, rates, 15.0))
    assert "| 20mbit | uncompressed | sync | 9000 |" in text
    assert "of 3 predictions within 15%" in text


def test_without_a_calibration_run_nothing_is_predicted():
    rows, rates = vcm.validate([_rec("all-pipeline", "20mbit", 5000.0)], _args())
    assert rates == {} and rows[0]["predicted"] is None
    assert "no calibration run" in rows[0]["note"]


def test_an_interleaved_twin_is_predicted_with_its_own_flags():
    """bench_slow_link --virtual-pipeline 2 records `<name>-vp2`: its chunks' extra messages
    make the same link cost more than 1F1B's."""
    a = _args()
    recs = [_rec("uncompressed", "none", 3000.0), _rec("uncompressed", "20mbit", 9000.0),
            _rec("uncompressed-vp2", "20mbit", 9000.0)]
    rows, _ = vcm.validate(recs, a)
    assert rows[2]["predicted"] is not None, rows[2]["note"]
    assert rows[2]["predicted"] > rows[1]["predicted"]
    assert rows[2]["error"] == pytest.approx(100 * (rows[2]["predicted"] - 9000.0) / 9000.0)
