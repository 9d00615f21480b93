"""--compression auto: the run plans its own compression from its own links at start-up.

    auto_compress(args, device, nodes, vocab_size)   # collective, before the model is built

1. probe (link_probe.py): each pipeline boundary's ping-pong, each data-parallel group's
   all-reduce, a matmul for the compute rate; gathered, so every rank holds every number;
2. `build_cluster`: the node map (nodes.py) gives the nodes and GPUs per node; each probe is
   turned into bandwidth and latency with the cost model's own formulas (a transfer is
   latency + bytes / bandwidth; a ring all-reduce over D ranks 2 (D-1)/D bytes / bandwidth +
   2 (D-1) latency) and counted at the level its ranks span (intra_node / inter_node; median
   per level);
3. the planner (megatron/cc/plan/planner.py) ranks the schemes on the launched layout (tp, pp,
   dp and the batch sizes cannot change) within --quality-budget;
4. `choose` / `apply_candidate`: the fastest candidate whose CompressionConfig overrides and
   --overlap-* flags pass the run's validation as if given by hand (a faster one the other
   flags refuse is passed over, with the reason; within TIE of the fastest, the smallest
   expected loss gap wins) replaces the run's compression; rank 0's choice is broadcast by
   name, so every rank applies the same one even if floating point differed, and the last
   rank prints the plan and the flags.

Everything but `auto_compress` is a pure function (tests/training/test_auto_compression.py).
"""
import dataclasses
import statistics
from typing import TYPE_CHECKING, Dict, List, Sequence, Tuple

import torch

from megatron.cc.plan.links import Cluster, LinkSpec
from megatron.cc.plan.planner import Candidate, plan, plan_table
from megatron.cc.plan.shapes import Layout, ModelShape
from megatron.training.flags.auto_flags import OVERLAP_FLAGS
from megatron.training.config.config_flags import ConfigError
from megatron.training.runtime.nodes import spans_nodes

if TYPE_CHECKING:   # the probes need megatron-core's groups; parsing flags does not
    from megatron.training.runtime.link_probe import Probe

TOP = 10   # candidates printed
TIE = 0.01   # predicted step times this close count as equal: the smaller loss gap wins
PLACEHOLDER = LinkSpec(100.0, 5.0)   # a level no probed channel spans: no prediction reads it


def layout_of(args) -> Layout:
    """The launched layout, as the cost model sees it (also tools/plan_compression.py's)."""
    m = args.model
    dtype = torch.bfloat16 if m.bf16 else torch.float16 if m.fp16 else torch.float32
    return Layout(args.tp, args.pp, args.dp, args.training.micro_batch_size,
                  args.num_microbatches, dtype, args.training.train_iters,
                  virtual_stages=args.vp,
                  scatter_gather=args.parallel.scatter_gather_tensors_in_pipeline,
                  sequence_parallel=args.sequence_parallel)


# --------------------------------------------------------------------------- probes -> links

def link_of(p: "Probe") -> LinkSpec:
    """Bandwidth and latency of one probe, inverting the cost model's transfer formulas from
    the small and the large message (noise that inverts their order reads as a fast link)."""
    extra = p.large_bytes - p.small_bytes
    if p.kind == "pp":   # a round trip is two transfers
        bw = extra / max((p.large_s - p.small_s) / 2, 1e-9)
        lat = p.small_s / 2 - p.small_bytes / bw
    else:                # ring all-reduce over D ranks
        D = len(p.ranks)
        share = 2 * (D - 1) / D
        bw = share * extra / max(p.large_s - p.small_s, 1e-9)
        lat = (p.small_s - share * p.small_bytes / bw) / (2 * (D - 1))
    return LinkSpec(bw * 8 / 1e9, max(0.0, lat) * 1e6)


