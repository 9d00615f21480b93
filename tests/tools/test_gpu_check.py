"""tools/gpu_check.py and bench/bench_gpu.py on the CPU: one line and exit 0 without CUDA, the
arguments, the time budget (every check gets at most what is left; what no longer fits fails
as not run), per-check timeouts that kill the check's whole process group, and the exit status
(correctness only: a missed performance target or an unfinished benchmark never fails it)."""
import math
import textwrap
import time

import pytest
import torch

from bench import bench_gpu
from tools import gpu_check
from tools.gpu_check import Check, Result


# ---------------------------------------------------------------- without CUDA, arguments

@pytest.mark.parametrize("argv", [[], ["--quick"], ["--no-bench", "-k", "codecs"]])
def test_without_cuda_one_line_and_exit_0(argv, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and "no CUDA device" in out[0]


def test_bench_without_cuda_one_line_and_exit_0(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_gpu.main(["--quick"]) == 0
    assert capsys.readouterr().out.strip() == "bench_gpu: no CUDA device; nothing to measure"


@pytest.mark.parametrize("main,argv,fragment", [
    (gpu_check.main, ["--budget-s", "5"], "--budget-s must be more than 20"),
    (gpu_check.main, ["--no-such-flag"], "unrecognized arguments"),
    (bench_gpu.main, ["--iters", "0"], "--iters must be >= 1"),
])
def test_bad_arguments_exit_2_naming_the_flag(main, argv, fragment, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and fragment in capsys.readouterr().err


def test_help_explains_every_flag(capsys):
    with pytest.raises(SystemExit) as e:
        gpu_check.main(["--help"])
    text = capsys.readouterr().out
    assert e.value.code == 0
    for flag in ("--quick", "--out", "--budget-s", "--no-bench", "-k"):
        assert flag in text


# ---------------------------------------------------------------- the plan and the budget

def test_plan_quick_is_a_subset_and_full_covers_every_gpu_test_file():
    full, quick = gpu_check.plan(False), gpu_check.plan(True)
    assert {c.name for c in quick} < {c.name for c in full}
    assert all(c.quick for c in quick) and all(c.timeout_s > 0 for c in full)
    covered = {n.split("::")[0] for c in full for n in c.nodes}
    assert "tests/gpu/test_launch.py" in covered   # not in the table: the catch-all check
    assert gpu_check.plan(False, select="resume")[0].name == "bf16 resume + reshard"
    assert gpu_check.QUICK_BUDGET_S < 300 and gpu_check.FULL_BUDGET_S < 600


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_checks_share_the_budget_and_what_does_not_fit_fails(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(gpu_check.time, "monotonic", clock)
    given = []

    def runner(check, timeout, log):   # each check takes its whole timeout
        given.append((check.name, timeout))
        clock.now += timeout
        return [Result("PASS", f"test {check.name}")]
    checks = [Check("a", ("x",), 100, True), Check("b", ("y",), 100, True),
              Check("c", ("z",), 100, True)]
    results = gpu_check.run_checks(checks, budget_s=150, log=None, runner=runner)
    assert given == [("a", 100), ("b", 50)]   # b gets what is left, c no longer fits
    assert [r.status for r in results] == ["PASS", "PASS", "FAIL"]
    assert "not run (time budget spent)" in results[-1].text


def test_a_check_past_its_timeout_is_killed_with_its_processes(tmp_path):
    f = tmp_path / "test_sample.py"
    f.write_text(textwrap.dedent("""
        import subprocess, sys, time
        def test_ok():
            pass
        def test_bad():
            assert 1 == 2
        def test_hangs():
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
            open(__file__ + ".pid", "w").write(str(child.pid))
            time.sleep(120)
    """))
    log = (tmp_path / "log").open("w")
    t0 = time.monotonic()
    results = gpu_check.run_check(Check("sample", (str(f),), 10, True), 10, log)
    assert time.monotonic() - t0 < 30
    by = {r.text.split("::")[-1]: r.status for r in results if "::" in r.text}
    assert by == {"test_ok": "PASS", "test_bad": "FAIL"}
    assert results[-1].status == "FAIL" and "timed out after 10 s" in results[-1].text
    pid = int(open(str(f) + ".pid").read())   # what the test spawned died with it
    assert _dead(pid)


def _dead(pid, wait_s=5.0):
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/status") as status:
                if any(l.startswith("State:") and "Z" in l for l in status):
                    return True   # a zombie: killed, not yet reaped by its new parent
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def test_parse_pytest_lines():
    out = gpu_check.parse_pytest(
        "tests/gpu/a.py::test_x[torch.float32] PASSED\n"
        "tests/gpu/a.py::test_y SKIPPED (needs CUDA)\n"
        "tests/gpu/a.py::test_z FAILED\nsome print\ntests/gpu/b.py::test_w ERROR\n")
    assert [r.status for r in out] == ["PASS", "SKIP", "FAIL", "FAIL"]


# ---------------------------------------------------------------- performance vs exit status

@pytest.mark.parametrize("ratio,target,at_least,verdict", [
    (1.07, 1.0, True, "met"), (0.93, 1.0, True, "missed"), (0.8, 1.0, False, "met"),
    (1.25, 1.0, False, "missed"), (math.nan, 1.0, True, "missed")])
def test_perf_line_prints_the_ratio_and_met_or_missed(ratio, target, at_least, verdict):
    line = bench_gpu.perf_line("x", ratio, target, at_least)
    assert line.startswith("PERF x: ") and line.endswith(f"target {verdict}")
    assert f"(target {'>=' if at_least else '<='} 1.00x)" in line
    if not math.isnan(ratio):
        assert f"{ratio:.2f}x" in line


def test_verdicts_from_fake_results():
    training = {bench_gpu.OURS: {"tokens_per_s": 180_000, "peak_gib": 14.7},
                bench_gpu.HF_EAGER: {"tokens_per_s": 171_000, "peak_gib": 23.7},
                bench_gpu.OURS_COMPILED: {"tokens_per_s": 318_240, "peak_gib": 10.5},
                bench_gpu.HF_COMPILED: {"tokens_per_s": 306_000, "peak_gib": 10.5}}
    codecs = {"fixpoint 8-bit fitted (1024, 8, 1920) bfloat16":
              {"encode_x": 1.4, "decode_x": 1.6, "family": "fixpoint"},
              "delta 4-bit (device cache) (1024, 8, 1920) bfloat16":
              {"encode_x": 5.0, "decode_x": 2.5, "family": "delta"}}
    lines = bench_gpu.verdicts(training, codecs)
    assert lines == [
        "PERF training tokens/s ours / HF GPT2LMHeadModel eager: 1.05x (target >= 1.00x) "
        "target met",
        "PERF training tokens/s ours / HF GPT2LMHeadModel torch.compile: 0.59x "
        "(target >= 1.00x) target missed",
        "PERF training peak memory ours / HF GPT2LMHeadModel torch.compile: 1.40x "
        "(target <= 1.00x) target missed",
        "PERF training tokens/s ours with --torch-compile / HF GPT2LMHeadModel eager: 1.86x "
        "(target >= 1.00x) target met",
        "PERF training tokens/s ours with --torch-compile / HF GPT2LMHeadModel torch.compile: "
        "1.04x (target >= 1.00x) target met",
        "PERF training peak memory ours with --torch-compile / HF GPT2LMHeadModel "
        "torch.compile: 1.00x (target <= 1.00x) target met",
        "PERF codec fixpoint 8-bit fitted (1024, 8, 1920) bfloat16 encode / device copy: "
        "1.40x (target <= 1.50x) target met",
        "PERF codec fixpoint 8-bit fitted (1024, 8, 1920) bfloat16 decode / device copy: "
        "1.60x (target <= 1.00x) target missed",
        "PERF codec delta 4-bit (device cache) (1024, 8, 1920) bfloat16 encode / device copy: "
        "5.00x (target <= 4.00x) target missed",
        "PERF codec delta 4-bit (device cache) (1024, 8, 1920) bfloat16 decode / device copy: "
        "2.50x (target <= 3.00x) target met"]


def test_exit_status_is_correctness_only():
    perf = [bench_gpu.perf_line("a", 0.5, 1.0, True), bench_gpu.perf_line("b", 2.0, 1.0, True)]
    ok = [Result("PASS", "test t1"), Result("SKIP", "test t2 (skipped)")]
    lines, status = gpu_check.summarize(ok, perf, "bench/bench_gpu.py exited 1")
    assert status == 0   # a missed target and a crashed benchmark do not fail the check
    assert lines[-1] == ("gpu-check: correctness 1 passed, 0 failed; performance 1 of 2 "
                         "targets met")
    assert any(l.startswith("NOTE bench/bench_gpu.py exited 1") for l in lines)
    _, status = gpu_check.summarize(ok + [Result("FAIL", "test t3")], perf)
    assert status == 1
