"""Layer specs by attention implementation (--transformer-impl).

    local               megatron-core's unfused DotProductAttention: softmax(QK^T) materialised
                        as (B, heads, S, S); the CPU default and the reference.
    sdpa                the same layer with core attention done by torch's
                        scaled_dot_product_attention (causal): flash / memory-efficient kernels
                        on GPUs, no S x S tensor kept for backward; the GPU default.
    transformer_engine  megatron-core's Transformer Engine spec (fused LayerNorm-linear,
                        TE attention); needs `transformer_engine` importable; opt-in (its
                        parameter names differ, see default_impl).

The parameters (names and shapes) are the same for local and sdpa, so checkpoints and the
Hugging Face tools work with either; tests/training/test_attention.py checks equal outputs.
"""
import contextlib
import copy
import importlib.util

import torch

from megatron.core import tensor_parallel
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.training.runtime.topology import cuda_available

IMPLS = ("local", "sdpa", "transformer_engine")


@torch.compiler.disable
def _attend(q, k, v, dropout: float, scale, gqa: bool, fork: bool):
    """One causal scaled_dot_product_attention call, its dropout drawn inside the RNG
    tracker's fork when `fork`. Left out of --torch-compile's graphs: the tracker swaps
    generator states, which dynamo does not trace, and the kernel is fused already."""
    ctx = tensor_parallel.get_cuda_rng_tracker().fork() if fork else contextlib.nullcontext()
    with ctx:
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout, is_causal=True, scale=scale, enable_gqa=gqa)


class SDPAttention(DotProductAttention):
    """DotProductAttention whose forward is one torch scaled_dot_product_attention call."""

    def forward(self, query, key, value, attention_mask, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None):
        if packed_seq_params is not None or attention_bias is not None:
            raise NotImplementedError("--transformer-impl sdpa: packed sequences and attention "
                                      "bias are not supported; use transformer_engine")
        # [s, b, heads, d] -> [b, heads, s, d]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        groups = self.num_attention_heads_per_partition // self.num_query_groups_per_partition
        dropout = self.attention_dropout.p if self.training else 0.0
        # Same RNG stream as the local path's attention dropout (each TP rank its own).
        fork = bool(dropout) and not self.config.sequence_parallel
        out = _attend(q, k, v, dropout, self.softmax_scale, groups > 1, fork)
        # [b, heads, s, d] -> [s, b, heads * d]
        return out.permute(2, 0, 1, 3).reshape(out.shape[2], out.shape[0],
                                               self.hidden_size_per_partition)


def have_transformer_engine() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


def default_impl() -> str:
    """GPU: sdpa. CPU: local (the tests' reference).

    Transformer Engine is opt-in: its spec fuses the layer norms into the linears and renames
    their parameters (linear_qkv.layer_norm_weight, ...), which tools/checkpoint's Hugging Face
    mapping does not know."""
    return "sdpa" if cuda_available() else "local"


def layer_spec(impl: str, base=None):
    """The GPT layer spec for one implementation; `base`: a local spec adapted to the model's
    architecture flags (megatron.training.model.architecture), which sdpa keeps."""
    from megatron.core.models.gpt import gpt_layer_specs as specs
    if impl == "transformer_engine":
        if base is not None and base.module is not specs.get_gpt_layer_local_spec().module:
            raise ValueError("--transformer-impl transformer_engine: parallel attention+MLP "
                             "residual (GPT-NeoX/GPT-J) is not supported there; use sdpa")
        if not have_transformer_engine():
            raise ValueError("--transformer-impl transformer_engine: the transformer_engine "
                             "package is not installed; use sdpa or local")
        return specs.get_gpt_layer_with_transformer_engine_spec()
    # never edit a shared spec
    spec = copy.deepcopy(base if base is not None else specs.get_gpt_layer_local_spec())
    if impl == "sdpa":
        spec.submodules.self_attention.submodules.core_attention = SDPAttention
    elif impl != "local":
        raise ValueError(f"--transformer-impl must be one of {IMPLS}, got {impl!r}")
    return spec
