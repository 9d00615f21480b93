"""`make gpu-check`: the GPU correctness tests (tests/gpu), then the GPU benchmark
(bench/bench_gpu.py), within one time budget that fits a 10-minute run on one H100.

    python tools/gpu_check.py [--quick] [--out DIR] [--budget-s S] [--no-bench] [-k EXPR]

1. Correctness first: a table of checks (CHECKS), each a pytest selection run in a subprocess
   of its own with its own timeout (at most what is left of the budget); on a timeout its whole
   process group (the spawned ranks too) is killed and the check fails. One PASS/FAIL/SKIP line
   per test. A check that no longer fits in the budget fails as "not run".
2. Then the benchmark, with what is left: its `PERF ... target met|missed` lines are relayed.
3. Exit status: 1 if any correctness check failed or did not run, else 0. Performance never
   changes it (a missed target is a measurement), nor does a benchmark that did not finish.

--quick runs the checks marked quick and the benchmark's --quick subset: under 5 minutes.
Without CUDA (or without torch) it prints one line and exits 0: CPU CI and laptops.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPU_TESTS = "tests/gpu"
FULL_BUDGET_S = 560    # of a 600 s device call: the install line and the transfer need the rest
QUICK_BUDGET_S = 280   # --quick: under 5 minutes in all
# kept for the benchmark out of the budget (full, quick); the full benchmark took ~100 s on an H200
BENCH_SHARE_S = {False: 130, True: 90}
MIN_CHECK_S = 20       # a check is not started with less than this left
_TEST_LINE = re.compile(r"^(\S+\.py::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")


@dataclass(frozen=True)
class Check:
    """One correctness check: pytest node ids run together in one subprocess."""
    name: str
    nodes: Tuple[str, ...]
    timeout_s: int    # wall clock for the subprocess (spawned ranks, CUDA set-up included)
    quick: bool       # part of --quick


def _t(name):
    return f"{GPU_TESTS}/test_training_cuda.py::{name}"


# Timeouts: about twice what each check took on an H200 (2026-11-26: 24, 43, 39, 32, 66, 52,
# 35 and ~50 s; the other tests/gpu files ~60 s), so a full check fits its budget.
CHECKS: Tuple[Check, ...] = (
    Check("codecs on CUDA", (f"{GPU_TESTS}/test_codecs_cuda.py",), 60, True),
    Check("fp32 GPU == CPU", (_t("test_fp32_gpu_losses_equal_cpu"),
                              _t("test_learned_subspace_pp2_gpu_losses_equal_cpu")), 130, True),
    Check("fp16 dynamic loss scale", (_t("test_fp16_with_dynamic_loss_scale_trains"),), 80, True),
    Check("bf16 resume + reshard", (_t("test_bf16_resume_is_exact_and_reshard_keeps_"
                                       "optimizer_state"),), 70, True),
    Check("bf16 tracks fp32", (_t("test_bf16_tracks_fp32_over_100_iterations"),), 120, False),
    Check("(2,2,2) on one GPU", (_t("test_222_on_one_gpu_over_gloo_matches_111"),), 100, False),
    Check("resume, 8 ranks", (_t("test_resume_bit_exact_8_ranks_on_one_gpu"),), 80, False),
    Check("export to HF", (f"{GPU_TESTS}/test_export_cuda.py",), 100, False),
    Check("interleaving, SP, distributed optimizer", (f"{GPU_TESTS}/test_scaling_cuda.py",),
          150, False),
)


@dataclass
class Result:
    status: str    # PASS, FAIL or SKIP
    text: str


def _env():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p), PYTHONUNBUFFERED="1")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def plan(quick: bool, select: Optional[str] = None, root: str = ROOT) -> List[Check]:
    """The checks to run, in order. Full runs add a check for any tests/gpu file the table
    does not name (a new GPU test is never silently left out)."""
    checks = [c for c in CHECKS if c.quick or not quick]
    if not quick:
        named = {n.split("::")[0] for c in CHECKS for n in c.nodes}
        files = sorted(f"{GPU_TESTS}/{f}" for f in os.listdir(os.path.join(root, GPU_TESTS))
                       if f.startswith("test_") and f.endswith(".py"))
        rest = tuple(f for f in files if f not in named)
        if rest:
            checks.append(Check("other tests/gpu files", rest, 180, False))
    if select:
        checks = [c for c in checks if select.lower() in c.name.lower()
                  or any(select in n for n in c.nodes)]
    return checks


def parse_pytest(output: str) -> List[Result]:
    """One Result per test line of `pytest -v`."""
    out = []
    for line in output.splitlines():
        m = _TEST_LINE.match(line)
        if m:
            node, verdict = m.groups()
            status = {"PASSED": "PASS", "XFAIL": "PASS", "SKIPPED": "SKIP"}.get(verdict, "FAIL")
            out.append(Result(status, f"test {node}" + (" (skipped)" if status == "SKIP"
                                                         else "")))
    return out


def run_check(check: Check, timeout_s: float, log) -> List[Result]:
    """Run one check's tests in a new process group; kill the group on timeout."""
    # one line per test (pyproject's addopts has -q), no cache written into the tree
    cmd = [sys.executable, "-m", "pytest", *check.nodes, "-o", "addopts=", "-v", "-p",
           "no:cacheprovider", "-o", "console_output_style=classic"]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)   # pytest and every rank it spawned
        output, _ = proc.communicate()
        timed_out = True
    log.write(f"==== {check.name} ({time.monotonic() - t0:.0f} s)\n{output}\n")
    results = parse_pytest(output)
    if timed_out:
        results.append(Result("FAIL", f"check {check.name}: timed out after {timeout_s:.0f} s "
                                      f"(tests without a line above did not finish)"))
    elif proc.returncode not in (0, 1) or (proc.returncode == 1 and
                                          not any(r.status == "FAIL" for r in results)):
        results.append(Result("FAIL", f"check {check.name}: pytest exited {proc.returncode} "
                                      f"(collection error or no test selected; see the log)"))
    elif not results:
        results.append(Result("FAIL", f"check {check.name}: no test ran"))
    return results


