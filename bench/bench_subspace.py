"""Subspace Networks from scratch: pipeline bytes and loss against the uncompressed run.

The demo model's shape (4 layers, hidden 128, 4 heads, seq 128, micro-batch 4, global batch
32, the demo's learning-rate schedule) on the embedded corpus, trained from scratch once per
configuration, same seed and data:
  none          the ordinary model, uncompressed pipeline (the baseline)
  sub-kK-bB     --forward-compress-method subspace --subspace-rank K --subspace-bits B
                (B 0: coefficients unquantised, exact both ways; else B-bit fixpoint)
Every run has dropout off (the subspace model needs --hidden-dropout 0; the baseline the same,
so the table compares the constraint and the wire alone). Prints a table of pp-fwd / pp-bwd /
emb bytes per iteration with their ratio against the uncompressed fp32 messages (as logged),
the final training loss (mean of the last log interval's line), the final validation loss and
its gap to the baseline; writes bench/results/subspace.md and .json.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_subspace.py               # 300 iterations
    .venv/bin/python bench/bench_subspace.py --iters 100 --runs none,sub-k8-b4
    .venv/bin/python bench/bench_subspace.py --layout 1,2     # tp 1 x pp 2: 2 processes
    # + fine-tuning from an imported model: the none run's final checkpoint, exported to
    # Hugging Face, imported at each subspace run's k (tools/checkpoint/subspace_hf.py), then
    # 50 iterations of each run's flags, against the none model continued the same 50
    .venv/bin/python bench/bench_subspace.py --layout 1,2 --nproc 2 --finetune-iters 50

Layouts give the same losses (tests/training/test_subspace.py: (2,2,2) against (1,1,1)), so a
smaller --layout measures the same losses; the byte ratios differ only by the fixpoint scales'
share (one 16-bit scale per coefficient per message, messages of S/tp x B tokens).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)
from runlog import run_pretrain, save_runs  # noqa: E402

DEMO = ["--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "4",
        "--seq-length", "128", "--micro-batch-size", "4", "--global-batch-size", "32",
        "--lr", "1e-3", "--min-lr", "1e-4", "--lr-decay-style", "cosine",
        "--attention-dropout", "0", "--hidden-dropout", "0", "--seed", "1234"]
_RUN = re.compile(r"^sub-k(\d+)-b(\d+)$")
DEFAULT_RUNS = "none,sub-k10-b4,sub-k8-b4,sub-k8-b0,sub-k32-b4"


def run_flags(label: str) -> list:
    """Flags of one configuration label (see the module docstring)."""
    if label == "none":
        return []
    m = _RUN.match(label)
    if not m:
        raise SystemExit(f"unknown run {label!r}: none or sub-k<K>-b<B>")
    # the paper's model, as the results of this bench were measured (the method's default
    # projects only the stage boundary)
    return ["--forward-compress-method", "subspace", "--subspace-rank", m.group(1),
            "--subspace-bits", m.group(2), "--subspace-constrain", "writes"]


def table(results, base) -> list:
    rows = ["| run | pp-fwd bytes/iter (ratio) | pp-bwd bytes/iter (ratio) | emb bytes/iter | "
            "train loss | validation loss | gap to none | ms/iter |",
            "|---|---|---|---|---|---|---|---|"]
    tuned = next((r.final_valid for r in results if r.name == "none-ft"), None)
    for r in results:
        ref = tuned if r.name.endswith("-ft") else base
        def ch(name):
            b = r.bytes_per_iter.get(name)
            return "-" if b is None else f"{b / 1024:.1f} KB (x{r.ratio.get(name, 1):.1f})"
        last = r.losses[max(r.losses)] if r.losses else float("nan")
        v = r.final_valid
        gap = "" if ref is None or v is None else f"{100 * (v - ref) / ref:+.2f}%"
        rows.append(f"| {r.name} | {ch('pp-fwd')} | {ch('pp-bwd')} | {ch('emb')} | "
                    f"{last:.4f} | {v:.4f} | {gap} | {r.steady_ms:.0f} |")
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--iters", type=int, default=300, help="Training iterations per run.")
    p.add_argument("--runs", default=DEFAULT_RUNS,
                   help=f"Comma-separated labels: none, sub-k<K>-b<B> (default {DEFAULT_RUNS}).")
    p.add_argument("--layout", default="2,2", help="tp,pp (dp fills --nproc); default 2,2.")
    p.add_argument("--nproc", type=int, default=8, help="Processes (default 8: dp 2 at 2,2).")
    p.add_argument("--eval-iters", type=int, default=4, help="Validation iterations.")
    p.add_argument("--port", type=int, default=29671, help="torchrun master port.")
    p.add_argument("--save-baseline", default=None,
                   help="Save the uncompressed run's final checkpoint here (to export it and "
                        "measure tools/checkpoint/subspace_hf.py's import error on a trained "
                        "model).")
    p.add_argument("--out", default=os.path.join(HERE, "results", "subspace"),
                   help="Results prefix (.md and .json are written).")
    p.add_argument("--finetune-iters", type=int, default=0,
                   help="Also fine-tune from an imported model for this many iterations "
                        "(0: off; needs the none run): rows <run>-ft (lr 3e-4 cosine).")
    p.add_argument("--extra", default="",
                   help="Flags appended to every run, e.g. \"--seed 4321\" (a second seed).")
    a = p.parse_args(argv)
    tp, pp = (int(x) for x in a.layout.split(","))
    layout = ["--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp)]
    common = DEMO + layout + [
        "--train-iters", str(a.iters), "--lr-warmup-iters", str(min(20, a.iters // 10)),
        "--log-interval", str(max(1, min(20, a.iters // 10))),
        "--eval-interval", str(max(1, a.iters // 3)), "--eval-iters", str(a.eval_iters)] \
        + a.extra.split()
    labels = a.runs.split(",")
    if a.finetune_iters and "none" not in labels:
        raise SystemExit("--finetune-iters fine-tunes the none run's model: add none to --runs")
    work = tempfile.mkdtemp(prefix="bench_subspace_") if a.finetune_iters else None
    try:
        results = _runs(a, labels, common, layout, work, tp, pp)
    finally:   # exports and imports (--save-baseline stays)
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
    print("\n".join(table(results, _base(results))))
    return 0


def _runs(a, labels, common, layout, work, tp, pp) -> list:
    """Each run of --runs, then (--finetune-iters) the fine-tuned rows."""
    baseline = a.save_baseline or (os.path.join(work, "base") if work else None)
    results = []
    for label in labels:
        save = ["--save", baseline, "--save-interval", str(a.iters)] \
            if label == "none" and baseline else []
        r = run_pretrain(label, a.nproc, common + run_flags(label) + save, port=a.port)
        results.append(r)
        print(f"{label:14s} valid {r.final_valid:.4f}  pp-fwd x{r.ratio.get('pp-fwd', 1):.1f}  "
              f"pp-bwd x{r.ratio.get('pp-bwd', 1):.1f}  {r.steady_ms:.0f} ms/iter "
              f"({r.wall_s:.0f} s)", flush=True)
        write(a, tp, pp, results)   # after every run: a long bench cut short keeps its rows
    if a.finetune_iters:
        finetune(a, labels, baseline, work, layout + a.extra.split(), results, tp, pp)
    return results


def finetune(a, labels, baseline, work, layout, results, tp, pp) -> None:
    """none-ft: the baseline continued; <run>-ft: imported at the run's k, then trained with
    its flags. The table's gap column compares the -ft rows with none-ft."""
    tool = os.path.join(ROOT, "tools", "checkpoint")
    hf = os.path.join(work, "base_hf")
    subprocess.run([sys.executable, os.path.join(tool, "export_hf.py"), "--load", baseline,
                    "--output", hf, "--no-progress"], check=True, cwd=ROOT)
    ft = DEMO[:] + layout + [
        "--lr", "3e-4", "--min-lr", "3e-5",
        "--lr-warmup-iters", str(min(5, a.finetune_iters // 10)),
        "--train-iters", str(a.finetune_iters), "--finetune",
        "--log-interval", str(max(1, min(10, a.finetune_iters // 5))),
        "--eval-interval", str(a.finetune_iters), "--eval-iters", str(a.eval_iters)]
    for label in labels:
        load = baseline
        if label != "none":
            load = os.path.join(work, label)
            k = _RUN.match(label).group(1)
            subprocess.run([sys.executable, os.path.join(tool, "subspace_hf.py"),
                            "--hf-model", hf, "--save", load, "--subspace-rank", k,
                            "--tensor-model-parallel-size", str(tp),
                            "--pipeline-model-parallel-size", str(pp), "--coefficients"],
                           check=True, cwd=ROOT)
        r = run_pretrain(label + "-ft", a.nproc, ft + run_flags(label) + ["--load", load],
                         port=a.port)
        results.append(r)
        print(f"{label + '-ft':14s} valid {r.final_valid:.4f} ({r.wall_s:.0f} s)", flush=True)
        write(a, tp, pp, results)


def _base(results):
    return next((r.final_valid for r in results if r.name == "none"), None)


def write(a, tp, pp, results) -> None:
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out + ".md", "w") as f:
        f.write(f"Subspace Networks from scratch, demo shape, {a.iters} iterations, tp {tp} x "
                f"pp {pp} x {a.nproc} processes, dropout off\n\n"
                + "\n".join(table(results, _base(results))) + "\n")
    save_runs(a.out + ".json", a.iters, results, {"layout": a.layout, "nproc": a.nproc})


if __name__ == "__main__":
    sys.exit(main())
