"""Which compression for my model, my cluster and my links, and how fast will it be?

Two subcommands over the cost model of megatron/cc/plan:

    # the bytes per channel per iteration a run would log, in the log line's own format
    python tools/plan_compression.py bytes --world-size 4 -- \\
        --pipeline-model-parallel-size 2 --num-layers 4 --hidden-size 64 \\
        --num-attention-heads 4 --seq-length 128 --micro-batch-size 4 --global-batch-size 32 \\
        --forward-compress-method fixpoint --inter-grad-comp
    pp-fwd bytes: 129.000KB (x7.9)
    ...

    # candidate configurations on a cluster, within a quality budget, with a plot
    python tools/plan_compression.py plan --model "--num-layers 72 --hidden-size 3072 \\
        --num-attention-heads 24 --seq-length 2048" --global-batch-size 512 \\
        --cluster cluster.yaml --quality-budget 2 --plot step_time.png
    python tools/plan_compression.py plan --model llama/config.json --seq-length 4096 \\
        --global-batch-size 1024 --cluster cluster.yaml --quality-budget 2
    # the same with codec speeds measured on your GPU (bench/bench_gpu.py --json speeds.json)
    python tools/plan_compression.py plan ... --codec-speeds speeds.json

`bytes` parses the flags with pretrain_gpt.py's own parser (every flag and alias it accepts,
validated as for a GPU run, so --bf16 may be planned from a CPU box) and prints one line per
channel as the training log line prints it: bytes summed over all ranks per iteration, and the
ratio against the uncompressed bytes. Steady state by default (every warm-up over; DiLoCo-style
modes averaged over their H-step period); --iteration I gives iteration I's.
The cluster YAML is described in megatron/cc/plan/links.py; a bad key is named with its fix.
"""
import argparse
import json
import os
import shlex
import sys
from contextlib import contextmanager
from typing import List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from megatron.cc.plan.channel_bytes import channel_bytes  # noqa: E402
from megatron.cc.plan.links import ClusterConfigError, load_cluster  # noqa: E402
from megatron.cc.plan.shapes import ModelShape  # noqa: E402
from megatron.cc.common.stats import ChannelStats  # noqa: E402
from megatron.training.compression.auto_compression import layout_of  # noqa: E402
from megatron.training.config.config_flags import ConfigError  # noqa: E402


class PlanError(ValueError):
    """Bad input to the tool; the message names the flag and the fix."""


# --------------------------------------------------------------------------- flags -> model

@contextmanager
def _as_on_gpus():
    """Validate flags as on GPU nodes: --bf16 / --dp-backend nccl refuse a CPU-only box."""
    import torch
    saved = torch.cuda.is_available
    torch.cuda.is_available = lambda: True
    try:
        yield
    finally:
        torch.cuda.is_available = saved


def parse_run(flags: List[str], world_size: int):
    """pretrain_gpt.py's Args for `flags` at `world_size` (ConfigError naming the flag)."""
    from megatron.training.flags.arguments import parse_args
    if flags and flags[0] == "--":
        flags = flags[1:]
    with _as_on_gpus():
        args = parse_args(flags, world_size=world_size)
    if args.gpu.use_distributed_optimizer:
        raise PlanError("--use-distributed-optimizer pads the gradient buckets and "
                        "reduce-scatters them; the cost model does not cover it: drop the flag "
                        "to plan the all-reduce layout")
    if args.compression.compression == "auto":
        raise PlanError("--compression auto chooses the codecs at start-up from measured links; "
                        "give the flags its log printed ('compression auto: flags: ...') instead")
    return args


def vocab_size(args, given: Optional[int]) -> int:
    """--vocab-size, else the run's tokenizer (the embedded corpus's without --data-path)."""
    if given is not None:
        return given
    d = args.data
    if d.vocab_file is None and d.tokenizer_model is None:
        from megatron.training.data.corpus import default_assets
        return default_assets().vocab_size
    from megatron.training.data.tokenizer import build_tokenizer
    return build_tokenizer(d.tokenizer_type, d.vocab_file, d.merge_file,
                           d.tokenizer_model).vocab_size


def format_lines(totals) -> List[str]:
    """One line per channel, through the training log line's own formatter."""
    if not totals:
        return ["no channel carries traffic (pp = 1 and dp = 1)"]
    return ChannelStats.format(totals, 1).split(" | ")


