"""Every dp codec on real DiLoCo pseudo-gradients: bits per value against error.

The target is 1000x fewer dp bytes than all-reduce. In a 300-iteration run that leaves
32 H / 1000 bits per value and sync (1.6 at H = 50). This bench measures what each codec
loses at its rate on the vectors DiLoCo really exchanges. It captures one sync of
bench_dp_modes.py's warm-start, batch-128 setting: dp = 4 replicas run H inner steps of exact
DiLoCo from the warm start, and --diloco-capture-dir writes each replica's pseudo-gradient.
A finished capture can be passed back with --capture. For each codec it then reports:

    bits/value   the payload's bits per value (flat_spec: codes, scales and indices)
    dp ratio     what a DiLoCo run at H logs for it: 4 n H over the exchange's count of one
                 sync, the sharded exchange's for flat codecs (both phases, halved: about
                 32 H / bits) and the all-gather's for SparseLoCo's chunked top-k (D / 2
                 payloads)
    rel. MSE, replica    |C(d_i) - d_i|^2 / |d_i|^2, averaged over the replicas
    rel. MSE, mean       |mean_i C(d_i) - mean_i d_i|^2 / |mean_i d_i|^2: the error of the
                         outer step, one compression stage (the sharded exchange compresses
                         the mean again: its error is larger)

It also prints the Gaussian rate-distortion limit 2^(-2R) at each codec's rate, how much of the
mean's energy the largest entries hold, and the cosine between replicas.

    python bench/bench_pseudograd_codecs.py [--warm-start 300] [--inner-steps 50]
        [--out bench/results/pseudograd_codecs] [--capture DIR]

Writes <out>/pseudograd_codecs.md and .json.
"""
import argparse
import glob
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from bench_dp_modes import DEMO, batch_flags, warm_checkpoint  # noqa: E402
from runlog import run_pretrain  # noqa: E402

from megatron.cc.codecs.chunk_topk import ChunkTopKCodec  # noqa: E402
from megatron.cc.data_parallel.cocktail_sgd import sharded_exchange_bytes  # noqa: E402
from megatron.cc.data_parallel.flat_codecs import make_flat_codec  # noqa: E402
from megatron.cc.data_parallel.sparseloco_sync import sync_bytes as gather_bytes  # noqa: E402
from megatron.training.checkpointing.save_load import atomic_write_text  # noqa: E402

DP = 4


def codecs():
    """(name, codec, exchange): flat codecs go through the sharded exchange, top-k the gather."""
    out = [(n, make_flat_codec(n), "sharded")
           for n in ("fp16", "int8", "fixpoint-4", "fixpoint-3", "fixpoint-2", "fixpoint-1")]
    out += [("cocktail 0.1/0.2/4b", make_flat_codec("cocktail"), "sharded"),
            ("cocktail 0.5/1/2b", make_flat_codec("cocktail", random_ratio=0.5,
                                                  topk_ratio=1.0, bits=2), "sharded")]
    for density, bits in ((1 / 64, 2), (232 / 4096, 2), (0.1, 2), (0.1, 4)):
        out.append((f"sparseloco top-k {density:.4f} {bits}b",
                    ChunkTopKCodec(density, 4096, bits), "gather"))
    return out


def capture(a) -> str:
    """One sync of exact DiLoCo from the warm start, every replica's pseudo-gradient on disk."""
    directory = os.path.join(a.out, "capture")
    if glob.glob(os.path.join(directory, f"iter{a.inner_steps:07d}_frag0_rank*.pt")):
        print(f"capture: reusing {directory}", flush=True)
        return directory
    os.makedirs(a.out, exist_ok=True)
    warm = warm_checkpoint(a.out, a.warm_start, 128, 8, a.seed, a.port)
    flags = (DEMO + ["--seed", str(a.seed), "--train-iters", str(a.iters), "--eval-interval",
                     str(a.iters), "--load", warm, "--finetune", "--exit-interval",
                     str(a.inner_steps)]
             + batch_flags("diloco", 128, 8)
             + ["--dp-mode", "diloco", "--diloco-inner-steps", str(a.inner_steps),
                "--dp-adam-correction", "--diloco-capture-dir", directory])
    run_pretrain("capture", DP, flags, port=a.port)
    return directory


def load(directory: str, iteration: int):
    paths = sorted(glob.glob(os.path.join(directory, f"iter{iteration:07d}_frag0_rank*.pt")))
    if not paths:
        raise SystemExit(f"--capture {directory}: no iter{iteration:07d}_frag0_rank*.pt files; "
                         f"write them with --diloco-capture-dir")
    recs = [torch.load(p) for p in paths]
    if len({tuple(map(tuple, r["shapes"])) for r in recs}) > 1 or len(recs) != recs[0]["dp_world"]:
        raise SystemExit(f"--capture {directory}: iteration {iteration} has {len(recs)} files of "
                         f"different stages or not one per replica (dp {recs[0]['dp_world']}); "
                         f"capture a run with pipeline parallel size 1")
    recs.sort(key=lambda r: r["dp_rank"])
    return [r["delta"].float() for r in recs]


