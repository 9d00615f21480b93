"""Codec throughput and compression ratio at the Optimus-CC Fig. 14 message shapes.

Every codec encodes and decodes one pipeline message of shape (seq, micro-batch, hidden);
throughput is GB/s of INPUT bytes, printed next to a plain memory copy (tensor.clone()) of the
same tensor measured in the same run, so numbers from different machines compare as ratios.

    .venv/bin/python bench/bench_codecs.py            # small preset: 1024 tokens, ~1-2 min on 2 cores
    .venv/bin/python bench/bench_codecs.py --full     # paper shapes: seq 1024 x micro-batch 8
    .venv/bin/python bench/bench_codecs.py --models gpt-2.5b --codecs lowrank-r16,tah

Shapes (Optimus-CC Fig. 14): GPT-2.5B hidden 1920, GPT-8.3B hidden 3072, GPT-175B hidden 12288;
tokens = seq 1024 x micro-batch (8 in the paper, 1 in the small preset).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from megatron.cc.codecs import CodecContext, get_codec, payload_bytes  # noqa: E402

MODELS = {"gpt-2.5b": 1920, "gpt-8.3b": 3072, "gpt-175b": 12288}  # hidden sizes
RANKS = (8, 16, 24, 32, 40)  # Optimus-CC Fig. 14 sweep


def codec_table(seq: int, mb: int, hidden: int) -> dict[str, tuple[str, dict]]:
    """Benchmark label -> (registry name, kwargs)."""
    table = {
        "fixpoint-4": ("fixpoint", dict(bits=4)),
        "fixpoint-8": ("fixpoint", dict(bits=8)),
        "delta-4": ("delta", dict(bits=4, capacity=mb, sample_shape=(seq, hidden))),
        "delta-lowbits-4/8": ("delta-lowbits", dict(bits=4, bits_act=8, capacity=mb,
                                                    sample_shape=(seq, hidden))),
        "tah-4/3": ("tah", dict(tile_size=64, high_bits=4, low_bits=3, high_ratio=0.8)),
        "tah-bwd-6": ("fixpoint", dict(bits=6, granularity="tile", group_size=32)),
    }
    for r in RANKS:
        table[f"lowrank-r{r}"] = ("lowrank", dict(rank=r))
    return table


CLOCK = time.process_time  # set by --clock


def best_time(fn, repeat: int) -> float:
    """Best time of `repeat` calls after one warm-up call."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = CLOCK()
        fn()
        best = min(best, CLOCK() - t0)
    return max(best, 1e-9)


def bench_model(model: str, hidden: int, args, labels: list[str]) -> None:
    shape = (args.seq, args.micro_batch, hidden)
    dtype = getattr(torch, args.dtype)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    gb = x.numel() * x.element_size() / 1e9
    print(f"\n{model}: message {tuple(shape)} {args.dtype} = {gb * 1e3:.1f} MB")
    print(f"{'codec':>18} {'payload MB':>10} {'ratio':>7} {'copy GB/s':>9} {'enc GB/s':>9} "
          f"{'enc/copy':>8} {'dec GB/s':>9} {'dec/copy':>8} {'rel err':>8}")
    table = codec_table(*shape)
    ctx = CodecContext(sample_ids=torch.arange(args.micro_batch))
    for label in labels:
        name, kw = table[label]
        enc, dec = get_codec(name, **kw), get_codec(name, **kw)
        payload = enc.encode(x, ctx)
        x_hat = dec.decode(payload, x.shape, x.dtype, ctx)
        err = float((x_hat.float() - x.float()).norm() / x.float().norm())
        # the copy is re-measured next to every codec, so both see the same machine load
        copy = gb / best_time(x.clone, args.repeat)
        t_enc = best_time(lambda: enc.encode(x, ctx), args.repeat)
        t_dec = best_time(lambda: dec.decode(payload, x.shape, x.dtype, ctx), args.repeat)
        nbytes = payload_bytes(payload)
        print(f"{label:>18} {nbytes / 1e6:10.3f} {gb * 1e9 / nbytes:7.1f} {copy:9.2f} {gb / t_enc:9.3f} "
              f"{gb / t_enc / copy:8.3f} {gb / t_dec:9.3f} {gb / t_dec / copy:8.3f} {err:8.4f}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--full", action="store_true",
                   help="paper shapes: micro-batch 8 (8192 tokens per message); default micro-batch 1")
    p.add_argument("--seq", type=int, default=1024, help="sequence length (tokens per sample)")
    p.add_argument("--micro-batch", type=int, default=None,
                   help="samples per message (default 1, or 8 with --full)")
    p.add_argument("--models", default=",".join(MODELS),
                   help=f"comma-separated subset of {','.join(MODELS)}")
    p.add_argument("--codecs", default=None,
                   help="comma-separated codec labels (default: all; see the table printed by --list)")
    p.add_argument("--list", action="store_true", help="print the codec labels and exit")
    p.add_argument("--repeat", type=int, default=3, help="timed calls per measurement (best is kept)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="dtype of the message (GPU runs send bf16/fp16: byte ratios halve)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch.set_num_threads; default 1 because OpenMP threads on a loaded "
                        "2-core box stall each other by orders of magnitude (0 = torch's default)")
    p.add_argument("--clock", default="cpu", choices=["cpu", "wall"],
                   help="cpu: process CPU time (user+sys; robust when other jobs share the cores, "
                        "exact with --threads 1); wall: elapsed time")
    args = p.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    args.micro_batch = args.micro_batch or (8 if args.full else 1)
    all_labels = list(codec_table(1, 1, 1))
    if args.list:
        print("\n".join(all_labels))
        return
    labels = args.codecs.split(",") if args.codecs else all_labels
    unknown = [c for c in labels if c not in all_labels]
    if unknown:
        p.error(f"--codecs: unknown {unknown}; known: {all_labels}")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.clock} clock; "
          f"GB/s = input bytes per second; ratio = input bytes / payload bytes")
    for model in args.models.split(","):
        if model not in MODELS:
            p.error(f"--models: unknown {model!r}; known: {list(MODELS)}")
        bench_model(model, MODELS[model], args, labels)


if __name__ == "__main__":
    main()
