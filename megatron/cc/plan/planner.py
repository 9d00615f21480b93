"""Candidate configurations (layout x compression scheme x overlap), ranked by step time.

    cands = plan(shape, cluster, global_batch_size=512, micro_batch_size=1, budget_pct=2.0)
    best = cands[0]        # fastest within the quality budget
    best.flags()           # pretrain_gpt.py flags of its layout and scheme

Layouts: tp dividing the GPUs per node and the heads, pp dividing the layers, dp = world /
(tp pp), the global batch divisible by micro x dp. Schemes: SCHEMES, kept where the layout has
the channel they compress. Memory is checked only when the cluster gives gpu_memory_gb (18
bytes per parameter; activations not counted).
"""
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from megatron.cc.config import CompressionConfig
from megatron.cc.plan.channel_bytes import channel_bytes
from megatron.cc.plan.links import Cluster
from megatron.cc.plan.quality import total_gap
from megatron.cc.plan.shapes import Layout, ModelShape, stage_params
from megatron.cc.plan.step_time import StepTime, step_time


@dataclass
class Scheme:
    name: str
    overrides: Dict[str, object]
    """CompressionConfig fields (flag = --field-name)."""
    quality: List[str]
    """quality.GAPS entries whose gaps add up to this scheme's."""
    needs_pp: bool = False
    needs_dp: bool = False
    fp32_only: bool = False
    """Parameter-syncing dp modes exchange fp32 parameters (no --bf16/--fp16)."""


PP_SCHEMES = [
    Scheme("none", {}, []),
    Scheme("fwd fixpoint-4 + bwd fixpoint-8",
           dict(forward_compress_method="fixpoint", forward_bits=4,
                backward_compress_method="fixpoint", backward_bits=8),
           ["fwd fixpoint-4 + bwd fixpoint-8"], needs_pp=True),
    Scheme("fwd fixpoint-2 + bwd fixpoint-8",
           dict(forward_compress_method="fixpoint", forward_bits=2,
                backward_compress_method="fixpoint", backward_bits=8),
           ["fwd fixpoint-2 + bwd fixpoint-8"], needs_pp=True),
]
DP_SCHEMES = [
    Scheme("allreduce", {}, []),
    Scheme("SC PowerSGD", dict(grad_comp=True), ["SC PowerSGD on every stage"], needs_dp=True),
    Scheme("CocktailSGD", dict(dp_mode="cocktail_sgd", cocktail_random_ratio=0.125,
                               cocktail_topk_ratio=1.0, cocktail_bits=2,
                               dp_adam_correction=True),
           ["CocktailSGD 0.125/1/2 + Adam correction"], needs_dp=True, fp32_only=True),
    Scheme("DiLoCo H=50 int8", dict(dp_mode="diloco", diloco_inner_steps=50,
                                    diloco_compression="int8", dp_adam_correction=True),
           ["DiLoCo H=50 int8 + Adam correction"], needs_dp=True, fp32_only=True),
    Scheme("SparseLoCo H=15", dict(dp_mode="sparseloco", diloco_inner_steps=15),
           ["SparseLoCo H=15"], needs_dp=True, fp32_only=True),
]
# Optimus-CC's full configuration ("ours"): compresses pp-bwd, dp (stages 0..pp-2) and fuses emb
OPTIMUS_CC = Scheme("Optimus-CC CB+LEP+FE+SC",
                    dict(inter_grad_comp=True, inter_grad_comp_rank=16,
                         inter_grad_comp_epilogue_only=True, use_error_feedback=True,
                         lep_flush_on_uncompressed=True, emb_comm_opt=True, grad_comp=True,
                         selective_grad_comp=True),
                    ["Optimus-CC CB (epilogue, LEP, flush) + FE + SC"], needs_pp=True,
                    needs_dp=True)


@dataclass
class Candidate:
    layout: Layout
    schemes: List[Scheme]
    overlap: bool
    time: StepTime
    bytes: Dict[str, Dict[str, float]]
    gap_pct: Optional[float]
    compression: CompressionConfig = field(repr=False, default=None)

    @property
    def name(self) -> str:
        parts = [s.name for s in self.schemes if s.name not in ("none", "allreduce")]
        return " + ".join(parts) or "uncompressed"

    def flags(self) -> List[str]:
        lay = self.layout
        return ["--tensor-model-parallel-size", str(lay.tp),
                "--pipeline-model-parallel-size", str(lay.pp),
                "--micro-batch-size", str(lay.micro_batch_size),
                "--global-batch-size", str(lay.global_batch_size)] + \
            (["--no-scatter-gather-tensors-in-pipeline"]
             if lay.tp > 1 and lay.pp > 1 and not lay.scatter_gather else []) + \
            self.compression_flags()

    def compression_flags(self) -> List[str]:
        """The scheme's flags and the --overlap-* flags, without the layout's."""
        lay, out = self.layout, []
        for s in self.schemes:
            out += overrides_to_flags(s.overrides)
        if self.overlap:
            if lay.pp > 1:
                out.append("--overlap-p2p-comm")
            if lay.dp > 1 and self.compression.dp_mode == "allreduce":
                out.append("--overlap-grad-reduce")
        return out


def overrides_to_flags(overrides: Dict[str, object]) -> List[str]:
    """{field: value} -> ['--field-name', 'value'] (True: the bare switch)."""
    out = []
    for k, v in overrides.items():
        flag = "--" + k.replace("_", "-")
        out += [flag] if v is True else [flag, str(v)]
    return out


