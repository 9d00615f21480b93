"""`make gpu-check`: the GPU tests (tests/gpu) and the GPU benchmark (bench/bench_gpu.py) on
any CUDA machine, ending with one PASS/FAIL line per item and a summary.

Without CUDA it says so in one line and exits 0 (CPU CI and laptops). Exit status 1 when an
item fails.

    python tools/gpu_check.py [--out DIR] [--bench-iters 20] [--no-bench] [-k EXPR]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p), PYTHONUNBUFFERED="1")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_tests(out_dir, select):
    xml = os.path.join(out_dir, "gpu_tests.xml")
    cmd = [sys.executable, "-m", "pytest", "tests/gpu", "-q", "-p", "no:cacheprovider",
           f"--junitxml={xml}", "-s"] + (["-k", select] if select else [])
    subprocess.run(cmd, cwd=ROOT, env=_env())
    lines = []
    if not os.path.isfile(xml):
        return [(False, "tests/gpu: pytest wrote no report (collection failed?)")]
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
        if case.find("skipped") is not None:
            lines.append((None, f"test {name} (skipped)"))
        else:
            failed = case.find("failure") is not None or case.find("error") is not None
            lines.append((not failed, f"test {name}"))
    return lines


def run_bench(out_dir, iters):
    cmd = [sys.executable, "bench/bench_gpu.py", "--iters", str(iters),
           "--json", os.path.join(out_dir, "bench_gpu.json")]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True)
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr[-4000:])
    with open(os.path.join(out_dir, "bench_gpu.md"), "w") as f:
        f.write(proc.stdout)
    lines = [(l.startswith("PASS"), l.split(" ", 1)[1]) for l in proc.stdout.splitlines()
             if l.startswith(("PASS ", "FAIL "))]
    if proc.returncode != 0 or not lines:
        lines.append((False, f"bench/bench_gpu.py exited {proc.returncode}"))
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="Directory for the test report and benchmark "
                   "results (default: a temporary one).")
    p.add_argument("--bench-iters", type=int, default=20, help="Timed iterations per "
                   "benchmark measurement.")
    p.add_argument("--no-bench", action="store_true", help="Run the tests only.")
    p.add_argument("-k", dest="select", default=None, help="pytest -k expression for tests/gpu.")
    a = p.parse_args(argv)
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
    out = a.out or tempfile.mkdtemp(prefix="gpu_check_")
    os.makedirs(out, exist_ok=True)
    lines = run_tests(out, a.select)
    if not a.no_bench:
        lines += run_bench(out, a.bench_iters)
    print(f"\n==== gpu-check on {torch.cuda.get_device_name()} (torch {torch.__version__}) ====")
    for ok, text in lines:
        print(f"{'SKIP' if ok is None else 'PASS' if ok else 'FAIL'} {text}")
    failed = sum(ok is False for ok in lines)
    passed = sum(ok is True for ok in lines)
    print(f"gpu-check: {passed} passed, {failed} failed; reports in {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
