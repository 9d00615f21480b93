"""Bytes per iteration per channel, summed over every rank: what the training log line prints.

Predicts the log line's `sent` and `raw` sums (megatron/cc/common/stats.py) for one iteration
from the model shape, the layout and the CompressionConfig, through the channels' own size
formulas: the codecs' `payload_nbytes`, megatron.cc.pipeline.policy's decisions and the dp/emb
reducers' rules (dp_bytes.py). Evaluation traffic is not counted.

    totals = channel_bytes(shape, layout, compression)               # steady state
    totals = channel_bytes(shape, layout, compression, iteration=0)  # one given iteration
    totals["pp-fwd"] == {"sent": ..., "raw": ..., "messages": ...}

The steady state has every warm-up over and averages DiLoCo-style modes over their H-step period.
"""
from typing import Dict, Optional

from megatron.cc.data_parallel.powersgd import worth_compressing
from megatron.cc.plan.dp_bytes import dp_bytes, embedding_grad_bytes
from megatron.cc.plan.shapes import Layout, ModelShape, stage_params
from megatron.cc.pipeline.p2p import Message
from megatron.cc.pipeline.registry import LinkEnd, pp_codec, pp_method
from megatron.cc.common.stats import CHANNELS

Totals = Dict[str, Dict[str, float]]
STEADY = 10 ** 12   # an iteration after every warm-up


def activation_message(m: ModelShape, layout: Layout):
    """((S, B, H), dtype, raw bytes) of one pipeline message (Megatron's seq-first layout), as
    one tp rank sends it: with scatter-gather at tp > 1 its (S/tp, B, H) slice
    (megatron.cc.pipeline.p2p.ScatterGather), so tp ranks x the slice = one whole message per replica."""
    import torch
    seq = m.seq_length
    if (layout.scatter_gather or layout.sequence_parallel) and layout.tp > 1 and layout.pp > 1:
        if seq % layout.tp:
            raise ValueError(f"scatter-gather needs the sequence ({seq}) divisible by tp "
                             f"({layout.tp}); set Layout.scatter_gather=False")
        seq //= layout.tp
    shape = (seq, layout.micro_batch_size, m.hidden_size)
    nbytes = seq * layout.micro_batch_size * m.hidden_size * \
        torch.empty((), dtype=layout.dtype).element_size()
    return shape, layout.dtype, nbytes


def _pp_bytes(m, layout, c, channel, iteration, warm: int) -> Dict[str, float]:
    """Every sending virtual stage (chunk v // pp of rank v % pp) sends each micro-batch's
    activation forward (pp-fwd) or input gradient back (pp-bwd) on every tp rank and replica;
    the plug-in's policy decides which are compressed, as on the link."""
    shape, dtype, raw = activation_message(m, layout)
    codec, M, pp, vp = pp_codec(c, channel), layout.num_microbatches, layout.pp, \
        layout.virtual_stages
    sent = 0
    for v in range(1, pp * vp) if codec is not None else ():
        spec = LinkEnd(channel, warmup_iters=warm, sender_stage=v % pp, sender_chunk=v // pp,
                        pp=pp, vp=vp, num_microbatches=M, train_iters=layout.train_iters)
        policy = pp_method(c, channel).policy(c, spec)
        for mb in range(M):
            compressed = policy is None or policy(Message(mb, iteration))
            sent += codec.payload_nbytes(shape, dtype) if compressed else raw
    reps = layout.tp * layout.dp
    n = layout.boundaries * M * reps
    return {"sent": sent * reps if codec is not None else n * raw, "raw": n * raw,
            "messages": n}


def emb_bytes(m, layout, c, iteration) -> Optional[Dict[str, float]]:
    """The tied embedding gradient summed between the first and last stage.

    Every member (2 stages x tp x dp) counts its own all-reduce. Fused (--emb-comm-opt, with
    --dp-mode allreduce only) the group spans every replica and raw counts the dp all-reduce
    it saves too; --emb-grad-comp sends P and Q where rank r pays."""
    if layout.pp < 2 or not m.tied:
        return None
    n, shape = embedding_grad_bytes(m, layout.tp)
    fused = c.fused_embedding(layout.pp)
    raw = n * (2 if fused and layout.dp > 1 else 1)
    sent = n
    if c.emb_grad_comp and iteration >= int(c.emb_grad_comp_warm_up * layout.train_iters) \
            and worth_compressing(shape, c.emb_grad_comp_rank):
        sent = 4 * c.emb_grad_comp_rank * (shape[0] + shape[1])   # P and Q, fp32 main_grad
    members = 2 * layout.tp * layout.dp
    return {"sent": members * sent, "raw": members * raw, "messages": members}


