"""The dp channel's bytes per iteration for every --dp-mode, summed over ranks.

The --dp-mode plug-in answers for one rank of one stage (DpMode.stage_bytes, by the counting
rule of the channel it builds) from the parameter list of that stage (shapes.stage_params);
gradients reduce in fp32 (grad_reduce_in_fp32), parameter-syncing modes exchange fp32 deltas.
preduce / adpsgd exchange with whoever is ready: not modelled.
"""
from typing import Dict, Optional

from megatron.cc.data_parallel.base import GRAD_BYTES
from megatron.cc.plan.shapes import Layout, ModelShape, stage_params


def embedding_grad_bytes(m: ModelShape, tp: int):
    """(bytes, (rows, cols)) of one tensor-parallel rank's tied embedding gradient."""
    shape = (m.padded_vocab(tp) // tp, m.hidden_size)
    return GRAD_BYTES * shape[0] * shape[1], shape


def stage_dp_bytes(m, layout, c, stage: int, iteration: Optional[int]) -> Dict[str, float]:
    """One rank of `stage` (every tp rank and replica of a stage counts the same)."""
    params = stage_params(m, layout.tp, layout.pp, stage)
    return c.dp_plugin.stage_bytes(c, params, layout, stage, iteration)


def dp_bytes(m: ModelShape, layout: Layout, c,
             iteration: Optional[int] = None) -> Optional[Dict[str, float]]:
    """{sent, raw, messages} of the dp channel over all ranks, or None when dp = 1."""
    if layout.dp < 2:
        return None   # a group of one sends nothing and counts nothing
    total = {"sent": 0, "raw": 0, "messages": 0}
    reps = layout.tp * layout.dp
    for stage in range(layout.pp):
        one = stage_dp_bytes(m, layout, c, stage, iteration)
        for k in total:
            total[k] += reps * one[k]
    return total
