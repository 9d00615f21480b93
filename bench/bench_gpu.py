"""GPU benchmark, one invocation, everything side by side on the same GPU.

1. Training throughput at (1,1,1) bf16, GPT-2-small shape (12 layers, hidden 768, 12 heads,
   seq 1024, micro-batch 16, vocab padded to 50304, GPT-2's tanh GeLU = --openai-gelu):
     ours      the Trainer that pretrain_gpt.py runs (megatron-core GPTModel, --transformer-impl
               default (sdpa), bf16 params with fp32 main weights, megatron-core optimizer)
     ours comp.  the same with --torch-compile (skipped with --quick)
     HF eager  transformers GPT2LMHeadModel, bf16 autocast, torch.optim.AdamW(fused=True)
     HF comp.  the same under torch.compile (skipped with --quick: compiling takes a minute)
   tokens/s, model TFLOP/s (6 N + 12 L S H FLOPs per token, N = non-embedding parameters +
   the output layer) and peak memory. Measured for reference on an H100 with fused AdamW:
   HF eager about 171k tokens/s, compiled about 306k. Targets: ours >= HF eager and >= HF
   compiled in tokens/s, with peak memory no higher than HF compiled's.
2. Every codec's encode and decode against one device copy of the same message, side by
   side in one run, at the Optimus-CC Fig. 14 shapes (1024, 8, H) for H = 1920, 3072, 12288
   (ASPLOS23/fig14_codec.sh, bench/bench_codecs.py), bf16 and fp32 (--quick: H = 1920, bf16):
   fixpoint 2/4/8-bit with the absmax and fitted scales, CB rank 16 with LEP (PowerSGD's
   lowrank and the randomized SVD), delta and delta-lowbits (the sender's and the receiver's
   caches apart), TAH, CocktailSGD, the subspace coefficients (k 10, 4-bit, of the same
   tokens); then the data-parallel pseudo-gradient codecs (DiLoCo int8 and fp16, SparseLoCo)
   on one fp32 bucket of 40M values (megatron-core DDP's default bucket).

    python bench/bench_gpu.py [--quick] [--json out.json] [--iters 20] [--deadline-s 240]
                              [--skip-training] [--skip-codecs]
    python bench/bench_gpu.py --device cpu --shapes 64,2,32 --iters 1 --rotate-mb 0 \\
                              --bucket-numel 8192      # CPU smoke: the same table logic
    python bench/bench_gpu.py --speeds-from OLD.json --json SPEEDS.json   # planner speeds

Codec columns, per row:
    encode / decode ms   time per call: CUDA events around --iters calls after the warm-up
                         calls (CPU: time.perf_counter). Every call reads its own input from
                         a rotating set (>= 4 tensors and >= --rotate-mb, 256 MB: more than
                         an H100/H200's 50-60 MB L2, so no input is cached when read) and its
                         output stays alive for as many calls, so writes go to memory too.
                         The receiver is its own codec instance, fed the sender's payloads
                         in order (stateful codecs: its state is checked equal at the end).
    copy ms              out.copy_(x) of the same message, the same rotation.
    x copy (target)      encode / copy and decode / copy, with the codec's target.
    lower bound ms (x)   the bytes a call must read and write over the copy's bandwidth
                         (2 x message bytes / copy ms): encode = input + payload + state,
                         decode = payload + output + state (state: LEP's fp32 error buffer
                         and CB's Q, the delta caches' rows of the message's samples, read
                         and written); in brackets measured / lower bound.
    ratio                input bytes / payload bytes.
    break-even Gbit/s    (input - payload bytes) / (encode + decode): on any slower link the
                         codec shortens the message's time, on a faster one it lengthens it.
    host ms to issue     the host's time per call to issue its launches (perf_counter over
                         the timed calls, before the GPU is waited on); "launch-bound" where
                         it is LAUNCH_BOUND or more of the call's GPU time: there the GPU
                         waits on the host, and fewer launches (not faster kernels) help.

Ends with one `PERF <what>: <ratio>x (target ...) target met|missed` line per target
(tools/gpu_check.py relays them). A missed target is a measurement, not an error: the exit
status is 0 whenever the benchmark ran. Sections that would start past --deadline-s are
skipped with a line saying so. Without CUDA (and without --device cpu): one line, exit 0.
--json writes every row, and the planner's codec speeds from them in the format of
megatron/cc/plan/codec_speeds.py: tools/plan_compression.py plan --codec-speeds reads it.
"""
import argparse
import collections
import gc
import json
import math
import os
import re
import shlex
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAPE = dict(layers=12, hidden=768, heads=12, seq=1024, mbs=16, vocab=50304)
FIG14 = [(1024, 8, 1920), (1024, 8, 3072), (1024, 8, 12288)]   # GPT-2.5B, 8.3B, 175B
REFERENCE_H100 = {"HF GPT2LMHeadModel eager": 171_000, "HF GPT2LMHeadModel torch.compile": 306_000}
OURS = "ours (pretrain_gpt.py Trainer, bf16)"
OURS_COMPILED = "ours with --torch-compile"
HF_EAGER, HF_COMPILED = "HF GPT2LMHeadModel eager", "HF GPT2LMHeadModel torch.compile"