def run_checks(checks: Sequence[Check], budget_s: float, log, runner=run_check) -> List[Result]:
    """Every check, each with min(its timeout, what is left of budget_s)."""
    deadline = time.monotonic() + budget_s
    results = []
    for check in checks:
        left = deadline - time.monotonic()
        if left < MIN_CHECK_S:
            results.append(Result("FAIL", f"check {check.name}: not run (time budget spent)"))
            continue
        print(f"gpu-check: {check.name} (timeout {min(check.timeout_s, left):.0f} s)",
              flush=True)
        results.extend(runner(check, min(check.timeout_s, left), log))
    return results


def run_bench(quick: bool, timeout_s: float, out_dir: str, log) -> Tuple[List[str], str]:
    """(PERF lines, a note when the benchmark did not finish)."""
    cmd = [sys.executable, "bench/bench_gpu.py", "--json", os.path.join(out_dir, "bench_gpu.json"),
           # no new section starts this close to the timeout: the table so far comes back
           "--deadline-s", f"{max(timeout_s - 45, timeout_s / 2):.0f}"] + (["--quick"] if quick else [])
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout_s)
        note = "" if proc.returncode == 0 else f"bench/bench_gpu.py exited {proc.returncode}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        note = f"bench/bench_gpu.py stopped after {timeout_s:.0f} s (time budget)"
    sys.stdout.write(output)
    log.write(f"==== benchmark\n{output}\n")
    with open(os.path.join(out_dir, "bench_gpu.md"), "w") as f:
        f.write(output)
    return [l for l in output.splitlines() if l.startswith("PERF ")], note


def summarize(results: Sequence[Result], perf: Sequence[str], bench_note: str = ""
              ) -> Tuple[List[str], int]:
    """The summary lines and the exit status (correctness only)."""
    lines = [f"{r.status} {r.text}" for r in results]
    lines += list(perf)
    if bench_note:
        lines.append(f"NOTE {bench_note} (performance only: the exit status ignores it)")
    failed = sum(r.status == "FAIL" for r in results)
    passed = sum(r.status == "PASS" for r in results)
    met = sum(l.endswith("target met") for l in perf)
    lines.append(f"gpu-check: correctness {passed} passed, {failed} failed; performance "
                 f"{met} of {len(perf)} targets met")
    return lines, 1 if failed else 0


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the checks marked quick and the "
                   "benchmark's --quick subset: under 5 minutes")
    p.add_argument("--out", default=None, help="directory for the log and the benchmark "
                   "results (default: a temporary one)")
    p.add_argument("--budget-s", type=float, default=None, help=f"wall-clock seconds for the "
                   f"whole check (default {FULL_BUDGET_S}, {QUICK_BUDGET_S} with --quick)")
    p.add_argument("--no-bench", action="store_true", help="correctness checks only")
    p.add_argument("-k", dest="select", default=None, help="only the checks whose name or "
                   "test node contains this text")
    a = p.parse_args(argv)
    if a.budget_s is not None and a.budget_s <= MIN_CHECK_S:
        p.error(f"--budget-s must be more than {MIN_CHECK_S} seconds, got {a.budget_s:g}")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    try:
        import torch
    except ImportError:
        print(f"gpu-check: torch is not importable by {sys.executable}, so no CUDA here; "
              f"nothing to check")
        return 0
    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device on this machine (torch.cuda.is_available() is False); "
              "nothing to check")
        return 0
    start = time.monotonic()
    budget = a.budget_s or (QUICK_BUDGET_S if a.quick else FULL_BUDGET_S)
    bench_share = 0 if a.no_bench else min(BENCH_SHARE_S[a.quick], budget / 2)
    out = a.out or tempfile.mkdtemp(prefix="gpu_check_")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "gpu_check.log"), "w") as log:
        results = run_checks(plan(a.quick, a.select), budget - bench_share, log)
        perf, note = [], ""
        if not a.no_bench:
            perf, note = run_bench(a.quick, budget - (time.monotonic() - start), out, log)
    lines, status = summarize(results, perf, note)
    print(f"\n==== gpu-check{' --quick' if a.quick else ''} on {torch.cuda.get_device_name()} "
          f"(torch {torch.__version__}, {time.monotonic() - start:.0f} s; log in {out})")
    print("\n".join(lines))
    return status


if __name__ == "__main__":
    sys.exit(main())
