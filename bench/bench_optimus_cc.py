"""Optimus-CC end to end: uncompressed vs CB+LEP+FE+SC on the demo model at pp=4, dp=2.

Every run uses the same seed, data and flags apart from compression; they run one after the
other in this invocation and the table puts them side by side: final validation loss and its
gap (target <= 1%), bytes per channel per iteration with the ratio against uncompressed bytes,
and time per iteration. Runs:

  baseline           no compression
  baseline-mb2       the same at micro-batch 2 (M = 8): the same global batches, only float
                     rounding and dropout masks differ, so its gap is the run-to-run noise of
                     this comparison
  CB+LEP+FE+SC       the paper's configuration (its tbl2 CB-FE-SC script): CB rank 16 on the
                     backward sends on 1F1B's critical path (--inter-grad-comp-epilogue-only),
                     LEP, FE, SC rank 8 on stages 0-2
  ours               the same, plus two of our options: the LEP error is delivered whole by
                     the next uncompressed send (--lep-flush-on-uncompressed) and the first 10%
                     of iterations send uncompressed (--inter-grad-comp-warm-up 0.1, as SC)
  ours r32           the same at CB rank 32
  CB-all+LEP+FE+SC   CB rank 16 on every backward send (more bytes saved, more loss)

Micro-batch 1 with global batch 32 gives M = 16 micro-batches per replica (the paper's runs
have M >= 16): with M = 4 at pp = 4 nearly every send would be in the cool-down and
epilogue-only would mean compress-everything.

    python bench/bench_optimus_cc.py [--iters 300] [--runs baseline,CB+LEP+FE+SC]

Writes bench/results/optimus_cc.md, the curves bench/results/optimus_cc_loss.png and the raw
numbers optimus_cc.json (--replot redraws table and plot from it without training).
"""
import argparse
import dataclasses
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from runlog import RunResult, plot_losses, run_pretrain  # noqa: E402

from megatron.training.checkpointing.save_load import atomic_write_text  # noqa: E402

DEMO = ["--pipeline-model-parallel-size", "4", "--num-layers", "4", "--hidden-size", "128",
        "--num-attention-heads", "4", "--seq-length", "128", "--micro-batch-size", "1",
        "--global-batch-size", "32", "--lr", "1e-3", "--min-lr", "1e-4",
        "--lr-warmup-fraction", "0.0667", "--lr-decay-style", "cosine", "--log-interval", "10",
        "--eval-iters", "8", "--seed", "1234"]
FE_SC = ["--emb-comm-opt", "--grad-comp", "--grad-comp-rank", "8", "--grad-comp-warm-up", "0.1",
         "--selective-grad-comp", "--selective-grad-comp-way", "3"]
LEP, EPILOGUE = ["--use-error-feedback"], ["--inter-grad-comp-epilogue-only"]
OURS = ["--lep-flush-on-uncompressed", "--inter-grad-comp-warm-up", "0.1"]


def cb(rank: int):
    return ["--inter-grad-comp", "--inter-grad-comp-rank", str(rank)]


RUNS = {
    "baseline": [],
    "baseline-mb2": ["--micro-batch-size", "2"],   # later flags win in argparse
    "CB+LEP+FE+SC": cb(16) + EPILOGUE + LEP + FE_SC,
    "ours": cb(16) + EPILOGUE + LEP + OURS + FE_SC,
    "ours r32": cb(32) + EPILOGUE + LEP + OURS + FE_SC,
    "CB-all+LEP+FE+SC": cb(16) + LEP + FE_SC,
}
CHANNELS = ("pp-fwd", "pp-bwd", "dp", "emb")


def table(runs, iters: int) -> str:
    base = runs[0]
    rows = [f"demo GPT (4 layers, hidden 128, seq 128), pp=4 x dp=2, micro-batch 1, global batch "
            f"32 (M=16), {iters} iterations; CB rank 16 unless named, SC rank 8 on stages 0-2 (10% warm-up), "
            f"FE. Bytes per iteration at the last log line; ratio against the uncompressed "
            f"bytes of the same messages.", "",
            "| | " + " | ".join(r.name for r in runs) + " |",
            "|---|" + "---:|" * len(runs)]

    def row(label, cells):
        rows.append(f"| {label} | " + " | ".join(cells) + " |")

    row("final validation loss", [f"{r.final_valid:.4f}" for r in runs])
    row("gap vs baseline", [f"{(r.final_valid - base.final_valid) / base.final_valid * 100:+.2f}%"
                            for r in runs])
    for ch in CHANNELS:
        if any(ch in r.bytes_per_iter for r in runs):
            row(f"{ch} MB/iter (ratio)", [f"{r.bytes_per_iter.get(ch, 0) / 1e6:.2f} "
                                          f"(x{r.ratio.get(ch, 1.0):.1f})" for r in runs])
    row("all channels MB/iter", [f"{sum(r.bytes_per_iter.values()) / 1e6:.2f}" for r in runs])
    row("time per iteration (ms)", [f"{r.steady_ms:.0f}" for r in runs])
    return "\n".join(rows)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=300, help="training iterations per run")
    p.add_argument("--runs", default=",".join(RUNS),
                   help=f"comma-separated subset of {', '.join(RUNS)} (baseline is always run)")
    p.add_argument("--out", default=os.path.join(HERE, "results"),
                   help="directory of optimus_cc.md, .json and optimus_cc_loss.png")
    p.add_argument("--replot", action="store_true",
                   help="redraw the table and plot from optimus_cc.json in --out and exit")
    a = p.parse_args()
    raw = os.path.join(a.out, "optimus_cc.json")
    if a.replot:
        with open(raw) as f:
            saved = json.load(f)
        iters = saved["iters"]
        runs = [RunResult(r["name"], losses={int(k): v for k, v in r["losses"].items()},
                          valid={int(k): v for k, v in r["valid"].items()},
                          ms_per_iter=r["ms_per_iter"], bytes_per_iter=r["bytes_per_iter"],
                          ratio=r["ratio"]) for r in saved["runs"]]
    else:
        names = ["baseline"] + [n for n in a.runs.split(",") if n and n != "baseline"]
        unknown = [n for n in names if n not in RUNS]
        if unknown:
            p.error(f"--runs: unknown {', '.join(unknown)}; choose from {', '.join(RUNS)}")
        iters = a.iters
        common = DEMO + ["--train-iters", str(iters), "--eval-interval", str(max(iters // 6, 1))]
        runs = []
        for name in names:
            runs.append(run_pretrain(name, 8, common + RUNS[name]))
            print(f"{name}: final validation loss {runs[-1].final_valid:.4f}", flush=True)
        os.makedirs(a.out, exist_ok=True)
        keep = ("name", "losses", "valid", "ms_per_iter", "bytes_per_iter", "ratio")
        atomic_write_text(raw, json.dumps({"iters": iters, "runs": [
            {k: v for k, v in dataclasses.asdict(r).items() if k in keep} for r in runs]}))
    text = table(runs, iters)
    print("\n" + text)
    atomic_write_text(os.path.join(a.out, "optimus_cc.md"), text + "\n")
    plot = os.path.join(a.out, "optimus_cc_loss.png")
    plot_losses(runs, plot, "demo GPT, pp=4 dp=2: baseline vs Optimus-CC")
    print(f"table: {os.path.join(a.out, 'optimus_cc.md')}\nloss curves: {plot}")


if __name__ == "__main__":
    main()
