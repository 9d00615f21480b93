"""Gradient synchronisation channels: dp (replicas of a stage) and emb (tied embeddings). The
dp modes' flags and wiring are plug-ins in megatron/cc/dp_modes/.

    channel.py          SyncChannel: the hooks GradSync calls, each a no-op by default
    sync.py             ExactDataParallelSync (megatron DDP's all-reduce), EmbeddingSync, GradSync
    powersgd.py         PowerSGDDataParallelSync: Optimus-CC SC (PowerSGD + error feedback)
    fused_embedding.py  FusedEmbeddingSync: Optimus-CC FE (one all-reduce per TP rank)
    randomized_svd.py   RandomizedSVDDataParallelSync: --grad-comp-type RandomizedSVD
    emb_powersgd.py     EmbPowerSGDSync: --emb-grad-comp, PowerSGD on the emb channel
  parameter-syncing dp modes (--dp-mode), acting after the optimizer step:
    cocktail.py         CocktailSGDSync: compressed parameter deltas, sharded, one step stale
    diloco.py           DiLoCoSync: H inner steps, outer Nesterov step, streaming fragments
    sparseloco.py       SparseLoCoSync: DiLoCo's loop, decayed error feedback, chunked top-k
                        at 2 bits (compress/chunk_topk.py), outer SGD
    gather_exchange.py  GatherExchange: one all-gather of fixed-size compressed payloads
    preduce.py          PartialReduceSync (SD-PIPE) and ADPSGDSync (pairwise gossip)
    preduce_sched.py    SD-PIPE's scheduling rules: per-stage schedules, windows, pairs
    sharded_exchange.py ShardedExchange: compressed reduce-scatter + all-gather with server error
    flat_codecs.py      flat-vector codecs: none, fp16, int8 / fixpoint-b, cocktail
    param_sync.py       segments (tied embedding apart), flatten / copy helpers
    hetero.py           HeteroDelay: --hetero, emulated slow replicas
    groups.py           clone_groups: a dedicated group for a background exchange thread
"""
from megatron.cc.grad_sync.fused_embedding import FusedEmbeddingSync, create_fused_embedding_group
from megatron.cc.grad_sync.powersgd import PowerSGDDataParallelSync
from megatron.cc.grad_sync.sync import EmbeddingSync, ExactDataParallelSync, GradSync

__all__ = ["GradSync", "ExactDataParallelSync", "EmbeddingSync", "PowerSGDDataParallelSync",
           "FusedEmbeddingSync", "create_fused_embedding_group"]