def cmd_bytes(ns, flags: List[str]) -> int:
    args = parse_run(flags, ns.world_size)
    shape = ModelShape.from_args(args.model, vocab_size(args, ns.vocab_size))
    try:
        totals = channel_bytes(shape, layout_of(args), args.compression, ns.iteration,
                               ns.iters_per_epoch)
    except (NotImplementedError, ValueError) as e:   # an unmodelled mode, a missing input
        raise PlanError(str(e)) from None
    print("\n".join(format_lines(totals)))
    return 0


# --------------------------------------------------------------------------- plan

def hf_model_flags(path: str):
    """(pretrain_gpt.py model flags, vocab size) of a Hugging Face config.json."""
    from tools.checkpoint.hf_families import for_config
    from transformers import AutoConfig
    try:
        with open(path) as f:
            raw = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise PlanError(f"--model {path}: cannot read it as a config.json ({e}); give a Hugging "
                        f"Face config.json or a quoted string of pretrain_gpt.py flags") from None
    if "model_type" not in raw:
        raise PlanError(f"--model {path}: no model_type in it; give a Hugging Face config.json")
    config = AutoConfig.for_model(raw.pop("model_type"), **raw)
    fields = for_config(config).model_flags(config)
    out = []
    for k, v in fields.items():
        if v is True:
            out.append("--" + k.replace("_", "-"))
        elif v is not None and v is not False:
            out += ["--" + k.replace("_", "-"), str(v)]
    return out, int(config.vocab_size)


def model_flags(ns) -> List[str]:
    """--model (flags or config.json) plus the batch/sequence options given to the tool."""
    vocab = ns.vocab_size
    if ns.model.endswith(".json"):
        flags, vocab_hf = hf_model_flags(ns.model)
        vocab = vocab if vocab is not None else vocab_hf
    else:
        flags = shlex.split(ns.model)
    for name in ("seq_length", "global_batch_size", "micro_batch_size", "train_iters"):
        v = getattr(ns, name)
        if v is not None:
            flags += ["--" + name.replace("_", "-"), str(v)]
    if ns.seq_length is not None and "--max-position-embeddings" not in flags:
        flags += ["--max-position-embeddings", str(max(ns.seq_length, _max_pos(flags)))]
    ns.vocab_size = vocab
    return flags


def _max_pos(flags: List[str]) -> int:
    return int(flags[flags.index("--max-position-embeddings") + 1]) \
        if "--max-position-embeddings" in flags else 0


def print_plan(cands, top: int) -> None:
    from megatron.cc.plan.planner import plan_table
    print("\n".join(plan_table(cands, top)))


