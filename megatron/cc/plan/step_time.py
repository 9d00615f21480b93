"""Predicted step time of 1F1B, plain and interleaved: compute, bubble and each channel's
exposed communication (pp, dp, emb, tp).

Compute follows the 6 N T rule at the cluster's TFLOP/s; each channel's bytes
(channel_bytes.py, dp_bytes.py) cross the slowest link its group spans (links.py), a transfer
costing latency + bytes / bandwidth beyond what the link's token bucket holds. The rules are
set out in docs/planning.md.
"""
from collections import Counter
from dataclasses import dataclass
from typing import Dict

from megatron.cc.plan import codec_speeds
from megatron.cc.plan.channel_bytes import activation_message, channel_bytes
from megatron.cc.plan.dp_bytes import stage_dp_bytes
from megatron.cc.plan.links import LEVELS, Cluster, placement
from megatron.cc.plan.shapes import Layout, ModelShape, stage_params
from megatron.cc.pipeline.registry import pp_method

# GB/s of uncompressed input for encode + decode together (1 / (1/enc + 1/dec)).
# cpu: one thread (docs/finetune.md, docs/quantisers.md); dp codecs without a CPU row take the
# slowest quantiser's rate. gpu: codec_speeds_h200.json (docs/gpu.md). A cluster YAML's
# codec_throughput_gbs overrides single codecs, plan --codec-speeds FILE the whole table.
CODEC_THROUGHPUT_GBS: Dict[str, Dict[str, float]] = {
    "cpu": {"fixpoint": 0.038, "delta": 0.024, "delta-lowbits": 0.008, "tah": 0.128,
            "lowrank": 1.78, "rsvd": 1.78, "powersgd": 1.78, "cocktail": 0.008,
            "int8": 0.038, "fixpoint-b": 0.038, "fp16": 1.0, "sparseloco": 0.008},
    "gpu": codec_speeds.load(codec_speeds.DEFAULT_GPU_FILE),
}


@dataclass
class StepTime:
    """Seconds per iteration, by part; exposed communication includes its codec time."""
    compute: float
    bubble: float
    pp: float
    dp: float
    emb: float
    tp: float = 0.0

    @property
    def total(self) -> float:
        return self.compute + self.bubble + self.pp + self.dp + self.emb + self.tp

    @property
    def utilisation(self) -> float:
        """compute / step time (the bubble counts as idle)."""
        return self.compute / self.total


def codec_seconds(cluster: Cluster, codec: str, raw_bytes: float) -> float:
    table = dict(CODEC_THROUGHPUT_GBS[cluster.device], **cluster.codec_throughput_gbs)
    return raw_bytes / (table[codec] * 1e9)


def stage_flops_params(m: ModelShape, layout: Layout, stage: int) -> int:
    """Parameters one tensor-parallel rank of `stage` multiplies by: its layers, plus the
    output layer on the last stage."""
    n = sum(p.numel for p in stage_params(m, layout.tp, layout.pp, stage)
            if not p.name.startswith("embedding.") and p.name != "output_layer.weight")
    if stage == layout.pp - 1:
        n += m.padded_vocab(layout.tp) // layout.tp * m.hidden_size   # the logits
    return n


def transfer_seconds(cluster: Cluster, level: str, nbytes: float,
                     refill_s: float = 0.0) -> float:
    """nbytes crossing one direction of the level's link at once (every flow's together), the
    bucket refilled for refill_s."""
    link = cluster.links[level]
    tokens = min(link.burst_bytes, link.bytes_per_s * refill_s)
    return link.latency_s + max(0.0, nbytes - tokens) / link.bytes_per_s


