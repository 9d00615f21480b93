"""Gradient synchronisation channels: dp (replicas of a stage) and emb (tied embeddings)."""
from megatron.cc.grad_sync.sync import EmbeddingSync, ExactDataParallelSync, GradSync

__all__ = ["GradSync", "ExactDataParallelSync", "EmbeddingSync"]
