"""GPU benchmark, one invocation, everything side by side on the same GPU.

1. Training throughput at (1,1,1) bf16, GPT-2-small shape (12 layers, hidden 768, 12 heads,
   seq 1024, micro-batch 16, vocab padded to 50304, GPT-2's tanh GeLU = --openai-gelu):
     ours      the Trainer that pretrain_gpt.py runs (megatron-core GPTModel, --transformer-impl
               default (sdpa), bf16 params with fp32 main weights, megatron-core optimizer)
     HF eager  transformers GPT2LMHeadModel, bf16 autocast, torch.optim.AdamW(fused=True)
     HF comp.  the same under torch.compile (skipped with --quick: compiling takes a minute)
   tokens/s, model TFLOP/s (6 N + 12 L S H FLOPs per token, N = non-embedding parameters +
   the output layer) and peak memory. Measured for reference on an H100 with fused AdamW:
   HF eager about 171k tokens/s, compiled about 306k. Targets: ours >= HF eager, and ours vs
   HF compiled reported.
2. Every codec's encode and decode against one device copy of the same message, at the
   Optimus-CC Fig. 14 shapes (1024, 8, H) for H = 1920, 3072, 12288 (ASPLOS23/fig14_codec.sh,
   bench/bench_codecs.py), bf16 and fp32 (--quick: H = 1920, bf16). Target: each <= 1.0x.

    python bench/bench_gpu.py [--quick] [--json out.json] [--iters 20] [--deadline-s 240]
                              [--skip-training] [--skip-codecs]

Ends with one `PERF <what>: <ratio>x (target ...) target met|missed` line per target
(tools/gpu_check.py relays them). A missed target is a measurement, not an error: the exit
status is 0 whenever the benchmark ran. Sections that would start past --deadline-s are
skipped with a line saying so. Without CUDA: one line, exit 0.
"""
import argparse
import gc
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAPE = dict(layers=12, hidden=768, heads=12, seq=1024, mbs=16, vocab=50304)
FIG14 = [(1024, 8, 1920), (1024, 8, 3072), (1024, 8, 12288)]   # GPT-2.5B, 8.3B, 175B
REFERENCE_H100 = {"HF GPT2LMHeadModel eager": 171_000, "HF GPT2LMHeadModel torch.compile": 306_000}
OURS = "ours (pretrain_gpt.py Trainer, bf16)"
HF_EAGER, HF_COMPILED = "HF GPT2LMHeadModel eager", "HF GPT2LMHeadModel torch.compile"


def flops_per_token(layers, hidden, seq, vocab, **_):
    n = 12 * layers * hidden * hidden + vocab * hidden   # blocks + output layer
    return 6 * n + 12 * layers * seq * hidden


def perf_line(what: str, ratio: float, target: float, at_least: bool) -> str:
    """One performance verdict: the measured ratio, the target, met or missed (a NaN or
    missing measurement is missed). Never an error: gpu-check's exit status ignores it."""
    met = not math.isnan(ratio) and (ratio >= target if at_least else ratio <= target)
    op = ">=" if at_least else "<="
    return (f"PERF {what}: {ratio:.2f}x (target {op} {target:.2f}x) "
            f"target {'met' if met else 'missed'}")


def _timed(step, iters, warmup=3):
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def bench_ours(iters):
    from bench.bench_vs_huggingface import our_trainer
    s = SHAPE
    flags = ["--num-layers", str(s["layers"]), "--hidden-size", str(s["hidden"]),
             "--num-attention-heads", str(s["heads"]), "--seq-length", str(s["seq"]),
             "--micro-batch-size", str(s["mbs"]), "--global-batch-size", str(s["mbs"]),
             "--make-vocab-size-divisible-by", str(s["vocab"]), "--bf16", "--openai-gelu",
             "--train-iters", "1000000", "--eval-iters", "0", "--log-interval", "1000000",
             "--eval-interval", "1000000"]
    torch.cuda.reset_peak_memory_stats()
    trainer = our_trainer(flags)
    assert trainer.padded_vocab_size == s["vocab"], trainer.padded_vocab_size

    def step():
        trainer.consumed_samples = 0
        trainer.train_step()
    sec = _timed(step, iters)
    model = trainer.model
    trainer.close()
    return sec, torch.cuda.max_memory_allocated(), model


