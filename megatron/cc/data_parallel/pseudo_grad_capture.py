"""Each replica's outer pseudo-gradient written to disk at every sync, for codec studies.

--diloco-capture-dir DIR (diloco, sparseloco): at every sync of every fragment, each rank
writes what it is about to exchange, before error feedback adds its residual, as

    DIR/iter<iteration 1-based, 7 digits>_frag<f>_rank<global rank>.pt
    {"delta": fp32 (n,) on the CPU, "shapes": the fragment's tensor shapes in order,
     "iteration", "fragment", "dp_rank", "dp_world"}

bench/bench_pseudograd_codecs.py reads a sync's files (one per replica) and measures every dp
codec on them. The copy to the host is a sync of the device: a diagnostic, off by default.
Each file is written under a temporary name and renamed, so a reader never sees half of one.
"""
import os

import torch


def capture_path(directory: str, iteration: int, fragment: int, rank: int) -> str:
    return os.path.join(directory, f"iter{iteration:07d}_frag{fragment}_rank{rank}.pt")


def save_pseudo_gradient(directory: str, delta: torch.Tensor, shapes, iteration: int,
                         fragment: int, rank: int, dp_rank: int, dp_world: int) -> str:
    path = capture_path(directory, iteration, fragment, rank)
    record = {"delta": delta.detach().to("cpu", torch.float32, copy=True), "shapes": list(shapes),
              "iteration": iteration, "fragment": fragment, "dp_rank": dp_rank,
              "dp_world": dp_world}
    tmp = path + ".tmp"
    torch.save(record, tmp)
    os.replace(tmp, path)
    return path
