"""Optimus-CC end to end: uncompressed vs CB+LEP+FE+SC on the demo model at pp=4, dp=2.

Both runs use the same seed, data and flags apart from compression; they run one after the
other in this invocation and the table puts them side by side: final validation loss and its
gap (target <= 1%), bytes per channel per iteration with the ratio against uncompressed bytes,
and time per iteration. The loss curves go to bench/results/optimus_cc_loss.png.

    python bench/bench_optimus_cc.py [--iters 300]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runlog import plot_losses, run_pretrain  # noqa: E402

DEMO = ["--pipeline-model-parallel-size", "4", "--num-layers", "4", "--hidden-size", "128",
        "--num-attention-heads", "4", "--seq-length", "128", "--micro-batch-size", "4",
        "--global-batch-size", "32", "--lr", "1e-3", "--min-lr", "1e-4",
        "--lr-warmup-iters", "20", "--lr-decay-style", "cosine", "--log-interval", "10",
        "--eval-iters", "8", "--seed", "1234"]
FE_SC = ["--emb-comm-opt", "--grad-comp", "--grad-comp-rank", "8", "--grad-comp-warm-up", "0.1",
         "--selective-grad-comp", "--selective-grad-comp-way", "3"]
OPTIMUS = ["--inter-grad-comp", "--inter-grad-comp-rank", "16", "--use-error-feedback"] + FE_SC
# The same without LEP: at this model size LEP's carried error costs more than it repairs.
NO_LEP = ["--inter-grad-comp", "--inter-grad-comp-rank", "16"] + FE_SC


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=300, help="training iterations per run")
    a = p.parse_args()
    common = DEMO + ["--train-iters", str(a.iters), "--eval-interval", str(max(a.iters // 6, 1))]
    runs = [run_pretrain("baseline", 8, common),
            run_pretrain("CB+LEP+FE+SC", 8, common + OPTIMUS),
            run_pretrain("CB+FE+SC", 8, common + NO_LEP)]
    base = runs[0]
    print(f"\nOptimus-CC on the demo GPT (4 layers, hidden 128, seq 128), pp=4 x dp=2, "
          f"{a.iters} iterations, CB rank 16 (+LEP), FE, SC rank 8 on stages 0-2\n")
    print(f"{'':26s}" + "".join(f"{r.name:>16s}" for r in runs))
    print(f"{'final validation loss':26s}" + "".join(f"{r.final_valid:16.4f}" for r in runs))
    print(f"{'gap vs baseline':26s}" + "".join(
        f"{(r.final_valid - base.final_valid) / base.final_valid * 100:15.2f}%" for r in runs))
    for ch in ("pp-fwd", "pp-bwd", "dp", "emb"):
        if not any(ch in r.bytes_per_iter for r in runs):
            continue
        print(f"{ch + ' MB/iter (ratio)':26s}" + "".join(
            f"{r.bytes_per_iter.get(ch, 0) / 1e6:9.2f} (x{r.ratio.get(ch, 1.0):3.1f})" for r in runs))
    print(f"{'all channels MB/iter':26s}" + "".join(
        f"{sum(r.bytes_per_iter.values()) / 1e6:16.2f}" for r in runs))
    print(f"{'time per iteration (ms)':26s}" + "".join(f"{r.steady_ms:16.1f}" for r in runs))
    print("(ratio: against the uncompressed bytes of the same messages; FE's emb ratio counts "
          "the dp all-reduce of the embedding it removes)")
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "optimus_cc_loss.png")
    plot_losses(runs, out, "demo GPT, pp=4 dp=2: baseline vs Optimus-CC")
    print(f"loss curves: {out}")


if __name__ == "__main__":
    main()
