"""bench/bench_link_duplex.py without root: its table, and a bad rate named before any
namespace exists."""
import os
import subprocess
import sys

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
import bench_link_duplex as bld  # noqa: E402


def test_table_gives_the_ratios_to_one_way():
    row = {"rate": "20mbit", "messages": 9, "bytes": 2**20, "one_way": 2.0, "both_ways": 3.4,
           "both_recv_first": 2.1, "alternate": 4.0, "both_over_one": 1.7,
           "recv_first_over_one": 1.05, "alternate_over_one": 2.0}
    lines = bld.table([row]).splitlines()
    assert lines[0].startswith("| link | messages x size | one way s | both ways, send first s")
    assert lines[2] == ("| 20mbit | 9 x 1 MiB | 2.000 | 3.400 | 2.100 | 4.000 | 1.70 | 1.05 | "
                        "2.00 |")


def test_tbf_queue_by_default_and_in_milliseconds():
    import bench_slow_link as bsl
    assert bsl.tbf_limit("5mbit") == 512 * 1024                  # the floor
    assert bsl.tbf_limit("1gbit") == int(1e9 / 8 * 0.3)         # 300 ms above it
    assert bsl.tbf_limit("20mbit", queue_ms=20) == int(20e6 / 8 * 0.02) + 128 * 1024


def test_a_bad_rate_is_named_before_root_is_needed():
    r = subprocess.run([sys.executable, bld.__file__, "--rates", "20mbps"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "--rates: ['20mbps'] is not a list of none" in r.stderr