def layouts(m: ModelShape, cluster: Cluster, global_batch_size: int, micro_batch_size: int,
            dtype, train_iters: int = 1000) -> List[Layout]:
    world = cluster.world_size
    out = []
    for tp in range(1, cluster.gpus_per_node + 1):
        if cluster.gpus_per_node % tp or m.num_attention_heads % tp or m.hidden_size % tp \
                or m.ffn_hidden_size % tp or (m.num_query_groups or tp) % tp:
            continue
        for pp in range(1, m.num_layers + 1):
            if m.num_layers % pp or world % (tp * pp):
                continue
            dp = world // (tp * pp)
            if global_batch_size % (micro_batch_size * dp):
                continue
            # scatter-gather pipeline sends (the driver's default) cut the sequence in tp
            lay = Layout(tp, pp, dp, micro_batch_size, global_batch_size // (micro_batch_size * dp),
                         dtype, train_iters, scatter_gather=m.seq_length % tp == 0)
            if _fits(m, lay, cluster):
                out.append(lay)
    return out


def _fits(m, lay, cluster) -> bool:
    if cluster.gpu_memory_gb is None:
        return True
    most = max(sum(p.numel for p in stage_params(m, lay.tp, lay.pp, s)) for s in range(lay.pp))
    return 18 * most <= cluster.gpu_memory_gb * 1e9


def _scheme_sets():
    """One pipeline scheme with one dp scheme, or Optimus-CC's whole configuration."""
    for pps in PP_SCHEMES:
        for dps in DP_SCHEMES:
            yield [pps, dps]
    yield [OPTIMUS_CC]


def _applies(schemes, lay, fp32: bool, m: ModelShape) -> bool:
    for s in schemes:
        if (s.needs_pp and lay.pp < 2) or (s.needs_dp and lay.dp < 2) or \
                (s.fp32_only and not fp32):
            return False
        if s.overrides.get("dp_mode") == "sparseloco" and m.tied:
            c = CompressionConfig()
            if (m.padded_vocab(lay.tp) // lay.tp * m.hidden_size) % c.sparseloco_chunk_size:
                return False   # the chunk must divide the tied embedding (sparseloco.py)
    return True


def plan(m: ModelShape, cluster: Cluster, global_batch_size: int, micro_batch_size: int = 1,
         budget_pct: Optional[float] = None, dtype=None, train_iters: int = 1000,
         layout_list: Optional[List[Layout]] = None) -> List[Candidate]:
    """Every applicable candidate within `budget_pct` (None: no budget, unmeasured schemes
    kept), fastest first."""
    import torch
    dtype = dtype or torch.float32
    fp32 = dtype == torch.float32
    out = []
    for lay in layout_list or layouts(m, cluster, global_batch_size, micro_batch_size, dtype,
                                      train_iters):
        for schemes in _scheme_sets():
            if not _applies(schemes, lay, fp32, m):
                continue
            gap = total_gap(q for s in schemes for q in s.quality)
            if budget_pct is not None and (gap is None or gap > budget_pct):
                continue
            c = CompressionConfig(**{k: v for s in schemes for k, v in s.overrides.items()})
            overlappable = lay.pp > 1 or (lay.dp > 1 and c.dp_mode == "allreduce")
            for overlap in ((False, True) if overlappable else (False,)):
                t = step_time(m, lay, c, cluster, overlap)
                out.append(Candidate(lay, schemes, overlap, t, channel_bytes(m, lay, c), gap, c))
    out.sort(key=lambda cand: cand.time.total)
    return out


def plan_table(cands: List[Candidate], top: int) -> List[str]:
    """The first `top` candidates, one row each: layout, predicted step time and utilisation,
    expected loss gap, bytes per channel per iteration (the log line's units), scheme."""
    from megatron.cc.common.stats import human_bytes
    lines = [f"{'#':>3} {'tp':>3} {'pp':>3} {'dp':>4} {'M':>4}  {'step s':>8} {'util':>5} "
             f"{'gap %':>6}  {'pp-fwd':>10} {'pp-bwd':>10} {'dp':>10} {'emb':>10}  scheme"]
    for i, c in enumerate(cands[:top]):
        lay, b = c.layout, c.bytes
        cols = [human_bytes(b[ch]["sent"]) if ch in b else "-"
                for ch in ("pp-fwd", "pp-bwd", "dp", "emb")]
        gap = "n/a" if c.gap_pct is None else f"{c.gap_pct:.2f}"
        lines.append(f"{i + 1:>3} {lay.tp:>3} {lay.pp:>3} {lay.dp:>4} {lay.num_microbatches:>4}  "
                     f"{c.time.total:8.3f} {c.time.utilisation:5.2f} {gap:>6}  "
                     + " ".join(f"{x:>10}" for x in cols)
                     + f"  {c.name}{' (overlap)' if c.overlap else ''}")
    return lines


def with_bandwidth(cands: List[Candidate], m: ModelShape, cluster: Cluster, level: str,
                   gbps: float) -> List[float]:
    """Each candidate's step time with one link level's bandwidth changed (the plot)."""
    swept = cluster.with_link(level, gbps)
    return [step_time(m, c.layout, c.compression, swept, c.overlap).total for c in cands]