def _pp_level(cluster, layout):
    """(slowest level of any stage boundary, Counter of the boundary pairs crossing between
    two datacentres at it by (from, to) datacentre: the forward flows of each direction).
    A direction a -> b carries the forward messages of the pairs a -> b and the backward
    messages of the pairs b -> a (in the slow-link bench's `both` placement, one of each)."""
    place = placement(layout.tp, layout.dp, layout.pp, layout.rank_order)
    worst, ways = "intra_node", Counter()
    wrap = layout.virtual_stages > 1   # interleaved: the last stage also sends to stage 0
    for s in range(layout.pp - 1 + wrap):
        pairs = [(place(t, d, s), place(t, d, (s + 1) % layout.pp))
                 for t in range(layout.tp) for d in range(layout.dp)]
        levels = [cluster.level(a, b) for a, b in pairs]
        lvl = max(levels, key=LEVELS.index)
        if LEVELS.index(lvl) >= LEVELS.index(worst):
            here = Counter((cluster.rank_datacentre(a), cluster.rank_datacentre(b))
                           for (a, b), lv in zip(pairs, levels) if lv == "inter_datacentre")
            if lvl != worst or max(here.values(), default=0) >= max(ways.values(), default=0):
                ways = here
            worst = lvl
    return worst, ways


def pp_message_parts(m, layout, c, cluster, totals, refill_s: float = 0.0,
                     crossing: bool = True):
    """((transfer, codec) forward, (transfer, codec) backward) seconds for the mean steady-state
    message of one micro-batch, the link's bucket refilled for refill_s before each.

    `crossing`: the steady state, where the other channel's messages share the direction of an
    inter-datacentre link; without it (fill, drain) only the message's own channel does.
    With scatter-gather a message is one tp rank's slice."""
    level, ways = _pp_level(cluster, layout)
    _, _, raw = activation_message(m, layout)
    sent, codec = {}, {}
    for ch in ("pp-fwd", "pp-bwd"):
        t, method = totals[ch], pp_method(c, ch).profile(c)
        sent[ch] = t["sent"] / t["messages"]
        codec[ch] = codec_seconds(cluster, method, raw) \
            if sent[ch] < raw and method != "none" else 0.0
    if not ways:   # a link per GPU: each message has its direction to itself
        return tuple((transfer_seconds(cluster, level, sent[ch], refill_s), codec[ch])
                     for ch in ("pp-fwd", "pp-bwd"))
    x_f, x_b = sent["pp-fwd"], sent["pp-bwd"]
    # direction (a, b): forward of pairs a -> b, backward of pairs b -> a
    load = {(a, b): ways[a, b] * x_f + crossing * ways[b, a] * x_b for a, b in ways}
    back = {(b, a): ways[a, b] * x_b + crossing * ways[b, a] * x_f for a, b in ways}
    fwd = transfer_seconds(cluster, level, max(load.values()), refill_s)
    bwd = transfer_seconds(cluster, level, max(back.values()), refill_s)
    return (fwd, codec["pp-fwd"]), (bwd, codec["pp-bwd"])


def boundaries_per_pair(pp: int, vp: int) -> int:
    """Virtual-stage boundaries joining the busiest pair of neighbouring pipeline ranks: vp, and at
    pp = 2 also the vp - 1 wrap-around ones."""
    return 2 * vp - 1 if pp == 2 and vp > 1 else vp


def with_codecs(bare, codec: float):
    """Each stage's time per micro-batch with its share of the codecs (`codec`: one forward and one
    backward message's encode + decode), charged half to each end of a message."""
    pp = len(bare)
    return [x + codec * ((s > 0) + (s < pp - 1)) / 2 for s, x in enumerate(bare)]


def overlapped_period(slots, c_f: float, c_b: float) -> float:
    """Steady-state time per micro-batch of overlapped non-interleaved 1F1B, from each stage's
    compute per micro-batch and one message's time each way:
    max(slot_(s+1), (c_f + c_b + slot_s + slot_(s+1)) / 2), bounded below by each slot and
    message."""
    chains = [(c_f + c_b + a + b) / 2 for a, b in zip(slots, slots[1:])]
    return max(max(slots), c_f, c_b, *chains)


def steady_overlapped_period(slots, transfers, refill_s: float):
    """overlapped_period with each direction's bucket refilled only while it idles, iterated to its
    fixed point: (period, (a_f, a_b), (c_f, c_b)). `transfers(refill_s)` gives one message's
    transfer each way alone (a_*) and with every flow sharing its direction (c_*)."""
    alone, shared = transfers(refill_s)
    period = max(overlapped_period(slots, *alone), *shared)
    for _ in range(50):
        alone, shared = transfers(period - max(shared))
        period, before = max(overlapped_period(slots, *alone), *shared), period
        if abs(period - before) <= 1e-9 * period:
            break
    return period, alone, shared