def bench_hf(iters, compiled):
    from transformers import GPT2Config, GPT2LMHeadModel
    s = SHAPE
    config = GPT2Config(vocab_size=s["vocab"], n_positions=s["seq"], n_embd=s["hidden"],
                        n_layer=s["layers"], n_head=s["heads"])   # activation: gelu_new
    torch.cuda.reset_peak_memory_stats()
    model = GPT2LMHeadModel(config).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    fwd = torch.compile(model) if compiled else model
    tokens = torch.randint(0, s["vocab"], (s["mbs"], s["seq"]), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(input_ids=tokens, labels=tokens).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    sec = _timed(step, iters)
    peak = torch.cuda.max_memory_allocated()
    del model, opt, fwd
    torch.cuda.empty_cache()
    return sec, peak


def training_table(iters, quick, deadline):
    tokens = SHAPE["mbs"] * SHAPE["seq"]
    fpt = flops_per_token(**SHAPE)
    rows = {}
    sec, peak, model = bench_ours(iters)
    rows[OURS] = (sec, peak)
    del model
    gc.collect()   # the trainer's cycles (optimizer <-> model) hold GPU memory until collected
    torch.cuda.empty_cache()
    for name, compiled in ((HF_EAGER, False), (HF_COMPILED, True)):
        if compiled and quick:
            continue
        if time.monotonic() > deadline:
            print(f"SKIP {name}: past --deadline-s")
            continue
        rows[name] = bench_hf(iters, compiled=compiled)
    out = {}
    print("\n| run | tokens/s | model TFLOP/s | peak memory (GiB) | H100 reference tokens/s |"
          "\n|---|---|---|---|---|")
    for name, (sec, peak) in rows.items():
        tps = tokens / sec
        out[name] = {"tokens_per_s": tps, "tflops": tps * fpt / 1e12, "peak_gib": peak / 2**30}
        ref = REFERENCE_H100.get(name)
        print(f"| {name} | {tps:,.0f} | {tps * fpt / 1e12:.1f} | {peak / 2**30:.2f} | "
              f"{f'{ref:,}' if ref else '-'} |")
    return out


# ------------------------------------------------------------------------------- codecs

def codec_cases(shape):
    """(label, codec)."""
    from megatron.cc.compress import get_codec
    dev = torch.device("cuda", torch.cuda.current_device())
    s, b, h = shape
    return [
        ("fixpoint 4-bit", get_codec("fixpoint", bits=4)),
        ("fixpoint 8-bit", get_codec("fixpoint", bits=8)),
        ("lowrank r=16 (CB, LEP)", get_codec("lowrank", rank=16, error_feedback=True)),
        ("delta 4-bit (device cache)", get_codec("delta", bits=4, capacity=b,
                                                  sample_shape=(s, h), storage="device",
                                                  device=dev)),
        ("delta-lowbits 4/8 (device cache)", get_codec("delta-lowbits", bits=4, bits_act=8,
                                                        capacity=b, sample_shape=(s, h),
                                                        storage="device", device=dev)),
        ("tah t=64 4/3-bit", get_codec("tah")),
        ("cocktail 0.1/0.2 4-bit", get_codec("cocktail")),
    ]


def _event_time(fn, iters):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def codec_table(iters, quick, deadline):
    from megatron.cc.compress import CodecContext
    out = {}
    shapes = FIG14[:1] if quick else FIG14
    dtypes = (torch.bfloat16,) if quick else (torch.bfloat16, torch.float32)
    print("\n| shape | dtype | codec | encode (ms) | decode (ms) | copy (ms) | encode/copy | "
          "decode/copy | bytes ratio |\n|---|---|---|---|---|---|---|---|---|")
    for shape in shapes:
        for dtype in dtypes:
            if time.monotonic() > deadline:
                print(f"SKIP codecs at {shape} {dtype}: past --deadline-s")
                continue
            x = torch.randn(shape, device="cuda").to(dtype)
            y = torch.empty_like(x)
            copy = _event_time(lambda: y.copy_(x), iters)
            ctx = CodecContext(sample_ids=torch.arange(shape[1]))
            for label, codec in codec_cases(shape):
                payload = codec.encode(x, ctx)
                enc = _event_time(lambda: codec.encode(x, ctx), iters)
                dec = _event_time(lambda: codec.decode(payload, x.shape, dtype, ctx), iters)
                ratio = x.numel() * x.element_size() / codec.payload_nbytes(shape, dtype)
                key = f"{label} {tuple(shape)} {str(dtype).replace('torch.', '')}"
                out[key] = {"encode_ms": enc, "decode_ms": dec, "copy_ms": copy,
                            "encode_x": enc / copy, "decode_x": dec / copy, "bytes_ratio": ratio}
                print(f"| {shape} | {str(dtype).replace('torch.', '')} | {label} | {enc:.3f} | "
                      f"{dec:.3f} | {copy:.3f} | {enc / copy:.2f}x | {dec / copy:.2f}x | "
                      f"{ratio:.1f}x |")
                del codec, payload
            del x, y
            torch.cuda.empty_cache()
    return out


def verdicts(training, codecs):
    """PERF lines for every target measured (see perf_line)."""
    lines = []
    ours = training.get(OURS, {}).get("tokens_per_s")
    for ref, target in ((HF_EAGER, 1.0), (HF_COMPILED, 1.0)):
        if ours is not None and ref in training:
            lines.append(perf_line(f"training tokens/s ours / {ref}",
                                   ours / training[ref]["tokens_per_s"], target, at_least=True))
    for key, r in codecs.items():
        lines.append(perf_line(f"codec {key} encode / device copy", r["encode_x"], 1.0,
                               at_least=False))
        lines.append(perf_line(f"codec {key} decode / device copy", r["decode_x"], 1.0,
                               at_least=False))
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=None,
                   help="timed iterations per measurement (default 20, 10 with --quick)")
    p.add_argument("--quick", action="store_true", help="the subset for `gpu-check --quick`: "
                   "no torch.compile row, codecs at one shape in bf16")
    p.add_argument("--deadline-s", type=float, default=None, help="wall-clock seconds after "
                   "which no further section or codec shape starts (default: none)")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--skip-training", action="store_true", help="codecs only")
    p.add_argument("--skip-codecs", action="store_true", help="training only")
    a = p.parse_args(argv)
    if a.iters is not None and a.iters < 1:
        p.error(f"--iters must be >= 1, got {a.iters}")
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device; nothing to measure")
        return 0
    iters = a.iters or (10 if a.quick else 20)
    deadline = time.monotonic() + (a.deadline_s if a.deadline_s is not None else math.inf)
    print(f"device: {torch.cuda.get_device_name()} | torch {torch.__version__}", flush=True)
    training = {} if a.skip_training else training_table(iters, a.quick, deadline)
    codecs = {} if a.skip_codecs else codec_table(iters, a.quick, deadline)
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "training": training, "codecs": codecs}
    if a.json:
        from megatron.training.checkpointing import atomic_write_text
        atomic_write_text(a.json, json.dumps(results, indent=1))
    for line in verdicts(training, codecs):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