def measure(deltas, inner_steps: int):
    n, D = deltas[0].numel(), len(deltas)
    mean = sum(deltas) / D
    rows = []
    for name, codec, exchange in codecs():
        bits = sum(torch.Size(shape).numel() * dt.itemsize
                   for shape, dt in codec.flat_spec(n)) * 8 / n
        dq = [codec.decompress(codec.compress(d, 0), n, 0) for d in deltas]
        rep = sum(float((q - d).pow(2).sum() / d.pow(2).sum()) for q, d in zip(dq, deltas)) / D
        mse_mean = float((sum(dq) / D - mean).pow(2).sum() / mean.pow(2).sum())
        # what the dp channel logs for one sync: the exchanges' own byte formulas
        counted = (sharded_exchange_bytes if exchange == "sharded" else gather_bytes)(n, D, codec)
        rows.append({"codec": name, "exchange": exchange, "bits": bits,
                     "ratio": 4 * n * inner_steps / counted, "rel_mse_replica": rep,
                     "rel_mse_mean": mse_mean, "gaussian_limit": 2.0 ** (-2 * bits)})
    energy = mean.pow(2).sort(descending=True).values.cumsum(0)
    top = {f: float(energy[max(int(f * n), 1) - 1] / energy[-1]) for f in (0.01, 0.1, 0.2)}
    cos = [float(deltas[0] @ d / deltas[0].norm() / d.norm()) for d in deltas[1:]]
    return rows, {"numel": n, "replicas": D, "energy_top": top, "cos_replica0": cos,
                  "norm_replica": [float(d.norm()) for d in deltas],
                  "norm_mean": float(mean.norm())}


def table(rows, info, a) -> str:
    lines = [f"# Codecs on DiLoCo pseudo-gradients (H = {a.inner_steps}, dp = {info['replicas']}, "
             f"{info['numel']:,} values per replica)", "",
             f"One sync of exact DiLoCo (--dp-adam-correction) from {a.warm_start} iterations of "
             f"all-reduce pretraining, batch 128 (bench_dp_modes.py's warm-start setting). "
             f"Replica norms {', '.join(f'{x:.3f}' for x in info['norm_replica'])}, their "
             f"mean's {info['norm_mean']:.3f}; cosine of replica 0 with the others "
             f"{', '.join(f'{x:.3f}' for x in info['cos_replica0'])}. The largest 1% / 10% / "
             f"20% of the mean's entries hold {info['energy_top'][0.01]:.3f} / "
             f"{info['energy_top'][0.1]:.3f} / {info['energy_top'][0.2]:.3f} of its energy.", "",
             "| codec | exchange | bits/value | dp ratio at H | rel. MSE, replica | "
             "rel. MSE, mean | Gaussian limit 2^(-2R) |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['codec']} | {r['exchange']} | {r['bits']:.3f} | x{r['ratio']:.0f} | "
                     f"{r['rel_mse_replica']:.4f} | {r['rel_mse_mean']:.4f} | "
                     f"{r['gaussian_limit']:.4f} |")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--warm-start", type=int, default=300, metavar="N",
                   help="iterations of all-reduce pretraining before the DiLoCo period")
    p.add_argument("--inner-steps", type=int, default=50, metavar="H",
                   help="DiLoCo's H: the captured sync is after H inner steps")
    p.add_argument("--iters", type=int, default=300,
                   help="the run's length (its cosine schedule); it exits after the sync")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--port", type=int, default=29690)
    p.add_argument("--out", default=os.path.join(HERE, "results", "pseudograd_codecs"))
    p.add_argument("--capture", default="",
                   help="a directory written by --diloco-capture-dir (skips the training run)")
    a = p.parse_args()
    if a.inner_steps < 1 or a.inner_steps > a.iters:
        p.error(f"--inner-steps {a.inner_steps}: give 1..--iters ({a.iters})")
    directory = a.capture or capture(a)
    rows, info = measure(load(directory, a.inner_steps), a.inner_steps)
    md = table(rows, info, a)
    os.makedirs(a.out, exist_ok=True)
    atomic_write_text(os.path.join(a.out, "pseudograd_codecs.md"), md)
    atomic_write_text(os.path.join(a.out, "pseudograd_codecs.json"),
                      json.dumps({"rows": rows, "info": {**info, "energy_top": {
                          str(k): v for k, v in info["energy_top"].items()}}}, indent=1))
    print(md)


if __name__ == "__main__":
    main()
