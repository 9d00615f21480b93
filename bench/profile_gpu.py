"""Where the time of a codec call or of a training step goes: per-kernel breakdown.

bench/bench_gpu.py says how fast each codec and the trainer are; this says why. For every
codec of bench_gpu's table at one message shape, and for one training step of bench_gpu's
GPT-2-small trainer, it runs a few calls under torch.profiler and prints each kernel's count
and time per call, so that launches, extra passes over the message and slow kernels show.

    python bench/profile_gpu.py [--shape 1024,8,1920] [--dtype bf16] [--top 12]
                                [--skip-training] [--compiled] [--out profile.md]
    python bench/profile_gpu.py --device cpu --shape 64,2,32 --skip-training   # CPU smoke
"""
import argparse
import os
import sys
from typing import Dict, List

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import bench_gpu  # noqa: E402

CALLS = 5


def kernel_rows(prof, calls: int, device_type: str) -> List[Dict]:
    """Per kernel (or, on the CPU, per aten op): launches and microseconds per call."""
    rows = []
    for ev in prof.key_averages():
        if device_type == "cuda":
            us = ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
            is_kernel = getattr(ev, "device_type", None) == torch.autograd.DeviceType.CUDA
            if not is_kernel or us <= 0:
                continue
        else:
            us = ev.self_cpu_time_total
            if not ev.key.startswith("aten::") or us <= 0:
                continue
        rows.append({"kernel": ev.key, "count": ev.count / calls, "us": us / calls})
    return sorted(rows, key=lambda r: -r["us"])


def profiled(fn, calls: int, device) -> "profile":
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    fn(0)
    bench_gpu.sync(device)
    with profile(activities=acts) as prof:
        for i in range(calls):
            fn(i + 1)
        bench_gpu.sync(device)
    return prof


def table(title: str, rows: List[Dict], top: int) -> str:
    total = sum(r["us"] for r in rows)
    launches = sum(r["count"] for r in rows)
    lines = [f"\n### {title}: {total:,.1f} us in {launches:.0f} launches per call\n",
             "| kernel | per call | us per call | share |", "|---|---|---|---|"]
    for r in rows[:top]:
        name = r["kernel"] if len(r["kernel"]) <= 90 else r["kernel"][:87] + "..."
        lines.append(f"| `{name}` | {r['count']:g} | {r['us']:,.1f} | "
                     f"{r['us'] / max(total, 1e-9):.0%} |")
    if len(rows) > top:
        rest = rows[top:]
        lines.append(f"| ({len(rest)} more) | {sum(r['count'] for r in rest):g} | "
                     f"{sum(r['us'] for r in rest):,.1f} | |")
    return "\n".join(lines)


def codec_profiles(shape, dtype, device, top: int) -> List[str]:
    out = []
    sets = 4
    for g in bench_gpu.groups([shape], [dtype], device, 0, 0):
        xs = bench_gpu.make_inputs(g.shape, g.dtype, sets, device)
        out.append(f"\n## {g.what} {bench_gpu.dtype_name(g.dtype)}")
        for case in g.cases:
            g.sets = sets
            batch = g.shape[1] if len(g.shape) > 1 else 1
            sender, receiver = case.make(), case.make()
            payloads = bench_gpu.sender_payloads(case.make(), xs, g, case, CALLS + sets + 1)
            for i in range(sets):   # the delta caches: every sample set seen once
                receiver.decode(payloads[i], g.shape, g.dtype,
                                bench_gpu.context(i, sets, batch, case.per_sample))
                sender.encode(xs[i], bench_gpu.context(i, sets, batch, case.per_sample))

            def enc(i, c=sender, case=case):
                j = i + sets
                return c.encode(xs[j % sets], bench_gpu.context(j, sets, batch, case.per_sample))

            def dec(i, c=receiver, case=case):
                j = i + sets
                return c.decode(payloads[j], g.shape, g.dtype,
                                bench_gpu.context(j, sets, batch, case.per_sample))
            for side, fn in (("encode", enc), ("decode", dec)):
                text = table(f"{case.label}, {side}",
                             kernel_rows(profiled(fn, CALLS, device), CALLS, device.type), top)
                print(text, flush=True)
                out.append(text)
    return out


def training_profile(top: int, iters: int = 3, compiled: bool = False) -> str:
    """The kernels of one training step, and how much of the step's wall time they fill
    (the rest: the GPU waiting for the host)."""
    from bench.bench_vs_huggingface import our_trainer
    from megatron.core import parallel_state as ps
    trainer = our_trainer(bench_gpu.trainer_flags(compiled))

    def step(_):
        trainer.consumed_samples = 0
        trainer.train_step()
    wall_ms = bench_gpu._timed(lambda: step(0), iters, warmup=5 if compiled else 2) * 1e3
    prof = profiled(step, iters, torch.device("cuda"))
    trainer.close()
    ps.destroy_model_parallel()
    rows = kernel_rows(prof, iters, "cuda")
    busy_ms = sum(r["us"] for r in rows) / 1e3
    what = "--torch-compile" if compiled else "eager"
    text = table(f"training step (GPT-2 small, bf16, micro-batch 16, {what}): wall "
                 f"{wall_ms:.1f} ms, kernels {busy_ms:.1f} ms ({100 * busy_ms / wall_ms:.0f}% "
                 f"busy)", rows, top)
    print(text, flush=True)
    return text


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="1024,8,1920", metavar="S,B,H")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--top", type=int, default=12, help="kernels listed per table")
    p.add_argument("--device", default="cuda")
    p.add_argument("--skip-training", action="store_true")
    p.add_argument("--skip-codecs", action="store_true")
    p.add_argument("--compiled", action="store_true",
                   help="also profile the training step with --torch-compile")
    p.add_argument("--out", default=None, help="also write the tables here (markdown)")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("profile_gpu: no CUDA device (use --device cpu for the smoke run)")
        return 0
    shape = tuple(int(v) for v in args.shape.split(","))
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    parts = []
    if not args.skip_training and device.type == "cuda":
        parts.append(training_profile(args.top))
        if args.compiled:
            parts.append(training_profile(args.top, compiled=True))
    if not args.skip_codecs:
        parts += codec_profiles(shape, dtype, device, args.top)
    if args.out:
        with open(args.out, "w") as f:
            f.write("# Per-kernel profile\n" + "\n".join(parts) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
