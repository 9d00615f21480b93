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
OPTIMUS = ["--inter-grad-comp", "--inter-grad-comp-rank", "16", "--use-error-feedback",
           "--emb-comm-opt", "--grad-comp", "--grad-comp-rank", "8", "--grad-comp-warm-up",
           "0.1", "--selective-grad-comp", "--selective-grad-comp-way", "3"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=300, help="training iterations per run")
    a = p.parse_args()
    common = DEMO + ["--train-iters", str(a.iters), "--eval-interval", str(max(a.iters // 6, 1))]
    runs = [run_pretrain("baseline", 8, common), run_pretrain("CB+LEP+FE+SC", 8, common + OPTIMUS)]
    base, opt = runs
    print(f"\nOptimus-CC on the demo GPT (4 layers, hidden 128, seq 128), pp=4 x dp=2, "
          f"{a.iters} iterations, CB rank 16 + LEP, FE, SC rank 8 on stages 0-2\n")
    print(f"{'':28s}{'baseline':>16s}{'CB+LEP+FE+SC':>16s}")
    print(f"{'final validation loss':28s}{base.final_valid:16.4f}{opt.final_valid:16.4f}")
    gap = (opt.final_valid - base.final_valid) / base.final_valid * 100
    print(f"{'gap vs baseline':28s}{'':16s}{gap:15.2f}%")
    for ch in ("pp-fwd", "pp-bwd", "dp", "emb"):
        b, o = base.bytes_per_iter.get(ch), opt.bytes_per_iter.get(ch)
        if b is None and o is None:
            continue
        print(f"{ch + ' bytes/iter':28s}{(b or 0) / 1e6:14.2f}MB{(o or 0) / 1e6:14.2f}MB"
              f"   ratio x{opt.ratio.get(ch, 1.0):.1f} (vs uncompressed), "
              f"x{(b or 0) / (o or 1):.1f} (vs baseline run)")
    tb = sum(base.bytes_per_iter.values())
    to = sum(opt.bytes_per_iter.values())
    print(f"{'all channels bytes/iter':28s}{tb / 1e6:14.2f}MB{to / 1e6:14.2f}MB   x{tb / to:.2f}")
    print(f"{'time per iteration (ms)':28s}{base.steady_ms:16.1f}{opt.steady_ms:16.1f}")
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "optimus_cc_loss.png")
    plot_losses(runs, out, "demo GPT, pp=4 dp=2: baseline vs Optimus-CC")
    print(f"loss curves: {out}")


if __name__ == "__main__":
    main()
