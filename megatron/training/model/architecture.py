"""The model families beyond GPT-2, expressed with megatron-core's own pieces.

    kwargs = config_kwargs(args.model, on_gpu)   # TransformerConfig fields of the architecture
    spec = layer_spec(args.model)                 # the layer spec GPTModel builds its layers from
    add_output_layer_bias(model)                  # GPT-J's lm_head bias, after GPTModel is built

All megatron-core except the parallel residual layer. What each flag maps to:
docs/model_families.md.
"""
import functools

import torch
import torch.nn.functional as F

from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.transformer_layer import TransformerLayer
from megatron.core.utils import make_viewless_tensor


def activation(m):
    """The MLP activation the flags name: one function per model definition, on every device.

    GeLU is exact (erf) by default, Hugging Face's "gelu"; --openai-gelu is the tanh
    approximation, Hugging Face's "gelu_new" (tools/checkpoint maps the two flags that way).
    """
    if m.swiglu:
        return F.silu
    if m.relu:
        return F.relu
    if m.openai_gelu:
        return functools.partial(F.gelu, approximate="tanh")
    return F.gelu


def config_kwargs(m, on_gpu: bool) -> dict:
    """TransformerConfig fields that depend on the architecture flags.

    megatron-core's fused bias-GeLU computes the tanh approximation, so it is enabled for
    --openai-gelu only: exact GeLU never fuses, so a GPU computes the same function as the CPU
    and the exported Hugging Face config (tests/training/test_gelu_device.py).
    """
    act = activation(m)
    bias_mlp = not m.disable_bias_linear
    fused = on_gpu and ((m.openai_gelu and bias_mlp) or m.swiglu)   # (flags are exclusive)
    if fused and m.openai_gelu:
        act = F.gelu   # selects megatron-core's fused kernel, which is tanh GeLU (see above)
    return dict(
        normalization=m.normalization, gated_linear_unit=m.swiglu, activation_func=act,
        add_bias_linear=bias_mlp, add_qkv_bias=m.add_qkv_bias,
        num_query_groups=m.num_query_groups if m.group_query_attention else None,
        rotary_interleaved=m.rotary_interleaved, bias_activation_fusion=fused)


class _NoBiasColumnParallelLinear(ColumnParallelLinear):
    """linear_qkv without a bias whatever add_bias_linear says (GPT-J's q/k/v projections)."""

    def __init__(self, *args, bias=True, **kwargs):
        super().__init__(*args, bias=False, **kwargs)


class _NoBiasRowParallelLinear(RowParallelLinear):
    """linear_proj without a bias whatever add_bias_linear says (GPT-J's out_proj)."""

    def __init__(self, *args, bias=True, **kwargs):
        super().__init__(*args, bias=False, **kwargs)


class ParallelResidualLayer(TransformerLayer):
    """out = x + dropout(attn(ln1(x))) + dropout(mlp(ln2(x))): GPT-NeoX's use_parallel_residual.

    With pre_mlp_layernorm an IdentityOp the MLP reads ln1(x) as well (GPT-J's single ln_1).
    megatron-core's TransformerLayer feeds the MLP the attention's output, hence this layer.
    """

    def forward(self, hidden_states, attention_mask=None, rotary_pos_emb=None,
                attention_bias=None, packed_seq_params=None, **kwargs):
        residual = hidden_states                                   # (S, B, H)
        normed = self.input_layernorm(hidden_states)
        attn = self.self_attention(normed, attention_mask=attention_mask,
                                   rotary_pos_emb=rotary_pos_emb, attention_bias=attention_bias,
                                   packed_seq_params=packed_seq_params)
        shared = isinstance(self.pre_mlp_layernorm, IdentityOp)
        mlp = self.mlp(normed if shared else self.pre_mlp_layernorm(hidden_states))
        with self.bias_dropout_add_exec_handler():
            fused = self.config.bias_dropout_fusion
            out = self.self_attn_bda(self.training, fused)(attn, residual, self.hidden_dropout)
            out = self.mlp_bda(self.training, fused)(mlp, out, self.hidden_dropout)
        out = make_viewless_tensor(inp=out, requires_grad=out.requires_grad, keep_graph=True)
        return out, None


def layer_spec(m):
    """megatron-core's local GPT layer spec, adapted to the architecture flags."""
    spec = get_gpt_layer_local_spec(normalization=m.normalization)
    sub = spec.submodules
    if m.disable_bias_attention:
        sub.self_attention.submodules.linear_qkv = _NoBiasColumnParallelLinear
        sub.self_attention.submodules.linear_proj = _NoBiasRowParallelLinear
    if m.parallel_residual:
        spec.module = ParallelResidualLayer
        if m.parallel_residual_shared_norm:
            sub.pre_mlp_layernorm = IdentityOp
    return spec


class SequenceParallelNorm:
    """torch LayerNorm / RMSNorm for --sequence-parallel: its weight and bias gradients are
    partial per tp rank, so they carry `sequence_parallel = True` (as megatron-core's fused and
    TE norms mark theirs) and the tp channel sums them (tp_reduce.sum_grads)."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, **_):
        norm = torch.nn.LayerNorm if config.normalization == "LayerNorm" else torch.nn.RMSNorm
        module = norm(hidden_size, eps=eps)
        for p in module.parameters():
            p.sequence_parallel = True
        return module


def sequence_parallel_spec(spec, config, pp_rank: int, vp_stage=None):
    """The block spec of a sequence-parallel model: `spec`'s torch norms, and the final norm,
    made SequenceParallelNorm (the block's submodules spelled out so the final norm is ours).
    A spec with other norms (Transformer Engine's handle sequence parallelism) is kept."""
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_block import (TransformerBlockSubmodules,
                                                             get_num_layers_to_build)
    sub = spec.submodules
    if sub.input_layernorm not in (WrappedTorchNorm, SequenceParallelNorm):
        return spec
    for name in ("input_layernorm", "pre_mlp_layernorm"):
        if getattr(sub, name) is WrappedTorchNorm:
            setattr(sub, name, SequenceParallelNorm)
    return TransformerBlockSubmodules(
        layer_specs=[spec] * get_num_layers_to_build(config, vp_stage=vp_stage, pp_rank=pp_rank),
        layer_norm=SequenceParallelNorm)


@torch.no_grad()
def add_output_layer_bias(model) -> None:
    """Give the (untied) output layer a vocabulary-parallel bias, as GPT-J's lm_head has.

    ColumnParallelLinear adds `self.bias` in its forward when it exists; it is split along the
    vocabulary like the weight (partition dim 0) and starts at zero.
    """
    layer = getattr(model, "output_layer", None)
    if layer is None or not model.post_process:
        return
    weight = layer.weight
    bias = torch.nn.Parameter(torch.zeros(weight.shape[0], dtype=weight.dtype,
                                          device=weight.device))
    bias.tensor_model_parallel, bias.partition_dim, bias.partition_stride = True, 0, 1
    layer.bias = bias
