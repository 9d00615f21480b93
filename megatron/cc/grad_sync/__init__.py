"""Gradient synchronisation channels: dp (replicas of a stage) and emb (tied embeddings).

    sync.py             ExactDataParallelSync (megatron DDP's all-reduce), EmbeddingSync, GradSync
    powersgd.py         PowerSGDDataParallelSync: Optimus-CC SC (PowerSGD + error feedback)
    fused_embedding.py  FusedEmbeddingSync: Optimus-CC FE (one all-reduce per TP rank)
"""
from megatron.cc.grad_sync.fused_embedding import FusedEmbeddingSync, create_fused_embedding_group
from megatron.cc.grad_sync.powersgd import PowerSGDDataParallelSync
from megatron.cc.grad_sync.sync import EmbeddingSync, ExactDataParallelSync, GradSync

__all__ = ["GradSync", "ExactDataParallelSync", "EmbeddingSync", "PowerSGDDataParallelSync",
           "FusedEmbeddingSync", "create_fused_embedding_group"]
