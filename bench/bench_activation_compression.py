"""AC-SGD / TAH-Quant fine-tuning: validation-loss gap, bytes and codec speed per fwd codec.

One invocation, everything local (nothing is downloaded):
  1. base model: the demo GPT (`make demo`'s shape: 4 layers, hidden 128, 4 heads, seq 128)
     pretrained uncompressed on the embedded corpus at pp=2 for --base-iters iterations
     (kept in --work-dir and reused by later invocations);
  2. task: a wikitext-style raw text file (' = module = ' articles of standard-library source
     code, a domain the prose corpus lacks) -> tools/text_to_jsonl.py -> preprocess_data;
  3. fine-tune the base with --load --finetune on the task, once per forward codec:
     none | fixpoint-4 | delta-4 | delta-lowbits (4-bit deltas, 8-bit cache) | tah (4/3 bits,
     ratio 0.8, tile 64), backward fixpoint-8 for every compressed run, same seed and data;
  4. codec throughput on the run's message (seq x micro-batch x hidden, fp32) and on a
     GPT-2.5B-sized one, next to a memory copy (tensor.clone) of the same tensor.
Prints the tables, writes bench/results/activation_compression.md and the loss plot
bench/results/activation_compression_loss.png.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_activation_compression.py   # ~10 min, 2 cores
    .venv/bin/python bench/bench_activation_compression.py --iters 100 --base-iters 100
    .venv/bin/python bench/bench_activation_compression.py --methods none,delta-4 \
        --delta-warmup-epochs 1

Targets (the issue): validation loss within 1% of uncompressed; fwd bytes >= 7.5x smaller than
fp32 at 4 bits, scales included.
"""
import argparse
import ast
import json
import os
import sys
import sysconfig

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)
from runlog import run_pretrain  # noqa: E402

DEMO = ["--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "4",
        "--seq-length", "128", "--attention-dropout", "0", "--hidden-dropout", "0",
        "--seed", "1234"]
BWD = ["--backward-compress-method", "fixpoint", "--backward-bits", "8"]
METHODS = {   # label -> forward flags
    "none": [],
    "fixpoint-4": ["--forward-compress-method", "fixpoint", "--forward-bits", "4"],
    "delta-4": ["--forward-compress-method", "delta", "--forward-bits", "4"],
    "delta-lowbits-4/8": ["--forward-compress-method", "delta-lowbits", "--forward-bits", "4",
                          "--forward-bits-act", "8"],
    "tah-4/3/0.8": ["--forward-compress-method", "tah", "--high-precision-bits", "4",
                    "--low-precision-bits", "3", "--high-precision-allocation-ratio", "0.8",
                    "--tile-size", "64"],
    # the quantiser's grid at low bits: ours (fitted, the default) against the seed's
    "fixpoint-2": ["--forward-compress-method", "fixpoint", "--forward-bits", "2"],
    "fixpoint-2 seed grid": ["--forward-compress-method", "fixpoint", "--forward-bits", "2",
                             "--quant-scheme", "seed"],
    "fixpoint-4 seed grid": ["--forward-compress-method", "fixpoint", "--forward-bits", "4",
                             "--quant-scheme", "seed"],
    "delta-2": ["--forward-compress-method", "delta", "--forward-bits", "2"],
}
CODECS = {"fixpoint-4": "fixpoint-4", "delta-4": "delta-4",
          "delta-lowbits-4/8": "delta-lowbits-4/8", "tah-4/3/0.8": "tah-4/3",
          "bwd fixpoint-8": "fixpoint-8"}   # our label -> bench_codecs label


# ----------------------------------------------------------------------------- data
def write_task_text(path: str, max_chars: int) -> int:
    """Standard-library modules' source as ' = name = ' articles, sorted, up to max_chars."""
    stdlib = sysconfig.get_paths()["stdlib"]
    total = 0
    with open(path, "w", encoding="utf-8") as out:
        for name in sorted(os.listdir(stdlib)):
            if not name.endswith(".py") or name.startswith("_"):
                continue
            try:
                src = open(os.path.join(stdlib, name), encoding="utf-8").read()
                ast.parse(src)
            except (SyntaxError, UnicodeDecodeError, OSError):
                continue
            src = src[:8000]
            out.write(f" = {name[:-3]} = \n\n{src}\n\n")
            total += len(src)
            if total >= max_chars:
                break
    return total