def plot(cands, shape, cluster, path: str, top: int) -> None:
    """Step time against the slowest level's bandwidth for the best candidate of each scheme."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from megatron.cc.plan.planner import with_bandwidth
    level = "inter_datacentre" if "inter_datacentre" in cluster.links else \
        "inter_node" if "inter_node" in cluster.links else "intra_node"
    best, seen = [], set()
    for c in cands:
        key = (c.name, c.overlap)
        if key not in seen:
            seen.add(key)
            best.append(c)
    best = best[:top]
    exact = next((c for c in cands if c.name == "uncompressed"), None)
    if exact is not None and exact not in best:   # the reference line
        best.append(exact)
    xs = [10 ** (k / 4) for k in range(-8, 17)]   # 0.01 .. 10,000 Gbit/s
    ys = list(zip(*[with_bandwidth(best, shape, cluster, level, x) for x in xs]))
    fig, ax = plt.subplots(figsize=(9, 5))
    for c, y in zip(best, ys):
        lay = c.layout
        ax.plot(xs, y, label=f"{c.name}{' (overlap)' if c.overlap else ''} "
                             f"[tp{lay.tp} pp{lay.pp} dp{lay.dp}]")
    ax.axvline(cluster.links[level].bandwidth_gbps, color="grey", ls=":", label="this cluster")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"{level.replace('_', '-')} bandwidth (Gbit/s)")
    ax.set_ylabel("predicted step time (s)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def with_codec_speeds(cluster, path: Optional[str]):
    """The cluster with a codec-speeds file's throughputs in place of the device's defaults
    (the cluster YAML's own codec_throughput_gbs still override single codecs)."""
    if path is None:
        return cluster
    from megatron.cc.plan import codec_speeds
    try:
        speeds = codec_speeds.load(path)
    except codec_speeds.CodecSpeedsError as e:
        raise PlanError(f"--codec-speeds {e}") from None
    cluster.codec_throughput_gbs = {**speeds, **cluster.codec_throughput_gbs}
    return cluster


def cmd_plan(ns) -> int:
    from megatron.cc.plan.planner import plan
    cluster = with_codec_speeds(load_cluster(ns.cluster), ns.codec_speeds)
    if ns.codec_speeds:
        print(f"codec speeds: {ns.codec_speeds}")
    flags = model_flags(ns)
    args = parse_run(flags, cluster.world_size)
    shape = ModelShape.from_args(args.model, vocab_size(args, ns.vocab_size))
    lay = layout_of(args)
    cands = plan(shape, cluster, args.training.global_batch_size,
                 args.training.micro_batch_size, ns.quality_budget, lay.dtype, lay.train_iters)
    if not cands:
        raise PlanError(f"no candidate layout fits: {cluster.world_size} GPUs, global batch "
                        f"{args.training.global_batch_size}, micro-batch "
                        f"{args.training.micro_batch_size}, quality budget {ns.quality_budget}%; "
                        f"raise --quality-budget, change the batch sizes or gpu_memory_gb")
    print(f"model: {shape.num_params() / 1e9:.2f}B parameters; cluster: {cluster.nodes} nodes x "
          f"{cluster.gpus_per_node} GPUs, {len(cluster.datacentres)} datacentre(s); "
          f"{len(cands)} candidates within the budget, fastest first")
    print_plan(cands, ns.top)
    best = cands[0]
    print(f"recommended: {best.name}{' (overlap)' if best.overlap else ''}: "
          f"{best.time.total:.3f} s/iteration, utilisation {best.time.utilisation:.2f}, "
          f"expected loss gap {best.gap_pct if best.gap_pct is not None else 'unmeasured'}%")
    print("flags: " + " ".join(best.flags()))
    if ns.plot:
        plot(cands, shape, cluster, ns.plot, ns.top)
    return 0


# --------------------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bytes", allow_abbrev=False,
                       help="bytes per channel per iteration of a pretrain_gpt.py run",
                       description="Predict the training log line's per-channel bytes for "
                                   "the pretrain_gpt.py flags that follow (after --).")
    b.add_argument("--world-size", type=int, required=True,
                   help="Processes of the run (torchrun's nproc x nodes).")
    b.add_argument("--vocab-size", type=int, default=None,
                   help="Tokenizer vocabulary; default: the run's tokenizer (--vocab-file, or "
                        "the embedded corpus's).")
    b.add_argument("--iteration", type=int, default=None,
                   help="Predict this 0-based iteration (warm-ups included); default: steady "
                        "state.")
    b.add_argument("--iters-per-epoch", type=int, default=None,
                   help="With --warmup-epochs and --iteration: iterations per epoch of the "
                        "training split.")
    q = sub.add_parser("plan", allow_abbrev=False,
                       help="rank candidate configurations on a cluster",
                       description="Candidate layouts x compression schemes with predicted "
                                   "step time, bytes per channel and expected quality cost.")
    q.add_argument("--model", required=True,
                   help="A quoted string of pretrain_gpt.py model flags, or a Hugging Face "
                        "config.json.")
    q.add_argument("--cluster", required=True, help="Cluster YAML (megatron/cc/plan/links.py).")
    q.add_argument("--quality-budget", type=float, default=None,
                   help="Largest expected validation-loss gap in percent (schemes never "
                        "measured are left out when given); default: no budget.")
    q.add_argument("--seq-length", type=int, default=None, help="Sequence length.")
    q.add_argument("--global-batch-size", type=int, default=None, help="Samples per iteration.")
    q.add_argument("--micro-batch-size", type=int, default=None, help="Samples per micro-batch.")
    q.add_argument("--train-iters", type=int, default=None,
                   help="Iterations (the warm-up fractions are shares of it).")
    q.add_argument("--vocab-size", type=int, default=None,
                   help="Vocabulary (default: config.json's, or the run's tokenizer).")
    q.add_argument("--codec-speeds", default=None, metavar="JSON",
                   help="Codec throughputs to plan with instead of the device's defaults "
                        "(megatron/cc/plan/codec_speeds_h200.json on GPUs): bench/bench_gpu.py "
                        "--json's output, a fresh measurement. The cluster YAML's "
                        "codec_throughput_gbs still override single codecs.")
    q.add_argument("--top", type=int, default=15, help="Candidates printed (and plotted).")
    q.add_argument("--plot", default=None,
                   help="Write a PNG of step time against the inter-datacentre bandwidth.")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ns, rest = build_parser().parse_known_args(argv)
    try:
        if ns.command == "bytes":
            return cmd_bytes(ns, rest)
        if rest:
            raise PlanError(f"unrecognised arguments: {' '.join(rest)} (model flags go in "
                            f"--model \"...\")")
        return cmd_plan(ns)
    except (PlanError, ConfigError, ClusterConfigError) as e:
        print(f"plan_compression: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