def tp_bytes(m, layout, c, iteration) -> Optional[Dict[str, float]]:
    """The tensor-parallel sums (megatron/cc/tensor_parallel/tp_reduce.py) per micro-batch, on every
    tp rank of every replica: per layer two row-parallel outputs and two column-parallel input
    gradients, all (S, B, H); the output layer's input gradient, the embedding lookup and cross
    entropy's three (B, S) fp32 tensors (exact)."""
    if layout.tp < 2:
        return None
    import torch
    n, h = m.seq_length * layout.micro_batch_size, m.hidden_size
    raw = n * h * torch.empty((), dtype=layout.dtype).element_size()

    def lowrank(on, rank, warm_up):
        return on and iteration >= int(warm_up * layout.train_iters) and (n + h) * rank < n * h

    def site(on, rank, warm_up):
        return 4 * (n + h) * rank if lowrank(on, rank, warm_up) else raw

    fwd = site(c.mp_acti_comp, c.mp_acti_comp_rank, c.mp_acti_comp_warm_up)
    bwd = site(c.mp_grad_comp, c.mp_grad_comp_rank, c.mp_grad_comp_warm_up)
    if layout.sequence_parallel:
        on = lowrank(c.mp_acti_comp, c.mp_acti_comp_rank, c.mp_acti_comp_warm_up)
        return _tp_bytes_sequence_parallel(m, layout, c, raw, fwd if on else None)
    sites = 4 * m.num_layers + 3   # + output layer, embedding lookup, cross entropy
    sent = m.num_layers * 2 * (fwd + bwd) + bwd + raw + 3 * n * 4
    total_raw = (4 * m.num_layers + 2) * raw + 3 * n * 4
    reps = layout.tp * layout.dp * layout.num_microbatches
    return {"sent": reps * sent, "raw": reps * total_raw, "messages": reps * sites}


def _tp_bytes_sequence_parallel(m, layout, c, raw: int, compressed_fwd) -> Dict[str, float]:
    """tp_bytes with --sequence-parallel (megatron/training/compression/tp_channel.py's table): an
    all-gather or reduce-scatter of an (S, B, H) tensor counts raw / 2. Per micro-batch, the
    row-parallel reduce-scatters and their gradients' all-gathers, the column-parallel gathers
    and reduce-scatters, the embedding's and cross entropy's; per step, sum_grads (fp32)."""
    if c.mp_grad_comp:
        raise ValueError("--mp-grad-comp is refused with --sequence-parallel (see the driver)")
    half = raw // 2
    n = m.seq_length * layout.micro_batch_size
    rows, cols = 2 * m.num_layers, 2 * m.num_layers + 1
    lookup = raw if m.position_embedding_type == "learned_absolute" else half
    fwd = half if compressed_fwd is None else compressed_fwd
    sent = rows * (fwd + half) + cols * 3 * half + lookup + half + 3 * n * 4
    total_raw = rows * 2 * half + cols * 3 * half + lookup + half + 3 * n * 4
    messages = 2 * rows + 2 * cols + 2 + 1
    summed = sum(p.numel for stage in range(layout.pp)
                 for p in stage_params(m, layout.tp, layout.pp, stage)
                 if "norm" in p.name or p.name.endswith(("linear_proj.bias", "linear_fc2.bias")))
    reps, ranks = layout.tp * layout.dp * layout.num_microbatches, layout.tp * layout.dp
    step = {"sent": 4 * summed * ranks, "raw": 4 * summed * ranks,
            "messages": layout.pp * ranks if summed else 0}
    return {"sent": reps * sent + step["sent"], "raw": reps * total_raw + step["raw"],
            "messages": reps * messages + step["messages"]}


def channel_bytes(m: ModelShape, layout: Layout, c, iteration: Optional[int] = None,
                  iters_per_epoch: Optional[int] = None) -> Totals:
    """{channel: {sent, raw, messages}} of one iteration over all ranks (see module doc).
    Channels that carry nothing are absent, as on the log line."""
    it = STEADY if iteration is None else iteration
    out: Totals = {}
    if layout.pp > 1:
        warm = c.compress_warmup.iters(iters_per_epoch) if iteration is not None else 0
        for channel in ("pp-fwd", "pp-bwd"):
            out[channel] = _pp_bytes(m, layout, c, channel, it, warm)
    dp = dp_bytes(m, layout, c, iteration)
    if dp is not None and dp["messages"]:
        out["dp"] = dp
    emb = emb_bytes(m, layout, c, it)
    if emb is not None:
        out["emb"] = emb
    tp = tp_bytes(m, layout, c, it)
    if tp is not None:
        out["tp"] = tp
    return {k: out[k] for k in CHANNELS if k in out}
