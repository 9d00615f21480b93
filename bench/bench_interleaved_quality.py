"""Interleaved 1F1B with compression: loss at equal iterations against 1F1B.

One model (4 layers, hidden 128, seq 128, 8 micro-batches of 4, cosine lr 1e-3, 100 iterations,
validation over 8 batches at the end) in three pipeline layouts: pp 2 (1F1B, one stage
boundary), pp 2 with 2 chunks per rank (interleaved: virtual stages 0|1|2|3, three boundaries,
all across the pp pair), and pp 4 (1F1B over the same four virtual stages, three boundaries).
Each layout runs uncompressed and with each codec set; the gap is against the uncompressed run
of the same layout (dropout masks differ between layouts, so the uncompressed losses differ in
the fourth digit). A gradient crosses as many compressed boundaries as the layout has, so the
like-for-like 1F1B reference of pp 2 x 2 chunks is pp 4.

    python bench/bench_interleaved_quality.py [--iters 100] [--codecs cb16-lep,...]

Writes bench/results/interleaved_quality.{md,json}.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from runlog import run_pretrain  # noqa: E402

from megatron.training.checkpointing.save_load import atomic_write_text  # noqa: E402

MODEL = ["--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "4",
         "--seq-length", "128", "--micro-batch-size", "4", "--global-batch-size", "32",
         "--lr", "1e-3", "--min-lr", "1e-4", "--lr-warmup-iters", "10",
         "--lr-decay-style", "cosine", "--log-interval", "10", "--eval-iters", "8",
         "--seed", "1234"]
CB = ["--inter-grad-comp", "--inter-grad-comp-rank", "16", "--use-error-feedback"]
CODECS = {
    "uncompressed": [],
    "cb16-lep": CB,
    "fp8-cb16-lep-epilogue": ["--forward-compress-method", "fixpoint", "--forward-bits", "8",
                              "--inter-grad-comp-epilogue-only"] + CB,
    "fp4-cb16-lep": ["--forward-compress-method", "fixpoint", "--forward-bits", "4"] + CB,
}
# name -> (pp, chunks per rank)
LAYOUTS = {"1F1B pp2": (2, 1), "interleaved pp2 x 2": (2, 2), "1F1B pp4": (4, 1)}


def run(layout: str, codec: str, iters: int, port: int) -> dict:
    pp, vp = LAYOUTS[layout]
    flags = MODEL + ["--pipeline-model-parallel-size", str(pp), "--train-iters", str(iters),
                     "--eval-interval", str(iters)] + CODECS[codec]
    if vp > 1:
        flags += ["--virtual-pipeline-model-parallel-size", str(vp)]
    r = run_pretrain(f"{layout} {codec}", pp, flags, port=port)
    return dict(layout=layout, codec=codec, valid=r.final_valid, ratio=r.ratio)


def table(rows, iters: int) -> str:
    base = {r["layout"]: r["valid"] for r in rows if r["codec"] == "uncompressed"}
    out = [f"validation loss after {iters} iterations; gap against the same layout "
           "uncompressed", "",
           "| codec | layout | val loss | gap | pp-fwd / pp-bwd |", "|---|---|---:|---:|---|"]
    for r in rows:
        gap = 100 * (r["valid"] / base[r["layout"]] - 1) if r["layout"] in base else float("nan")
        ratio = f"x{r['ratio'].get('pp-fwd', 1):g} / x{r['ratio'].get('pp-bwd', 1):g}"
        out.append(f"| {r['codec']} | {r['layout']} | {r['valid']:.6f} | {gap:+.2f}% | "
                   f"{ratio} |")
    return "\n".join(out) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--codecs", default=",".join(CODECS), help=f"of {', '.join(CODECS)}")
    p.add_argument("--layouts", default=",".join(LAYOUTS), help=f"of {', '.join(LAYOUTS)}")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--port", type=int, default=29760)
    a = p.parse_args()
    codecs, layouts = a.codecs.split(","), a.layouts.split(",")
    bad = [c for c in codecs if c not in CODECS] + [x for x in layouts if x not in LAYOUTS]
    if bad:
        p.error(f"unknown --codecs/--layouts entries {bad}")
    rows = []
    for codec in codecs:
        for layout in layouts:
            rows.append(run(layout, codec, a.iters, a.port))
            print(table(rows, a.iters), flush=True)
    os.makedirs(a.out, exist_ok=True)
    atomic_write_text(os.path.join(a.out, "interleaved_quality.json"), json.dumps(rows, indent=1))
    atomic_write_text(os.path.join(a.out, "interleaved_quality.md"), table(rows, a.iters))


if __name__ == "__main__":
    main()