def sync_period(slots, c_f: float, c_b: float) -> float:
    """Steady-state time per micro-batch of synchronous non-interleaved 1F1B:
    P = max_s(slot_s + [s > 0] c_f + [s < pp - 1] c_b), slots including their codec share."""
    pp = len(slots)
    return max(x + (s > 0) * c_f + (s < pp - 1) * c_b for s, x in enumerate(slots))


def dp_seconds(m, layout, c, cluster, step_compute: float, t_b: float,
               overlap: bool = False, stage_lead: float = 0.0) -> float:
    """Exposed dp time of the slowest stage (every stage's dp groups run at once); stage s
    starts its all-reduce s x stage_lead before stage 0 (the 1F1B cool-down)."""
    if layout.dp < 2:
        return 0.0
    place = placement(layout.tp, layout.dp, layout.pp, layout.rank_order)
    worst = 0.0
    D = layout.dp
    for s in range(layout.pp):
        ranks = [place(0, d, s) for d in range(D)]
        level = cluster.group_level(ranks)
        flows = layout.tp * layout.pp * max(1, cluster.datacentres_spanned(ranks) - 1)
        one = stage_dp_bytes(m, layout, c, s, None)   # per rank, amortised per iteration
        if not one["messages"]:
            continue
        per_sync = 1.0 / one["messages"]              # H/F for DiLoCo-style modes, else 1
        x = one["sent"] * per_sync
        t = _ring(cluster, level, D, x, flows)
        codec = c.dp_plugin.profile(c)
        if codec != "none" and one["sent"] < one["raw"]:
            t += codec_seconds(cluster, codec, one["raw"] * per_sync)
        worst = max(worst, _exposed_dp(c, t, step_compute, t_b, per_sync, overlap,
                                       s * stage_lead))
    return worst


def _sharing(level: str, flows: int) -> int:
    """Flows that share one link of `level`: the inter-datacentre interconnect is one pipe,
    the other levels are per GPU."""
    return flows if level == "inter_datacentre" else 1


def _bw(cluster, level, flows):
    return cluster.links[level].bytes_per_s / _sharing(level, flows)


def _exposed_dp(c, t: float, step: float, t_b: float, period: float, overlap: bool,
                lead: float = 0.0) -> float:
    mode = c.dp_mode
    if mode == "cocktail_sgd" and not c.cocktail_no_overlap:
        return max(0.0, t - step)
    if mode in ("diloco", "sparseloco"):
        hidden = c.diloco_sync_delay * step
        return max(0.0, t - hidden) / period
    if overlap:   # --overlap-grad-reduce: buckets go out during the last backward
        return max(0.0, t - t_b - lead)
    return max(0.0, t - lead)


def emb_seconds(m, layout, c, cluster, totals) -> float:
    if "emb" not in totals:
        return 0.0
    place = placement(layout.tp, layout.dp, layout.pp, layout.rank_order)
    fused = c.fused_embedding(layout.pp)
    reps = range(layout.dp) if fused else [0]
    ranks = [place(0, d, s) for d in reps for s in (0, layout.pp - 1)]
    k = len(ranks)
    level = cluster.group_level(ranks)
    flows = layout.tp * (1 if fused else layout.dp)
    x = totals["emb"]["sent"] / totals["emb"]["messages"]
    t = _ring(cluster, level, k, x, flows)
    if totals["emb"]["sent"] < totals["emb"]["raw"] and c.emb_grad_comp:
        t += codec_seconds(cluster, "powersgd", totals["emb"]["raw"] / totals["emb"]["messages"])
    return t


def _ring(cluster, level: str, k: int, nbytes: float, flows: int = 1) -> float:
    """A ring all-reduce of nbytes per rank over k ranks of one level (`flows` sharing an
    inter-datacentre link)."""
    return 2 * (k - 1) / k * nbytes / _bw(cluster, level, flows) + \
        2 * (k - 1) * cluster.links[level].latency_s


