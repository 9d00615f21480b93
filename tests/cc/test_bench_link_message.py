"""bench/bench_link_message.py without root: the rule it checks and its table."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import bench_link_message as blm  # noqa: E402


def test_rule_is_the_cost_models_transfer_after_a_full_refill():
    # 5 Mbit/s as TCP payload (x 1448/1514), 128 KiB burst as payload, 100 us latency
    bps = 5e6 / 8 * 1448 / 1514
    burst = 128 * 1024 * 1448 / 1514
    assert blm.rule_ms("5mbit", 2**20) == pytest.approx(0.1 + 1e3 * (2**20 - burst) / bps)
    assert blm.rule_ms("5mbit", 64 * 1024) == pytest.approx(0.1)   # inside the bucket


def test_table_gives_mean_and_worst_per_direction():
    rows = [{"rate": "5mbit", "bytes": 2**20, "pattern": "alone", "rule_ms": 1544.3,
             "a_to_b_ms": [1545.0, 1546.0, 1950.0], "b_to_a_ms": []},
            {"rate": "5mbit", "bytes": 2**20, "pattern": "crossing +0.3 s", "rule_ms": 1544.3,
             "a_to_b_ms": [1546.0, 1697.0], "b_to_a_ms": [1547.0, 1548.0, 1549.0]}]
    lines = blm.table(rows).splitlines()
    assert lines[2] == "| 5mbit | 1 MiB | alone | 1544 | 1680 (1950) | - |"
    assert lines[3] == "| 5mbit | 1 MiB | crossing +0.3 s | 1544 | 1622 (1697) | 1548 (1549) |"