def prepare_task(work: str, assets, max_chars: int) -> str:
    """The task's .bin/.idx prefix (built once): raw text -> jsonl -> preprocess_data."""
    from tools import text_to_jsonl
    from tools.preprocess_data import preprocess
    prefix = os.path.join(work, "task")
    if os.path.exists(prefix + "_text_document.idx"):
        return prefix + "_text_document"
    raw, jsonl = os.path.join(work, "task.raw"), os.path.join(work, "task.jsonl")
    chars = write_task_text(raw, max_chars)
    if text_to_jsonl.main([raw, "--output", jsonl, "--split", "heading"]):
        raise RuntimeError("no documents in the task text")
    stats = preprocess(jsonl, prefix, assets.tokenizer(), append_eod=True)
    print(f"task: {chars} characters, {stats.documents} documents, "
          f"{stats.tokens['text']} tokens -> {prefix}_text_document", flush=True)
    return prefix + "_text_document"


# ----------------------------------------------------------------------------- runs
def base_model(a, work: str, layout):
    ckpt = os.path.join(work, "base")
    if os.path.exists(os.path.join(ckpt, "latest_checkpointed_iteration.txt")):
        print(f"base model: reusing {ckpt}", flush=True)
        return ckpt
    flags = DEMO + layout + [
        "--train-iters", str(a.base_iters), "--lr", "1e-3", "--min-lr", "1e-4",
        "--lr-warmup-iters", str(min(20, a.base_iters // 10)), "--lr-decay-style", "cosine",
        "--log-interval", "25",
        "--eval-interval", str(a.base_iters), "--eval-iters", "4", "--save", ckpt]
    r = run_pretrain("base", a.nproc, flags, port=a.port)
    print(f"base model: {a.base_iters} iterations on the embedded corpus, validation loss "
          f"{r.final_valid:.4f} ({r.wall_s:.0f} s) -> {ckpt}", flush=True)
    return ckpt


def finetune(a, label: str, ckpt: str, task: str, layout, vocab):
    flags = DEMO + layout + vocab + [
        "--load", ckpt, "--finetune", "--data-path", task, "--split", "95,5,0",
        "--repeat-epoch",   # every method sees the same samples in the same order
        "--train-iters", str(a.iters), "--lr", "3e-4", "--min-lr", "3e-5",
        "--lr-warmup-iters", str(min(10, a.iters // 10)), "--lr-decay-style", "cosine",
        "--log-interval", "10",
        "--eval-interval", str(max(a.iters // 4, 1)), "--eval-iters", str(a.eval_iters)]
    if label != "none":
        flags += METHODS[label] + BWD
        if label.startswith("delta") and a.delta_warmup_epochs:
            flags += ["--warmup-epochs", str(a.delta_warmup_epochs)]
    r = run_pretrain(label, a.nproc, flags, port=a.port)
    print(f"  {label:18s} validation loss {r.final_valid:.4f}  {r.steady_ms:.0f} ms/iter  "
          f"({r.wall_s:.0f} s)", flush=True)
    return r


# ----------------------------------------------------------------------------- codecs
def codec_speed(shapes, repeat: int):
    """{shape: {label: (payload ratio, enc GB/s, dec GB/s, copy GB/s)}}."""
    import torch
    import bench_codecs
    from megatron.cc.codecs import CodecContext, get_codec, payload_bytes
    torch.set_num_threads(1)
    out = {}
    for shape in shapes:
        x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
        gb = x.numel() * 4 / 1e9
        ctx = CodecContext(sample_ids=torch.arange(shape[1]))
        table = bench_codecs.codec_table(*shape)
        rows = {}
        for label, key in CODECS.items():
            name, kw = table[key]
            enc, dec = get_codec(name, **kw), get_codec(name, **kw)
            payload = enc.encode(x, ctx)
            dec.decode(payload, x.shape, x.dtype, ctx)
            copy = gb / bench_codecs.best_time(x.clone, repeat)
            t_enc = bench_codecs.best_time(lambda: enc.encode(x, ctx), repeat)
            t_dec = bench_codecs.best_time(lambda: dec.decode(payload, x.shape, x.dtype, ctx),
                                           repeat)
            rows[label] = (x.numel() * 4 / payload_bytes(payload), gb / t_enc, gb / t_dec, copy)
        out[shape] = rows
    return out


# ----------------------------------------------------------------------------- report
def loss_table(results, a) -> list:
    base = results.get("none")
    lines = ["| forward codec (bwd fixpoint-8) | final valid loss | gap vs none | fwd bytes/iter "
             "| fwd ratio | bwd bytes/iter | bwd ratio | ms/iter |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for label, r in results.items():
        gap = ((r.final_valid - base.final_valid) / base.final_valid * 100
               if base and label != "none" else 0.0)
        f, b = r.bytes_per_iter.get("pp-fwd", 0), r.bytes_per_iter.get("pp-bwd", 0)
        lines.append(f"| {label if label != 'none' else 'none (bwd none)'} | "
                     f"{r.final_valid:.4f} | {gap:+.2f}% | {f / 1024:.1f} KB | "
                     f"x{r.ratio.get('pp-fwd', 1):.1f} | {b / 1024:.1f} KB | "
                     f"x{r.ratio.get('pp-bwd', 1):.1f} | {r.steady_ms:.0f} |")
    return lines


def speed_table(speed) -> list:
    lines = []
    for shape, rows in speed.items():
        mb = shape[0] * shape[1] * shape[2] * 4 / 1e6
        lines += [f"\nmessage {tuple(shape)} fp32 ({mb:.2f} MB), 1 thread, CPU time:", "",
                  "| codec | ratio | encode GB/s | decode GB/s | copy GB/s | encode / copy |",
                  "|---|---:|---:|---:|---:|---:|"]
        for label, (ratio, enc, dec, copy) in rows.items():
            lines.append(f"| {label} | x{ratio:.2f} | {enc:.3f} | {dec:.3f} | {copy:.2f} | "
                         f"{enc / copy:.3f} |")
    return lines


def plot(curves: dict, path: str, title: str) -> None:
    """Left: training loss (log points) and validation loss; right: difference from 'none'."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, dx) = plt.subplots(1, 2, figsize=(11, 4))
    base = curves.get("none")
    for label, c in curves.items():
        its = sorted(c["losses"], key=int)
        line, = ax.plot([int(i) for i in its], [c["losses"][i] for i in its], lw=1, label=label)
        vits = sorted(c["valid"], key=int)
        ax.plot([int(i) for i in vits], [c["valid"][i] for i in vits], "o--",
                color=line.get_color(), ms=4)
        if base is not None and label != "none":
            dx.plot([int(i) for i in its], [c["losses"][i] - base["losses"][i] for i in its],
                    lw=1, color=line.get_color(), label=f"{label} (train)")
            dx.plot([int(i) for i in vits], [c["valid"][i] - base["valid"][i] for i in vits],
                    "o--", ms=4, color=line.get_color())
    ax.set(xlabel="iteration", ylabel="lm loss", title=title)
    ax.legend(fontsize=8, title="lines: train, dashed: validation", title_fontsize=8)
    dx.axhline(0, color="k", lw=0.5)
    dx.set(xlabel="iteration", ylabel="loss - loss(none)", title="difference from uncompressed")
    dx.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n", 2)[2])
    p.add_argument("--iters", type=int, default=200, help="fine-tuning iterations per run")
    p.add_argument("--base-iters", type=int, default=200,
                   help="pretraining iterations of the base model (skipped when it exists)")
    p.add_argument("--methods", default=",".join(METHODS),
                   help=f"comma-separated subset of {','.join(METHODS)}")
    p.add_argument("--micro-batch-size", type=int, default=4, help="samples per micro-batch")
    p.add_argument("--global-batch-size", type=int, default=16, help="samples per iteration")
    p.add_argument("--task-chars", type=int, default=400_000,
                   help="characters of task text (sets the epoch: ~3 characters a token)")
    p.add_argument("--eval-iters", type=int, default=8, help="validation batches per evaluation")
    p.add_argument("--delta-warmup-epochs", type=float, default=0.0,
                   help="AC-SGD warm-up of the delta runs (uncompressed epochs); default 0: "
                        "every method compresses from iteration 0 (a sample's first sight is "
                        "plain 4-bit fixpoint)")
    p.add_argument("--nproc", type=int, default=2, help="processes = pipeline stages (dp 1)")
    p.add_argument("--port", type=int, default=29653, help="torchrun master port")
    p.add_argument("--repeat", type=int, default=5, help="timed calls per codec measurement")
    p.add_argument("--work-dir", default=os.path.join(ROOT, "runs", "bench_acsgd"),
                   help="base checkpoint, task data and logs")
    p.add_argument("--out", default=os.path.join(HERE, "results"),
                   help="directory of the .md table and the loss plot")
    p.add_argument("--plot-only", action="store_true",
                   help="redraw the plot from the .json of the last run in --out and exit")
    a = p.parse_args(argv)
    png = os.path.join(a.out, "activation_compression_loss.png")
    title = f"fine-tuning with compressed activations (pp={a.nproc})"
    if a.plot_only:
        with open(os.path.join(a.out, "activation_compression.json")) as f:
            plot(json.load(f), png, title)
        return 0
    labels = a.methods.split(",")
    unknown = [m for m in labels if m not in METHODS]
    if unknown:
        p.error(f"--methods: unknown {unknown}; known: {list(METHODS)}")
    os.makedirs(a.work_dir, exist_ok=True)
    from megatron.training.data.corpus import default_assets
    assets = default_assets()
    vocab = ["--vocab-file", assets.vocab_file, "--merge-file", assets.merge_file]
    layout = ["--pipeline-model-parallel-size", str(a.nproc),
              "--micro-batch-size", str(a.micro_batch_size),
              "--global-batch-size", str(a.global_batch_size)]
    task = prepare_task(a.work_dir, assets, a.task_chars)
    ckpt = base_model(a, a.work_dir, layout)
    print(f"fine-tuning {a.iters} iterations per method at pp={a.nproc}:", flush=True)
    results = {m: finetune(a, m, ckpt, task, layout, vocab) for m in labels}
    for m, r in results.items():
        with open(os.path.join(a.work_dir, f"{m.replace('/', '_')}.log"), "w") as f:
            f.write(r.log)
    speed = codec_speed([(128, a.micro_batch_size, 128), (1024, 1, 1920)], a.repeat)
    head = (f"Fine-tuning the demo GPT (4 layers, hidden 128, seq 128; base: {a.base_iters} "
            f"iterations on the embedded corpus) on standard-library source for {a.iters} "
            f"iterations at pp={a.nproc}, micro-batch {a.micro_batch_size}, global batch "
            f"{a.global_batch_size}; bytes and ratios per iteration at the last log interval "
            f"(vs fp32), scales included; validation with uncompressed activations.")
    lines = [head, ""] + loss_table(results, a) + speed_table(speed)
    text = "\n".join(lines)
    print("\n" + text)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "activation_compression.md"), "w") as f:
        f.write(text + "\n")
    curves = {m: {"valid": {str(k): v for k, v in r.valid.items()},
                  "losses": {str(k): v for k, v in r.losses.items()},
                  "bytes": r.bytes_per_iter, "ratio": r.ratio, "ms_per_iter": r.steady_ms}
              for m, r in results.items()}
    with open(os.path.join(a.out, "activation_compression.json"), "w") as f:
        json.dump(curves, f, indent=1)
    plot(curves, png, title)
    print(f"\nwrote {a.out}/activation_compression.md and activation_compression_loss.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