WARMUP = 3                  # untimed calls before the timed ones, at least
ROTATE_MB = 256             # rotating inputs: at least this much in all ...
ROTATE_MIN = 4              # ... and at least this many tensors ...
ROTATE_MAX_BYTES = 4 << 30  # ... unless that is more than this (a 400 MB message: 4 of them)
ROTATE_MAX_COUNT = 4096
HOLD_MAX = 16               # outputs kept alive at once (steady state before timing)
# a call whose host issues it in this share of its GPU time or more is waiting on launches
LAUNCH_BOUND = 0.9
DP_BUCKET_NUMEL = 40_000_000
SUBSPACE_RANK, SUBSPACE_BITS = 10, 4   # --forward-compress-method subspace's defaults
# (encode, decode) targets as multiples of one device copy of the same message
TARGETS = {"fixpoint": (1.5, 1.0), "cb": (4.0, 1.0), "delta": (4.0, 3.0), "tah": (2.0, 1.0),
           "cocktail": (3.0, 1.0), "subspace": (2.0, 1.0), "dp": (2.0, 1.0)}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


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


def trainer_flags(compiled: bool = False) -> List[str]:
    """pretrain_gpt.py flags of the benchmarked trainer (SHAPE), with --torch-compile or not."""
    s = SHAPE
    return ["--num-layers", str(s["layers"]), "--hidden-size", str(s["hidden"]),
            "--num-attention-heads", str(s["heads"]), "--seq-length", str(s["seq"]),
            "--micro-batch-size", str(s["mbs"]), "--global-batch-size", str(s["mbs"]),
            "--make-vocab-size-divisible-by", str(s["vocab"]), "--bf16", "--openai-gelu",
            "--train-iters", "1000000", "--eval-iters", "0", "--log-interval", "1000000",
            "--eval-interval", "1000000"] + (["--torch-compile"] if compiled else [])


def bench_ours(iters, compiled=False):
    from bench.bench_vs_huggingface import our_trainer
    from megatron.core import parallel_state as ps
    torch.cuda.reset_peak_memory_stats()
    trainer = our_trainer(trainer_flags(compiled))
    assert trainer.padded_vocab_size == SHAPE["vocab"], trainer.padded_vocab_size

    def step():
        trainer.consumed_samples = 0
        trainer.train_step()
    sec = _timed(step, iters, warmup=5 if compiled else 3)   # compiling: the first steps
    trainer.close()
    peak = torch.cuda.max_memory_allocated()
    ps.destroy_model_parallel()   # the next trainer initialises its own
    del trainer, step
    gc.collect()   # the trainer's cycles (optimizer <-> model) hold GPU memory until collected
    torch.cuda.empty_cache()
    return sec, peak


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
    rows = {OURS: bench_ours(iters)}
    if not quick:
        if time.monotonic() > deadline:
            print(f"SKIP {OURS_COMPILED}: past --deadline-s")
        else:
            rows[OURS_COMPILED] = bench_ours(iters, compiled=True)
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

