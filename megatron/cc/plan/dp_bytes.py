"""The dp channel's bytes per iteration for every reducer and --dp-mode, summed over ranks.

Each rule is the counting rule of the class that runs it (megatron/cc/grad_sync), applied to
the parameter list of every stage (shapes.stage_params); gradients reduce in fp32
(grad_reduce_in_fp32), parameter-syncing modes exchange fp32 deltas:

    allreduce           4 x the stage's parameters (sync.py ExactDataParallelSync); the tied
                        embedding left to the emb channel with --emb-comm-opt (pp > 1)
    --grad-comp         PowerSGD on the first k stages (powersgd.py): 1-D, embedding/output
                        and matrices where r (n + m) >= n m exact, the rest as P (n x r) and
                        Q (m x r); RandomizedSVD sends P and Q 1 + niter times
    cocktail_sgd        per segment of n values (the tied embedding apart), a ShardedExchange
                        of ceil(n / D)-value shards: counted (D P1 + D P2) / 2
    diloco              per fragment at its sync: 4 n (exact) or the ShardedExchange count
    sparseloco          per fragment at its sync: sparseloco.sync_bytes (all-gather, D P / 2)

Payload sizes P come from the flat codecs' own `flat_spec`; fragments from diloco.py's own
`split_fragments`. preduce / adpsgd exchange with whoever is ready: not modelled.
"""
import math
from types import SimpleNamespace
from typing import Dict, List, Optional

from megatron.cc.dp_modes.cocktail_sgd import flat_codec
from megatron.cc.grad_sync.diloco import DiLoCoSync, split_fragments
from megatron.cc.grad_sync.powersgd import worth_compressing
from megatron.cc.grad_sync.sparseloco import sync_bytes
from megatron.cc.plan.shapes import Layout, ModelShape, ParamSpec, shared_weight, stage_params

GRAD_BYTES = 4   # fp32 main_grad / fp32 parameter deltas


def embedding_grad_bytes(m: ModelShape, tp: int):
    """(bytes, (rows, cols)) of one tensor-parallel rank's tied embedding gradient."""
    shape = (m.padded_vocab(tp) // tp, m.hidden_size)
    return GRAD_BYTES * shape[0] * shape[1], shape


def _exact(params: List[ParamSpec]) -> Dict[str, float]:
    n = GRAD_BYTES * sum(p.numel for p in params)
    return {"sent": n, "raw": n}


def _powersgd(params: List[ParamSpec], c) -> Dict[str, float]:
    """PowerSGDDataParallelSync.reduce's (sent, raw) for one rank of one stage."""
    r = c.grad_comp_rank
    exact = sent_lowrank = raw = 0
    for p in params:
        raw += p.numel
        if p.embedding_or_output or not worth_compressing(p.shape, r):
            exact += p.numel
        else:
            n = p.shape[0]
            sent_lowrank += r * (n + p.numel // n)
    if c.grad_comp_type == "RandomizedSVD":
        sent_lowrank *= 1 + (1 if c.grad_comp_niter is None else c.grad_comp_niter)
    return {"sent": GRAD_BYTES * (exact + sent_lowrank), "raw": GRAD_BYTES * raw}


def sharded_exchange_bytes(numel: int, world: int, codec) -> int:
    """ShardedExchange's count for one n-value vector: both phases' payloads over all shards,
    halved (an all-reduce message), with shards of ceil(n / D) values."""
    s = -(-numel // world)
    payload = sum(math.prod(shape) * dt.itemsize for shape, dt in codec.flat_spec(s))
    return (world * payload + world * payload) // 2


class _Numel:
    """Stands in for a parameter where only numel() is asked (split_fragments)."""

    def __init__(self, n: int):
        self.n = n

    def numel(self) -> int:
        return self.n


def _segments(params: List[ParamSpec]) -> Dict[str, List[_Numel]]:
    """param_sync.param_segments on sizes: the tied embedding apart, then the rest."""
    emb = shared_weight(params)
    out = {}
    if emb is not None:
        out["embedding"] = [_Numel(emb.numel)]
    rest = [_Numel(p.numel) for p in params if p is not emb]
    if rest:
        out["params"] = rest
    return out


def _fragment_sync(n: int, D: int, c) -> int:
    mode = c.dp_mode
    if mode == "sparseloco":
        from megatron.cc.compress.chunk_topk import ChunkTopKCodec
        codec = ChunkTopKCodec(c.sparseloco_density, c.sparseloco_chunk_size, c.sparseloco_bits)
        return sync_bytes(n, D, codec)
    if c.diloco_compression == "none":
        return GRAD_BYTES * n
    return sharded_exchange_bytes(n, D, flat_codec(c, c.diloco_compression))


def _diloco(params, layout: Layout, c, iteration: Optional[int]) -> Dict[str, float]:
    """Fragments due at `iteration` (counted tau steps after their sync), or the H-period
    average when iteration is None."""
    H, F, tau = c.diloco_inner_steps, c.diloco_fragments, c.diloco_sync_delay
    sizes = [sum(p.numel() for p in f) for f in split_fragments(_segments(params), F)]
    if iteration is None:
        counted = range(F)
        scale = 1.0 / H
    else:
        step = iteration + 1 - tau   # the sync step whose bytes are counted now
        counted = DiLoCoSync.due(SimpleNamespace(F=F, H=H), step) if step > 0 else []
        scale = 1
    sent = sum(_fragment_sync(sizes[f], layout.dp, c) for f in counted) * scale
    raw = sum(GRAD_BYTES * sizes[f] * H for f in counted) * scale
    return {"sent": sent, "raw": raw, "messages": len(counted) * scale}


def _cocktail(params, layout: Layout, c, iteration: Optional[int]) -> Dict[str, float]:
    if iteration is not None and iteration < c.cocktail_warmup_steps:
        return dict(_exact(params), messages=1)
    if iteration is not None and iteration == c.cocktail_warmup_steps \
            and not c.cocktail_no_overlap:
        return {"sent": 0, "raw": 0, "messages": 0}   # the first exchange is counted next step
    codec = flat_codec(c, "cocktail")
    segs = _segments(params)
    sizes = [sum(p.numel() for p in v) for v in segs.values()]
    sent = sum(sharded_exchange_bytes(n, layout.dp, codec) for n in sizes)
    return {"sent": sent, "raw": GRAD_BYTES * sum(sizes), "messages": 1}


def stage_dp_bytes(m, layout, c, stage: int, iteration: Optional[int]) -> Dict[str, float]:
    """One rank of `stage` (every tp rank and replica of a stage counts the same)."""
    params = stage_params(m, layout.tp, layout.pp, stage)
    mode = c.dp_mode
    if mode == "cocktail_sgd":
        return _cocktail(params, layout, c, iteration)
    if mode in ("diloco", "sparseloco"):
        return _diloco(params, layout, c, iteration)
    if mode != "allreduce":
        raise NotImplementedError(f"--dp-mode {c.dp_mode}: its exchanges depend on which "
                                  f"replicas are ready at run time; the cost model covers "
                                  f"allreduce, cocktail_sgd, diloco and sparseloco")
    if c.emb_comm_opt and layout.pp > 1:   # fused: the emb channel carries the tied weight
        params = [p for p in params if not p.shared_embedding]
    warm = int(c.grad_comp_warm_up * layout.train_iters)
    if stage < c.compressed_stages(layout.pp) and (iteration is None or iteration >= warm):
        return dict(_powersgd(params, c), messages=1)
    return dict(_exact(params), messages=1)


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