def tp_seconds(m, layout, c, cluster) -> float:
    """Tensor-parallel sums of one micro-batch (forward and backward) on the slowest stage, in
    the steady state (every warm-up over)."""
    tp = layout.tp
    if tp < 2:
        return 0.0
    place = placement(tp, layout.dp, layout.pp, layout.rank_order)
    level = cluster.group_level([place(t, 0, 0) for t in range(tp)])
    n, h = m.seq_length * layout.micro_batch_size, m.hidden_size
    import torch
    raw = n * h * torch.empty((), dtype=layout.dtype).element_size()

    def site(on, rank):
        if on and (n + h) * rank < n * h:   # P and Q all-reduced in fp32, then the codec
            return (_ring(cluster, level, tp, 4 * n * rank)
                    + _ring(cluster, level, tp, 4 * h * rank)
                    + codec_seconds(cluster, "powersgd", raw))
        return _ring(cluster, level, tp, raw)

    fwd, bwd = site(c.mp_acti_comp, c.mp_acti_comp_rank), site(c.mp_grad_comp, c.mp_grad_comp_rank)
    layers = m.num_layers // layout.pp
    stages = [layers * 2 * (fwd + bwd) for _ in range(layout.pp)]
    stages[0] += _ring(cluster, level, tp, raw)                          # embedding lookup
    stages[-1] += bwd + _ring(cluster, level, tp, 3 * n * 4)             # output layer, loss
    return max(stages)


def step_time(m: ModelShape, layout: Layout, c, cluster: Cluster,
              overlap: bool = False) -> StepTime:
    """Predicted seconds per iteration; `overlap`: --overlap-p2p-comm and
    --overlap-grad-reduce (the latter for --dp-mode allreduce)."""
    rate = cluster.tflops_per_gpu * 1e12
    T = m.seq_length * layout.micro_batch_size
    per_stage = [stage_flops_params(m, layout, s) for s in range(layout.pp)]
    n = max(per_stage)
    t_f, t_b = 2 * n * T / rate, 4 * n * T / rate
    M, pp, vp = layout.num_microbatches, layout.pp, layout.virtual_stages
    compute, bubble = M * (t_f + t_b), (pp - 1) * (t_f + t_b) / vp
    t_tp = tp_seconds(m, layout, c, cluster)
    totals = channel_bytes(m, layout, c)
    pp_t = 0.0
    if pp > 1:
        B = boundaries_per_pair(pp, vp)
        slot = (t_f + t_b + t_tp) / B   # the compute behind one message: hides it, refills
        bare = [6 * x * T / rate + t_tp for x in per_stage]
        (c_f, k_f), (c_b, k_b) = pp_message_parts(m, layout, c, cluster, totals, slot)
        slots = with_codecs(bare, k_f + k_b)   # vp = 1: each stage's, its codec share in
        if not overlap and vp > 1:   # each send paired with the next op's receive: few
            # sends meet, so they are paid one after the other (docs/planning.md)
            pp_t = (M * B + pp - 2) * (c_f + k_f + c_b + k_b)
        elif not overlap:   # fill and drain alone, then each batch's two messages cross
            (a_f, _), (a_b, _) = pp_message_parts(m, layout, c, cluster, totals, slot, False)
            period = sync_period(slots, c_f, c_b)
            pp_t = (pp - 1) * (a_f + k_f + a_b + k_b) + (M - 1) * (period - max(bare))
        elif vp > 1:   # each rank encodes its sends and decodes its receives: half each
            pp_t = (pp - 1) * (c_f + c_b + k_f + k_b) + (M * B - 1) * (
                (k_f + k_b) / 2 + max(0.0, max(c_f, c_b) - slot))
        else:
            def transfers(refill_s):
                (c_f, _), (c_b, _) = pp_message_parts(m, layout, c, cluster, totals, refill_s)
                (a_f, _), (a_b, _) = pp_message_parts(m, layout, c, cluster, totals, refill_s,
                                                      False)
                return (a_f, a_b), (c_f, c_b)
            period, (a_f, a_b), _ = steady_overlapped_period(slots, transfers, slot)
            pp_t = (pp - 1) * (a_f + a_b + k_f + k_b) + (M - 1) * (period - max(bare))
    dp_t = dp_seconds(m, layout, c, cluster, compute + bubble, t_b,
                      overlap and c.dp_mode == "allreduce", t_b / vp)
    return StepTime(compute, bubble, pp_t, dp_t, emb_seconds(m, layout, c, cluster, totals),
                    (M + (pp - 1) / vp) * t_tp)