@dataclass
class Case:
    """One codec row: how to build the codec (a fresh instance per call of `make`)."""
    label: str
    codec: str                    # the planner's name for it (megatron/cc/plan/codec_speeds.py)
    family: str                   # its targets (TARGETS)
    make: Callable[[], object]
    per_sample: bool = False      # delta caches: each input is a micro-batch of its own samples


@dataclass
class Group:
    """Cases that take the same message: one rotating set of inputs, one copy measured."""
    what: str                     # the message, as printed in the shape column
    shape: tuple
    dtype: torch.dtype
    cases: List[Case]
    sets: int                     # rotating inputs (and sample sets of the delta caches)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def nbytes_of(shape, dtype) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def rotation(nbytes: int, min_total: int, min_count: int = ROTATE_MIN,
             max_total: int = ROTATE_MAX_BYTES) -> int:
    """How many distinct inputs rotate: enough for min_total bytes, at least min_count, but
    not past max_total (then at least one)."""
    n = max(min_count, -(-min_total // max(nbytes, 1)))
    return max(1, min(n, ROTATE_MAX_COUNT, max_total // max(nbytes, 1)))


def message_cases(shape, device, sets: int) -> List[Case]:
    """The activation / gradient codecs on one (S, B, H) pipeline message."""
    from megatron.cc.codecs import get_codec
    s, b, h = shape
    cases = [Case(f"fixpoint {bits}-bit {scheme}",
                  "fixpoint" if scheme == "fitted" else f"fixpoint-{scheme}", "fixpoint",
                  lambda bits=bits, scheme=scheme: get_codec("fixpoint", bits=bits,
                                                             scheme=scheme))
             for bits in (2, 4, 8) for scheme in ("absmax", "fitted")]
    cases += [
        Case("lowrank r=16 (CB, LEP)", "lowrank", "cb",
             lambda: get_codec("lowrank", rank=16, error_feedback=True)),
        Case("rsvd r=16 (CB, LEP)", "rsvd", "cb",
             lambda: get_codec("rsvd", rank=16, error_feedback=True)),
        Case("delta 4-bit (device cache)", "delta", "delta",
             lambda: get_codec("delta", bits=4, capacity=b * sets, sample_shape=(s, h),
                               storage="device", device=device), per_sample=True),
        Case("delta-lowbits 4/8 (device cache)", "delta-lowbits", "delta",
             lambda: get_codec("delta-lowbits", bits=4, bits_act=8, capacity=b * sets,
                               sample_shape=(s, h), storage="device", device=device),
             per_sample=True),
        Case("tah t=64 4/3-bit", "tah", "tah", lambda: get_codec("tah")),
        Case("cocktail 0.1/0.2 4-bit", "cocktail", "cocktail", lambda: get_codec("cocktail")),
    ]
    return cases


def coefficient_cases(hidden: int) -> List[Case]:
    from megatron.cc.codecs import get_codec
    return [Case(f"subspace k={SUBSPACE_RANK} {SUBSPACE_BITS}-bit", "subspace", "subspace",
                 lambda: get_codec("subspace", hidden_size=hidden, rank=SUBSPACE_RANK,
                                   bits=SUBSPACE_BITS))]


def bucket_cases() -> List[Case]:
    """The data-parallel pseudo-gradient codecs, as --dp-mode diloco / sparseloco build them."""
    from megatron.cc.codecs.chunk_topk import ChunkTopKCodec
    from megatron.cc.data_parallel.flat_codecs import make_flat_codec
    return [Case("DiLoCo int8 (pseudo-gradient)", "int8", "dp",
                 lambda: make_flat_codec("int8")),
            Case("DiLoCo fp16 (pseudo-gradient)", "fp16", "dp",
                 lambda: make_flat_codec("fp16")),
            Case("SparseLoCo 1/64 of 4096, 2-bit (pseudo-gradient)", "sparseloco", "dp",
                 ChunkTopKCodec)]


def groups(shapes, dtypes, device, rotate_bytes: int, bucket_numel: int) -> List[Group]:
    """Every message the table times, in order: per shape and dtype the pipeline message and
    its subspace coefficients, then one fp32 pseudo-gradient bucket."""
    out = []
    for shape in shapes:
        for dtype in dtypes:
            sets = rotation(nbytes_of(shape, dtype), rotate_bytes)
            out.append(Group(str(tuple(shape)), tuple(shape), dtype,
                             message_cases(shape, device, sets), sets))
            coeff = (shape[0], shape[1], SUBSPACE_RANK)
            out.append(Group(f"{tuple(coeff)} of {tuple(shape)}", coeff, dtype,
                             coefficient_cases(shape[2]),
                             rotation(nbytes_of(coeff, dtype), rotate_bytes)))
    if bucket_numel:
        b = (bucket_numel,)
        out.append(Group(f"bucket of {bucket_numel} values", b, torch.float32, bucket_cases(),
                         rotation(nbytes_of(b, torch.float32), rotate_bytes)))
    return out


def make_inputs(shape, dtype, n: int, device, seed: int = 0) -> List[torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(shape, generator=g, device=device).to(dtype) for _ in range(n)]


def context(call: int, sets: int, batch: int, per_sample: bool):
    """Call `call`'s context: its step (CocktailSGD's rolling mask, the randomized SVD's test
    matrix) and, for the delta caches, the samples of input call % sets."""
    from megatron.cc.codecs import CodecContext
    ids = torch.arange(batch) + batch * (call % sets) if per_sample else None
    return CodecContext(microbatch=0, iteration=call, sample_ids=ids)


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(call: Callable[[int], object], warmup: int, iters: int, device,
               hold: int = 0, host: Optional[list] = None) -> float:
    """Mean ms of call(warmup) .. call(warmup + iters - 1), after the untimed warm-up calls.
    The last `hold` results stay alive (a write is not absorbed by a cache before its line
    goes to memory). CUDA: events around the timed calls; CPU: time.perf_counter. `host` (a
    list) gets the mean ms the host took to issue a call: on CUDA, where that reaches the
    event time, the call waits on its launches, not on the GPU."""
    kept = collections.deque(maxlen=max(hold, 1))
    for i in range(warmup):
        kept.append(call(i))
    sync(device)
    start = end = None
    if device.type == "cuda":
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
    t0 = time.perf_counter()
    for i in range(warmup, warmup + iters):
        kept.append(call(i))
    issued_ms = (time.perf_counter() - t0) * 1e3 / iters
    if host is not None:
        host.append(issued_ms)
    if end is None:
        return issued_ms
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def warmup_calls(group: Group, case: Optional[Case] = None) -> int:
    """Warm-up: WARMUP calls, enough to fill the held outputs, and for the delta caches every
    sample set once (the timed calls then find their samples cached)."""
    n = max(WARMUP, min(group.sets, HOLD_MAX))
    return max(n, group.sets) if case is not None and case.per_sample else n


def time_copy(xs, outs, warmup: int, iters: int, device) -> float:
    n = len(xs)

    def call(i):
        outs[i % n].copy_(xs[i % n])   # into a rotating output: no result to hold
    return time_calls(call, warmup, iters, device)


def sender_payloads(codec, xs, group: Group, case: Case, calls: int) -> List[list]:
    """The sender's payloads of calls 0 .. calls - 1, in order (untimed)."""
    n, batch = len(xs), group.shape[1] if len(group.shape) > 1 else 1
    return [codec.encode(xs[i % n], context(i, n, batch, case.per_sample))
            for i in range(calls)]


def time_encode(codec, xs, group: Group, case: Case, warmup: int, iters: int, device,
                host: Optional[list] = None) -> float:
    n, batch = len(xs), group.shape[1] if len(group.shape) > 1 else 1
    return time_calls(lambda i: codec.encode(xs[i % n], context(i, n, batch, case.per_sample)),
                      warmup, iters, device, hold=min(n, HOLD_MAX), host=host)


def time_decode(codec, payloads, group: Group, case: Case, warmup: int, iters: int, device,
                outputs: Optional[list] = None, host: Optional[list] = None) -> float:
    """The receiver decodes the sender's payloads in their order; `outputs` (a list) collects
    every decoded tensor (tests); `host` as in time_calls."""
    n, batch = group.sets, group.shape[1] if len(group.shape) > 1 else 1

    def call(i):
        y = codec.decode(payloads[i], group.shape, group.dtype,
                         context(i, n, batch, case.per_sample))
        if outputs is not None:
            outputs.append(y)
        return y
    return time_calls(call, warmup, iters, device, hold=min(n, HOLD_MAX), host=host)


def same_state(a, b) -> Optional[bool]:
    """Sender and receiver caches identical (delta codecs); None where the receiver keeps no
    state of its own."""
    ca, cb = getattr(a, "cache", None), getattr(b, "cache", None)
    if ca is None and cb is None:
        return None
    return (ca is not None and cb is not None and ca.slots == cb.slots
            and torch.equal(ca.data, cb.data))


def state_nbytes(codec, shape, side: str) -> int:
    """Bytes of state one call reads and writes besides its input, payload and output:
    the delta caches' rows of the message's samples (both ends), LEP's fp32 error buffer
    and PowerSGD's Q (the sender)."""
    from megatron.cc.codecs import ActivationCache, DeltaCodec, LowRankCodec, \
        RandomizedSVDCodec
    from megatron.cc.codecs.lowrank import matrix_dims
    if isinstance(codec, DeltaCodec):
        s, b, h = shape
        slot = ActivationCache.bytes_per_sample((s, h), codec.cache_args["dtype"],
                                                codec.cache_args["bits"])
        return 2 * b * slot
    if isinstance(codec, LowRankCodec) and side == "encode":
        n, m = matrix_dims(shape)
        q = 0 if isinstance(codec, RandomizedSVDCodec) or codec.full_rank(shape) \
            else 2 * 4 * m * codec.rank
        return q + (2 * 4 * n * m if codec.error_feedback else 0)
    return 0


def row_numbers(input_bytes: int, payload_bytes: int, output_bytes: int, state_encode: int,
                state_decode: int, copy_ms: float, encode_ms: float, decode_ms: float) -> Dict:
    """The derived columns: multiples of the copy, lower bounds over the copy's bandwidth
    (it reads and writes the message), break-even link speed."""
    per_ms = 2 * input_bytes / copy_ms                 # the copy's bytes per ms
    enc_lb = (input_bytes + payload_bytes + state_encode) / per_ms
    dec_lb = (payload_bytes + output_bytes + state_decode) / per_ms
    saved = input_bytes - payload_bytes
    return {"copy_gbs": per_ms / 1e6, "encode_x": encode_ms / copy_ms,
            "decode_x": decode_ms / copy_ms, "encode_lb_ms": enc_lb, "decode_lb_ms": dec_lb,
            "encode_vs_lb": encode_ms / enc_lb, "decode_vs_lb": decode_ms / dec_lb,
            "bytes_ratio": input_bytes / payload_bytes,
            "break_even_gbps": saved * 8 / ((encode_ms + decode_ms) * 1e6)}


def measure_case(case: Case, group: Group, xs, copy_ms: float, iters: int, device,
                 outputs: Optional[list] = None) -> Dict:
    """One row: encode timed on a sender of its own, then a second sender's payloads (the same
    sequence) decoded by a separate receiver, timed."""
    from megatron.cc.codecs import payload_bytes
    warmup = warmup_calls(group, case)
    host = []
    enc_ms = time_encode(case.make(), xs, group, case, warmup, iters, device, host)
    sender, receiver = case.make(), case.make()
    payloads = sender_payloads(sender, xs, group, case, warmup + iters)
    dec_ms = time_decode(receiver, payloads, group, case, warmup, iters, device, outputs, host)
    sync(device)
    x = xs[0]
    input_bytes = x.numel() * x.element_size()
    pay = payload_bytes(payloads[0])
    raw = sender.raw_nbytes(x) if hasattr(sender, "raw_nbytes") else input_bytes
    st_enc, st_dec = (state_nbytes(sender, group.shape, s) for s in ("encode", "decode"))
    t_enc, t_dec = TARGETS[case.family]
    row = {"label": case.label, "codec": case.codec, "family": case.family,
           "message": group.what, "shape": list(group.shape), "dtype": dtype_name(group.dtype),
           "input_bytes": input_bytes, "raw_bytes": raw, "payload_bytes": pay,
           "output_bytes": input_bytes, "state_bytes_encode": st_enc,
           "state_bytes_decode": st_dec, "rotating_inputs": len(xs), "warmup": warmup,
           "iters": iters, "copy_ms": copy_ms, "encode_ms": enc_ms, "decode_ms": dec_ms,
           "encode_host_ms": host[0], "decode_host_ms": host[1],
           "launch_bound": [device.type == "cuda" and h >= LAUNCH_BOUND * t
                            for h, t in zip(host, (enc_ms, dec_ms))],
           "target_encode_x": t_enc, "target_decode_x": t_dec,
           "state_ok": same_state(sender, receiver)}
    row.update(row_numbers(input_bytes, pay, input_bytes, st_enc, st_dec, copy_ms, enc_ms,
                           dec_ms))
    for c in (sender, receiver):
        if hasattr(c, "close"):
            c.close()
    return row


HEADER = ("| message | dtype | codec | encode ms | decode ms | copy ms | encode x copy (target)"
          " | decode x copy (target) | encode lower bound ms (x) | decode lower bound ms (x) "
          "| ratio | break-even Gbit/s | host ms to issue encode / decode |"
          "\n|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def _host(ms: float, bound: bool) -> str:
    return f"{ms:.3f}" + (" (launch-bound)" if bound else "")


def format_row(r: Dict) -> str:
    state = "" if r["state_ok"] in (None, True) else " STATE MISMATCH"
    return (f"| {r['message']} | {r['dtype']} | {r['label']}{state} | {r['encode_ms']:.3f} | "
            f"{r['decode_ms']:.3f} | {r['copy_ms']:.3f} | {r['encode_x']:.2f}x "
            f"(<= {r['target_encode_x']:g}) | {r['decode_x']:.2f}x "
            f"(<= {r['target_decode_x']:g}) | {r['encode_lb_ms']:.3f} "
            f"({r['encode_vs_lb']:.1f}x) | {r['decode_lb_ms']:.3f} ({r['decode_vs_lb']:.1f}x) | "
            f"{r['bytes_ratio']:.1f}x | {r['break_even_gbps']:,.1f} | "
            f"{_host(r['encode_host_ms'], r['launch_bound'][0])} / "
            f"{_host(r['decode_host_ms'], r['launch_bound'][1])} |")


def row_key(r: Dict) -> str:
    return f"{r['label']} {r['message']} {r['dtype']}"


def codec_table(shapes, dtypes, iters: int, device, deadline: float,
                rotate_bytes: int = ROTATE_MB << 20, bucket_numel: int = DP_BUCKET_NUMEL):
    """Every group's copy and codec rows, printed as they come; {row key: row}."""
    out = {}
    print("\n" + HEADER, flush=True)
    for g in groups(shapes, dtypes, device, rotate_bytes, bucket_numel):
        if time.monotonic() > deadline:
            print(f"SKIP codecs at {g.what} {dtype_name(g.dtype)}: past --deadline-s")
            continue
        xs = make_inputs(g.shape, g.dtype, g.sets, device)
        outs = [torch.empty_like(x) for x in xs]
        copy_ms = time_copy(xs, outs, warmup_calls(g), iters, device)
        del outs
        for case in g.cases:
            r = measure_case(case, g, xs, copy_ms, iters, device)
            out[row_key(r)] = r
            print(format_row(r), flush=True)
            gc.collect()
        del xs
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def verdicts(training, codecs):
    """PERF lines for every target measured (see perf_line)."""
    lines = []
    for mine in (OURS, OURS_COMPILED):
        ours, who = training.get(mine, {}), "ours" if mine == OURS else mine
        for ref, target in ((HF_EAGER, 1.0), (HF_COMPILED, 1.0)):
            if "tokens_per_s" in ours and ref in training:
                lines.append(perf_line(f"training tokens/s {who} / {ref}",
                                       ours["tokens_per_s"] / training[ref]["tokens_per_s"],
                                       target, at_least=True))
        if "peak_gib" in ours and "peak_gib" in training.get(HF_COMPILED, {}):
            lines.append(perf_line(f"training peak memory {who} / {HF_COMPILED}",
                                   ours["peak_gib"] / training[HF_COMPILED]["peak_gib"], 1.0,
                                   at_least=False))
    for key, r in codecs.items():
        t_enc, t_dec = TARGETS[r["family"]] if "family" in r else (1.0, 1.0)
        lines.append(perf_line(f"codec {key} encode / device copy", r["encode_x"],
                               r.get("target_encode_x", t_enc), at_least=False))
        lines.append(perf_line(f"codec {key} decode / device copy", r["decode_x"],
                               r.get("target_decode_x", t_dec), at_least=False))
    return lines


# ------------------------------------------------------------------ planner codec speeds

# rows of JSON written before rows named their codec: label -> the planner's codec
LEGACY_CODECS = {"fixpoint 4-bit": "fixpoint", "fixpoint 8-bit": "fixpoint",
                 "lowrank r=16 (CB, LEP)": "lowrank", "delta 4-bit (device cache)": "delta",
                 "delta-lowbits 4/8 (device cache)": "delta-lowbits",
                 "tah t=64 4/3-bit": "tah", "cocktail 0.1/0.2 4-bit": "cocktail"}
_LEGACY_KEY = re.compile(r"^(.*) \((\d+), (\d+), (\d+)\) (\w+)$")


def speed_rows(codecs: Dict[str, Dict]) -> List[Dict]:
    """The rows codec_speeds.summarize takes, from a codecs table of this or an earlier
    version of this script (its keys then carry label, shape and dtype)."""
    out = []
    for key, r in codecs.items():
        if "codec" in r:
            out.append(r)
            continue
        m = _LEGACY_KEY.match(key)
        if not m or m.group(1) not in LEGACY_CODECS:
            continue
        label, shape, dtype = m.group(1), [int(m.group(i)) for i in (2, 3, 4)], m.group(5)
        n = nbytes_of(shape, getattr(torch, dtype))
        out.append(dict(r, label=label, codec=LEGACY_CODECS[label], shape=shape, dtype=dtype,
                        raw_bytes=n, input_bytes=n))
    return out


def speeds_doc(codecs: Dict[str, Dict], measured: Dict, device: str, torch_version: str
               ) -> Dict:
    from megatron.cc.plan import codec_speeds
    return {"device": device, "torch": torch_version, "measured": measured,
            **codec_speeds.summarize(speed_rows(codecs))}


def speeds_from(path: str, command: Optional[str], date: Optional[str], written_by: str
                ) -> Dict:
    """The codec-speeds document of an earlier run's --json output."""
    with open(path) as f:
        d = json.load(f)
    measured = d.get("measured") or {"command": command, "date": date}
    doc = speeds_doc(d["codecs"], measured, d.get("device"), d.get("torch"))
    return {**doc, "source": path, "written_by": written_by}


# --------------------------------------------------------------------------------- main

def parse_shapes(texts) -> List[tuple]:
    out = []
    for t in texts:
        dims = tuple(int(x) for x in t.split(","))
        if len(dims) != 3 or min(dims) < 1:
            raise ValueError(t)
        out.append(dims)
    return out


def _write_json(path: str, doc: Dict) -> None:
    """Whole or not at all; no driver import (the codec table runs without megatron-core)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=None,
                   help="timed iterations per measurement (default 20, 10 with --quick)")
    p.add_argument("--quick", action="store_true", help="the subset for `gpu-check --quick`: "
                   "no torch.compile row, codecs at one shape in bf16")
    p.add_argument("--deadline-s", type=float, default=None, help="wall-clock seconds after "
                   "which no further section or codec message starts (default: none)")
    p.add_argument("--json", default=None, help="also write the results here (with the "
                   "planner's codec speeds: tools/plan_compression.py plan --codec-speeds)")
    p.add_argument("--skip-training", action="store_true", help="codecs only")
    p.add_argument("--skip-codecs", action="store_true", help="training only")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu: the codec table "
                   "on the CPU at small --shapes, timed by time.perf_counter (the table's "
                   "logic, not a measurement); no training section")
    p.add_argument("--shapes", nargs="+", default=None, metavar="S,B,H",
                   help="pipeline message shapes (default: the Fig. 14 ones)")
    p.add_argument("--dtypes", default=None, help="comma-separated of bf16, fp32 (default "
                   "both; bf16 with --quick)")
    p.add_argument("--rotate-mb", type=float, default=ROTATE_MB, help="rotating inputs: at "
                   f"least this many MB in all and {ROTATE_MIN} tensors (default {ROTATE_MB})")
    p.add_argument("--bucket-numel", type=int, default=DP_BUCKET_NUMEL, help="values in the "
                   "pseudo-gradient bucket of the DiLoCo and SparseLoCo codecs (0: none)")
    p.add_argument("--speeds-from", default=None, metavar="JSON", help="no measurement: "
                   "write the codec speeds of an earlier run's --json output to --json")
    p.add_argument("--source-command", default=None, help="with --speeds-from: the command "
                   "that measured it, where its JSON does not say")
    p.add_argument("--source-date", default=None, help="with --speeds-from: its date")
    a = p.parse_args(argv)
    if a.iters is not None and a.iters < 1:
        p.error(f"--iters must be >= 1, got {a.iters}")
    try:
        shapes = parse_shapes(a.shapes) if a.shapes else (FIG14[:1] if a.quick else FIG14)
    except ValueError as e:
        p.error(f"--shapes: expected S,B,H with three positive integers, got {e}")
    names = (a.dtypes or ("bf16" if a.quick else "bf16,fp32")).split(",")
    if any(n not in DTYPES for n in names):
        p.error(f"--dtypes: expected names of {sorted(DTYPES)}, got {a.dtypes}")
    dtypes = [DTYPES[n] for n in names]
    command = "python bench/bench_gpu.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    if a.speeds_from:
        if not a.json:
            p.error("--speeds-from writes to --json: give it")
        doc = speeds_from(a.speeds_from, a.source_command, a.source_date, command)
        _write_json(a.json, doc)
        for name, gbs in doc["codec_throughput_gbs"].items():
            how = f" (derived from {doc['derived'][name]})" if name in doc["derived"] else ""
            print(f"{name}: {gbs:.2f} GB/s{how}")
        return 0
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_gpu: no CUDA device; nothing to measure")
        return 0
    iters = a.iters or (10 if a.quick else 20)
    deadline = time.monotonic() + (a.deadline_s if a.deadline_s is not None else math.inf)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device: {name} | torch {torch.__version__}", flush=True)
    training = {}
    if not a.skip_training and device.type == "cuda":
        training = training_table(iters, a.quick, deadline)
    elif not a.skip_training:
        print("SKIP training: needs CUDA")
    codecs = {} if a.skip_codecs else codec_table(
        shapes, dtypes, iters, device, deadline, int(a.rotate_mb * 2**20), a.bucket_numel)
    if a.json:
        measured = {"command": command, "date": time.strftime("%Y-%m-%d")}
        doc = speeds_doc(codecs, measured, name, torch.__version__) if codecs else \
            {"device": name, "torch": torch.__version__, "measured": measured}
        _write_json(a.json, {**doc, "rotation": {"min_mb": a.rotate_mb, "min_count": ROTATE_MIN,
                                                 "max_bytes": ROTATE_MAX_BYTES},
                             "training": training, "codecs": codecs})
    for line in verdicts(training, codecs):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