def node_blocks(nodes: Sequence[str]) -> Tuple[int, int]:
    """(nodes, GPUs per node) of a node map placed node by node in equal blocks, as the
    planner places ranks (links.py); anything else is refused."""
    distinct = list(dict.fromkeys(nodes))
    gpn = len(nodes) // len(distinct)
    if any(nodes[r] != distinct[r // gpn] for r in range(len(nodes))) \
            or gpn * len(distinct) != len(nodes):
        raise ConfigError(f"--compression auto: ranks are not placed node by node with the same "
                          f"count per node (rank -> node: {list(nodes)}), which the planner "
                          f"assumes; use --compression manual")
    return len(distinct), gpn


def probe_level(p: "Probe", nodes: Sequence[str]) -> str:
    return "inter_node" if spans_nodes(nodes, p.ranks) else "intra_node"


def build_cluster(nodes: Sequence[str], probes: Sequence["Probe"], tflops: float,
                  device: str) -> Cluster:
    """The cluster the planner sees: the node map's shape, each level's median probe."""
    n, gpn = node_blocks(nodes)
    found: Dict[str, List[LinkSpec]] = {}
    for p in probes:
        found.setdefault(probe_level(p, nodes), []).append(link_of(p))
    links = {lvl: LinkSpec(statistics.median(s.bandwidth_gbps for s in specs),
                           statistics.median(s.latency_us for s in specs))
             for lvl, specs in found.items()}
    needed = ["intra_node"] + (["inter_node"] if n > 1 else [])
    for lvl in needed:   # spanned by no probed channel, so read by no prediction
        if lvl not in links:
            links[lvl] = next(iter(links.values()), PLACEHOLDER)
    return Cluster(n, gpn, {k: links[k] for k in needed}, tflops_per_gpu=tflops, device=device)


# --------------------------------------------------------------------------- plan -> flags

def plan_launched(args, vocab_size: int, cluster: Cluster) -> List[Candidate]:
    """The planner on the launched layout only, within --quality-budget, fastest first."""
    shape = ModelShape.from_args(args.model, vocab_size)
    lay = layout_of(args)
    cands = plan(shape, cluster, args.training.global_batch_size,
                 args.training.micro_batch_size, args.compression.quality_budget, lay.dtype,
                 lay.train_iters, layout_list=[lay])
    if not cands:
        raise ConfigError(f"--compression auto: no scheme fits --quality-budget "
                          f"{args.compression.quality_budget} on this layout; raise it or use "
                          f"--compression manual")
    return cands


def _validated(args, cand: Candidate):
    """(compression, parallel, flags) of `cand` applied to `args`, validated as if given by
    hand (ConfigError naming the flag); `args` is not changed."""
    from megatron.training.flags.arguments import validate_args
    overrides = {k: v for s in cand.schemes for k, v in s.overrides.items()}
    compression = args.compression.replace(**overrides)
    flags = cand.compression_flags()
    parallel = dataclasses.replace(args.parallel, **{OVERLAP_FLAGS[f]: True for f in flags
                                                     if f in OVERLAP_FLAGS})
    by_hand = compression.replace(compression="manual",
                                  quality_budget=compression.default("quality_budget"))
    validate_args(dataclasses.replace(args, compression=by_hand, parallel=parallel))
    return compression, parallel, flags


def choose(args, cands: List[Candidate]) -> Tuple[Candidate, List[str]]:
    """The fastest candidate the run's other flags accept (e.g. DiLoCo's Adam correction
    needs --optimizer adam), or among those predicted within TIE of it the one with the
    smallest expected loss gap (a lossier scheme must buy more than the model's precision);
    and why each faster one was passed over."""
    accepted, passed = [], []
    for c in cands:   # fastest first: past the tie window of the first accepted, none counts
        if accepted and c.time.total > accepted[0].time.total * (1 + TIE):
            break
        try:
            _validated(args, c)
            accepted.append(c)
        except ConfigError as e:
            if not accepted:
                passed.append(f"{c.name}{' (overlap)' if c.overlap else ''}: {e}")
    if not accepted:
        raise ConfigError(f"--compression auto: the run's flags refuse every candidate, e.g. "
                          f"{passed[0]}; use --compression manual")
    fastest = accepted[0].time.total
    close = [c for c in accepted if c.time.total <= fastest * (1 + TIE)]
    return min(close, key=lambda c: (c.gap_pct, c.time.total)), passed


def apply_candidate(args, cand: Candidate) -> List[str]:
    """Train with `cand`: its overrides and overlap flags replace the run's, validated as if
    given by hand (ConfigError naming the flag, and `args` unchanged); returns the flags."""
    args.compression, args.parallel, flags = _validated(args, cand)
    return flags


def report(cluster: Cluster, probes: Sequence["Probe"], nodes: Sequence[str], shape_params: int,
           cands: List[Candidate], chosen: Candidate, flags: List[str],
           budget: float) -> List[str]:
    """What the log shows: the measured links and rate, the plan, the choice and its flags."""
    counts: Dict[str, int] = {}
    for p in probes:
        lvl = probe_level(p, nodes)
        counts[lvl] = counts.get(lvl, 0) + 1
    links = "; ".join(f"{lvl} {s.bandwidth_gbps:.3g} Gbit/s {s.latency_us:.3g} us "
                      f"({counts.get(lvl, 0)} probes)" for lvl, s in cluster.links.items())
    lay = chosen.layout
    gap = "unmeasured" if chosen.gap_pct is None else f"{chosen.gap_pct:.2f}%"
    return ([f"compression auto: measured {links}; compute {cluster.tflops_per_gpu:.3g} TFLOP/s "
             f"per {cluster.device} (matmul, slowest rank)",
             f"compression auto: {shape_params / 1e6:.2f}M parameters, tp {lay.tp} pp {lay.pp} "
             f"dp {lay.dp} M {lay.num_microbatches}, quality budget {budget}%: {len(cands)} "
             f"candidates, fastest first"]
            + plan_table(cands, TOP)
            + [f"compression auto: chose {chosen.name}{' (overlap)' if chosen.overlap else ''}: "
               f"{chosen.time.total:.4f} s/iteration predicted, utilisation "
               f"{chosen.time.utilisation:.2f}, expected loss gap {gap}",
               "compression auto: flags: " + (" ".join(flags) or "(none: uncompressed)")])


def auto_compress(args, topo, nodes: List[str], vocab_size: int) -> None:
    """Probe, plan, print and apply (collective: every rank, after the process groups exist
    and before anything reads args.compression)."""
    import torch.distributed as dist
    from megatron.training.runtime.link_probe import matmul_tflops, probe_links
    probes = probe_links(topo)
    tflops = matmul_tflops(topo.device, layout_of(args).dtype)
    cluster = build_cluster(nodes, probes, tflops, "gpu" if topo.device.type == "cuda" else "cpu")
    cands = plan_launched(args, vocab_size, cluster)
    chosen, passed = choose(args, cands)
    pick = [(chosen.name, chosen.overlap)]
    dist.broadcast_object_list(pick, src=0)   # rank 0's choice binds every rank
    chosen = next(c for c in cands if (c.name, c.overlap) == pick[0])
    budget = args.compression.quality_budget
    flags = apply_candidate(args, chosen)
    if dist.get_rank() == dist.get_world_size() - 1:   # the rank that prints the log line
        params = ModelShape.from_args(args.model, vocab_size).num_params()
        lines = report(cluster, probes, nodes, params, cands, chosen, flags, budget)
        passed = [f"compression auto: passed over {p}" for p in passed]
        print("\n".join(lines[:-2] + passed + lines[-2:]), flush=True)
