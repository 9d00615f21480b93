"""Step time of non-interleaved 1F1B: compute + bubble + exposed communication per channel.

Compute: the 6 N T rule (forward 2 N T FLOPs, backward 4 N T) per micro-batch of T = S x B
tokens, N the parameters a stage multiplies by on one tensor-parallel rank (its layers, plus
the output layer on the last stage; embedding lookups are free; attention's S^2 term is left
out; tensor-parallel all-reduces are the tp term below), at the cluster's achieved TFLOP/s per GPU. The
slowest stage sets the pace: compute = M (t_f + t_b), bubble = (pp - 1)(t_f + t_b).
Interleaved 1F1B (Layout.virtual_stages = vp > 1): the bubble is (pp - 1)(t_f + t_b) / vp
(Megatron's) and the tp term's fill (pp - 1) becomes (pp - 1) / vp. Of the pp vp - 1 virtual
boundaries (the wrap-around one included), B = `boundaries_per_pair` join the busiest pair of
neighbouring ranks: vp, or at pp = 2, where the wrap-around joins the same two ranks, 2 vp - 1.
That pair's link carries M B messages each way, each behind (t_f + t_b) / B of compute, so
below M becomes M B and the slot (t_f + t_b) / B. Interleaved SYNC pairs each send with the
next op's receive, so sends rarely meet head-on: its messages are paid one after the other,
(M B + pp - 2)(c_fwd + c_bwd). The real link lies between this sum and the crossing rule
below, nearer the sum; the interleaved rules are the model's roughest part (docs/planning.md,
"Validation on a real link").

Communication, per channel, from the exact bytes (channel_bytes.py) over the slowest link a
channel's group spans (links.py); a transfer of x bytes costs latency + x / bandwidth, and the
inter-datacentre bandwidth of each direction is shared by every flow crossing it that way at
once. A shaped link's token bucket (LinkSpec.burst_kb, tc tbf's burst) refills at the
bandwidth during the compute between two messages, so a message costs only what exceeds
min(burst, bandwidth x that compute) (for the flows crossing together, their sum):
    pp     one message each way per micro-batch, c_fwd and c_bwd (codec time included).
           synchronous: (pp - 1) (c_fwd + c_bwd + codecs) + (M - 1) (P - max_s compute_s):
           the fill and drain messages go alone; in the steady state each batch's activation
           and gradient cross the link at once, each direction at full rate (NCCL; gloo too
           since megatron.cc.common.transport posts receives first; a congestion control that shares
           the two directions fairly is assumed: docs/planning.md, "The link alone"), and
           P = sync_period(): every stage
           waits, each period, for the gradient from below and the activation from above, so
           P = max_s(slot_s + [s > 0] c_fwd + [s < pp - 1] c_bwd), slot_s its compute with
           its codec share (with_codecs). At pp 2 the downstream stage's longer slot (the
           output layer) hides a gradient shorter than the difference (as in fixpoint4-fwd's
           slow-link runs); a middle stage pays both messages.
           On a shared inter-datacentre link a steady-state direction carries every message
           going that way (pp_message_parts' `crossing`: with replicas placed in opposite
           directions, one's activation and the other's gradient).
           Overlapped (--overlap-p2p-comm): each stage's compute
           per micro-batch slot_s from its own parameters plus its share of the codecs
           (with_codecs: they run on the stage, not the link; c_fwd and c_bwd are then the
           transfers alone), and a steady-state period P = overlapped_period(): at every
           boundary two chains of round trips (gradient out, the upstream stage's backward
           and next forward, activation back) interleave, so P = max(slot_(s+1), (c_fwd +
           c_bwd + slot_s + slot_(s+1)) / 2), the two directions busy at once, each chain
           paying its own messages alone; where several flows share a direction (the
           `both` placement) their sum bounds P from below: they delay each other only as
           far as they fill it; exposed (pp - 1) (c_fwd + c_bwd + codecs)
           + (M - 1) (P - max_s compute_s), fill and drain alone, each direction's bucket
           refilled only while it idles (P - c). Interleaved: the forward
           and backward streams cross at once, each transfer hidden by the compute behind a
           message, each rank's codec share (half of both messages') not: (pp - 1) (c_fwd +
           c_bwd + codecs) + (M B - 1) (codecs / 2 + max(0, max(c_fwd, c_bwd) - slot)), B
           and slot as above.
    dp     a ring all-reduce of the x bytes a rank counts: 2 (D-1)/D x / bw + 2 (D-1) latency
           (+ codec time); exposed in full after backward, or past the last micro-batch's
           backward with --overlap-grad-reduce, or past the whole step when it runs in the
           background (CocktailSGD's default); DiLoCo-style modes once per H/F steps. In the
           1F1B cool-down stage s ends its last backward s t_b / vp before stage 0, so its
           all-reduce starts that much earlier: the step waits for max_s(dp_s - s t_b / vp)
           (why selective compression leaves the last stages exact).
    emb    an all-reduce over the first and last stage (every replica's with --emb-comm-opt),
           exposed in full.
    tp     the tensor-parallel sums of every micro-batch (channel_bytes.tp_bytes), ring
           all-reduces over the tp group's level, synchronous: they lengthen each forward and
           backward, so (M + pp - 1) times the slowest stage's (and overlapped pipeline
           transfers hide behind t_f + t_b + their time).
Codec time = uncompressed bytes / throughput (encode + decode); CODEC_THROUGHPUT_GBS below.
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
# cpu: one thread, from the CPU codec tables (fixpoint, delta, TAH: docs/finetune.md,
#      "Results"; lowrank: docs/quantisers.md, "CPU codec throughput"); dp codecs without a
#      CPU row take the slowest quantiser's rate.
# gpu: codec_speeds_h200.json (bench/bench_gpu.py's codec rows at the Fig. 14 shapes, the
#      median of each codec's; the file names the codecs taken from a related one; docs/gpu.md).
#      A cluster YAML's codec_throughput_gbs overrides single codecs, and
#      tools/plan_compression.py plan --codec-speeds FILE a whole fresh table.
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
    """Parameters one tensor-parallel rank of `stage` multiplies by (see module doc)."""
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
    """((transfer, codec) forward, (transfer, codec) backward) seconds for one micro-batch's
    messages (mean message of the steady state), the link's bucket refilled for refill_s
    before each; c_fwd = the forward pair's sum, c_bwd the backward's.

    On the shared inter-datacentre link a message's direction carries every flow crossing it
    that way at once: with `crossing` (the steady state, where activations and gradients
    are in flight together) the other channel's messages going the same way too; without
    (a fill or drain message) only its own channel's.

    With scatter-gather (Layout.scatter_gather, tp > 1) a message is one tp rank's slice, sent
    in parallel with its peers' on their own links; the receiving stage's intra-node all-gather
    of the slices is not modelled (small next to a slow pipeline link)."""
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
    """Virtual-stage boundaries joining the busiest pair of neighbouring pipeline ranks: one
    per model chunk (vp), and at pp = 2 the vp - 1 wrap-around ones too (the last rank's chunk
    c feeds chunk c + 1 of rank 0: the same two ranks)."""
    return 2 * vp - 1 if pp == 2 and vp > 1 else vp


def with_codecs(bare, codec: float):
    """Each stage's time per micro-batch with its share of the codecs: they run on the stages'
    own timelines (encode at the send, decode before the compute that uses the message), not
    on the link. `codec` is one forward and one backward message's encode + decode (the
    throughput table has their sum), charged half to each end: a stage with two neighbours
    pays it once, an end stage half."""
    pp = len(bare)
    return [x + codec * ((s > 0) + (s < pp - 1)) / 2 for s, x in enumerate(bare)]


def overlapped_period(slots, c_f: float, c_b: float) -> float:
    """Steady-state time per micro-batch of overlapped non-interleaved 1F1B, from each stage's
    compute per micro-batch (forward + backward) and one message's time each way.

    At a boundary (s, s+1), stage s sends activation j after a forward that follows its
    backward of the micro-batch whose gradient stage s+1 sent two of its slots earlier, so with
    E_k the end of stage s+1's k-th backward: E_(k+2) = max(E_k + c_b + slot_s + c_f,
    E_(k+1)) + slot_(s+1). Two such chains interleave, so the period is
    max(slot_(s+1), (c_f + c_b + slot_s + slot_(s+1)) / 2): half the round trip is exposed,
    and the two directions carry a message each at once. No stage can be faster than its own
    compute, nor a direction than one message per period."""
    chains = [(c_f + c_b + a + b) / 2 for a, b in zip(slots, slots[1:])]
    return max(max(slots), c_f, c_b, *chains)


def steady_overlapped_period(slots, transfers, refill_s: float):
    """overlapped_period with each direction's token bucket refilled only while it idles, to
    its fixed point: (period, (a_f, a_b), (c_f, c_b)). `transfers(refill_s)` gives one
    message's transfer each way alone (a_*) and with every flow sharing its direction (c_*),
    the bucket refilled for refill_s (first: refill_s). Each chain's round trip pays its own
    messages (a_*); a direction shared by several flows bounds the period by their sum (c_*)."""
    alone, shared = transfers(refill_s)
    period = max(overlapped_period(slots, *alone), *shared)
    for _ in range(50):
        alone, shared = transfers(period - max(shared))
        period, before = max(overlapped_period(slots, *alone), *shared), period
        if abs(period - before) <= 1e-9 * period:
            break
    return period, alone, shared


def sync_period(slots, c_f: float, c_b: float) -> float:
    """Steady-state time per micro-batch of synchronous non-interleaved 1F1B, from each stage's
    compute per micro-batch (forward + backward, its codec share included) and one message's
    time each way (the two of a batch crossing at once).

    Stage s runs forward, then one batch with s + 1 (its activation out, a gradient in), then
    backward, then one batch with s - 1 (its gradient out, the next activation in), each
    waited for before the next compute; a batch moves once both ends have posted it, and in
    the steady state the stages post in step. So stage s waits c_b per micro-batch below it
    and c_f above it: P = max_s(slot_s + [s > 0] c_f + [s < pp - 1] c_b)."""
    pp = len(slots)
    return max(x + (s > 0) * c_f + (s < pp - 1) * c_b for s, x in enumerate(slots))


def dp_seconds(m, layout, c, cluster, step_compute: float, t_b: float,
               overlap: bool = False, stage_lead: float = 0.0) -> float:
    """Exposed dp time of the slowest stage (every stage's dp groups run at once); stage s
    starts its all-reduce s x stage_lead before stage 0 (the 1F1B cool-down, module doc)."""
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
            # sends meet, so they are paid one after the other (module docstring)
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
