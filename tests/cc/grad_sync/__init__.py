"""Tests of megatron/cc/grad_sync: dp and emb channels."""
