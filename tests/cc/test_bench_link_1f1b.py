"""bench/bench_link_1f1b.py without root: its model line, its timeline and its stand-in stage."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import bench_link_1f1b as b1  # noqa: E402


def _link_s(rate: str, nbytes: int, refill_s: float) -> float:
    """The validator's link (tbf rate and burst as TCP payload, 100 us), its bucket refilled
    for refill_s."""
    bps = {"5mbit": 5e6, "20mbit": 2e7}[rate] / 8 * 1448 / 1514
    tokens = min(128 * 1024 * 1448 / 1514, bps * refill_s)
    return 1e-4 + max(0.0, nbytes - tokens) / bps


@pytest.mark.parametrize("rate", ["5mbit", "20mbit"])
def test_model_line_is_step_times_pp2_formula(rate):
    """Sync: fill and drain alone, then M - 1 periods of the slower stage plus its message
    (P = max(slot_0 + c, slot_1 + c)), the bucket refilled during a slot; overlapped: half the
    round trip, P = (2 c + slot_0 + slot_1) / 2, the bucket refilled while a direction idles,
    P - c = (slot_0 + slot_1) / 2."""
    slots, M, x = [0.141, 0.235], 8, 2**20
    top = max(slots)
    c = _link_s(rate, x, top)
    sync = (M + 1) * top + 2 * c + (M - 1) * (top + c - top)
    assert b1.model_ms(rate, x, slots, M, "sync") == pytest.approx(1e3 * sync, rel=1e-9)
    c = _link_s(rate, x, sum(slots) / 2)
    period = (2 * c + sum(slots)) / 2
    ovl = (M + 1) * top + 2 * c + (M - 1) * (period - top)
    assert b1.model_ms(rate, x, slots, M, "prefetch") == pytest.approx(1e3 * ovl, rel=1e-6)


def test_timeline_pairs_each_send_with_the_compute_that_used_it():
    """A message is had when the receiving stage starts the compute that consumes it:
    stage 1's forward of an activation, stage 0's backward of a gradient."""
    a = {"t0": 100.0, "t1": 110.0, "posts": [["pp-fwd", 0, 100.1]],
         "compute": [["F", 0, 100.0, 100.1], ["B", 0, 103.0, 103.2]]}
    b = {"t0": 100.0, "t1": 110.0, "posts": [["pp-bwd", 0, 101.9]],
         "compute": [["F", 0, 101.6, 101.7], ["B", 0, 101.7, 101.9]]}
    rows = b1.timeline([[a], [b]], 1)
    assert rows == [[("pp-fwd", 0, 0.1, 1.6), ("pp-bwd", 0, 1.9, 3.0)]]


def test_stand_in_stage_sleeps_its_slot_and_runs_backwards_in_order():
    log = []
    step = b1.SleepStep(0.03, (4,), last=True, log=log, M=2)
    loss = step.forward(None, 0)
    assert loss.shape == () and step.forward(None, 1) is loss   # the last stage: a loss
    g0, g1 = step.backward(None, loss, None), step.backward(None, loss, None)
    assert g0.shape == (4,) and g1 is g0
    assert [(k, mb) for k, mb, _, _ in log] == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    f, bwd = log[0][3] - log[0][2], log[2][3] - log[2][2]
    assert f >= 0.01 and bwd >= 0.02   # a third and two thirds of the slot
