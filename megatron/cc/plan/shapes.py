"""What the cost model knows about a model and its parallel layout.

`ModelShape` mirrors the driver's model flags (megatron/training/flags/arguments.py ModelArgs: the
same field names, so `from_args` copies them) and `stage_params` lists the parameters
megatron-core's GPTModel builds on one pipeline stage of one tensor-parallel rank, with the
local layer spec and the architecture flags of megatron/training/model/architecture.py. Shapes are
local (after the tensor-parallel split); the dp and emb channels' bytes follow from them.
"""
import math
from dataclasses import dataclass, fields
from typing import List, Optional, Tuple

import torch


def default_ffn_hidden_size(hidden_size: int, swiglu: bool) -> int:
    """Megatron-LM's MLP width: 4 H, or for SwiGLU int(8H/3 / 64) * 64 (the parameter count of
    a 4 H GeLU MLP)."""
    return int(4 * hidden_size * 2 / 3 / 64) * 64 if swiglu else 4 * hidden_size


def padded_vocab_size(vocab_size: int, divisible_by: int, tp: int) -> int:
    """Megatron's embedding rows: the vocabulary padded to a multiple of divisible_by x tp."""
    multiple = divisible_by * tp
    return int(math.ceil(vocab_size / multiple) * multiple)


@dataclass
class ModelShape:
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    vocab_size: int
    """Tokenizer vocabulary (before Megatron's padding to a multiple of 128 x tp)."""
    seq_length: int
    ffn_hidden_size: Optional[int] = None
    """Default 4 H (SwiGLU: int(8H/3 / 64) * 64), as the driver."""
    max_position_embeddings: Optional[int] = None
    num_query_groups: Optional[int] = None
    """Key/value heads (grouped-query attention); None: one per query head."""
    swiglu: bool = False
    normalization: str = "LayerNorm"
    position_embedding_type: str = "learned_absolute"
    untie_embeddings_and_output_weights: bool = False
    disable_bias_linear: bool = False
    add_qkv_bias: bool = False
    disable_bias_attention: bool = False
    parallel_residual_shared_norm: bool = False
    output_layer_bias: bool = False
    make_vocab_size_divisible_by: int = 128

    def __post_init__(self):
        if self.ffn_hidden_size is None:
            self.ffn_hidden_size = default_ffn_hidden_size(self.hidden_size, self.swiglu)
        if self.max_position_embeddings is None:
            self.max_position_embeddings = self.seq_length

    @classmethod
    def from_args(cls, model_args, vocab_size: int) -> "ModelShape":
        """From the driver's ModelArgs (duck-typed: any object with its field names)."""
        kw = {f.name: getattr(model_args, f.name) for f in fields(cls)
              if f.name != "vocab_size" and hasattr(model_args, f.name)}
        if not getattr(model_args, "group_query_attention", True):
            kw["num_query_groups"] = None
        return cls(vocab_size=vocab_size, **kw)

    @property
    def tied(self) -> bool:
        return not self.untie_embeddings_and_output_weights

    def padded_vocab(self, tp: int) -> int:
        return padded_vocab_size(self.vocab_size, self.make_vocab_size_divisible_by, tp)

    def num_params(self) -> int:
        """Parameters of the whole model (a tied embedding once, vocabulary padded at tp 1)."""
        return sum(p.numel for p in stage_params(self, 1, 1, 0))


@dataclass
class Layout:
    """How one run is split, and how long it runs (the warm-ups are fractions of it)."""
    tp: int = 1
    pp: int = 1
    dp: int = 1
    micro_batch_size: int = 1
    num_microbatches: int = 1
    """Micro-batches per iteration per replica (global batch / (micro x dp))."""
    dtype: torch.dtype = torch.float32
    """Pipeline and parameter dtype (--bf16 / --fp16); gradients reduce in fp32 regardless."""
    train_iters: int = 1000
    virtual_stages: int = 1
    """Model chunks per pipeline rank (interleaved 1F1B when > 1)."""
    scatter_gather: bool = True
    """At tp > 1 each tp rank sends 1/tp of every pipeline message (the driver's default;
    False: --no-scatter-gather-tensors-in-pipeline)."""
    sequence_parallel: bool = False
    """--sequence-parallel at tp > 1: pipeline messages are each tp rank's sequence shard, and
    the tp channel's sums become all-gathers and reduce-scatters (channel_bytes.tp_bytes)."""
    rank_order: str = "tp-dp-pp"
    """Where ranks sit (links.placement): the driver launches megatron-core's tp-dp-pp only;
    tp-pp-dp (whole replicas on consecutive nodes) is a what-if for the step time."""

    def __post_init__(self):
        for name in ("tp", "pp", "dp", "micro_batch_size", "num_microbatches", "train_iters"):
            if getattr(self, name) < 1:
                raise ValueError(f"Layout.{name} must be >= 1, got {getattr(self, name)}")
        if self.rank_order not in ("tp-dp-pp", "tp-pp-dp"):
            raise ValueError(f"Layout.rank_order must be tp-dp-pp or tp-pp-dp, got "
                             f"{self.rank_order!r}")
        if self.virtual_stages < 1 or self.virtual_stages > 1 and self.pp < 2:
            raise ValueError(f"Layout.virtual_stages must be >= 1 and needs pp >= 2 when > 1, "
                             f"got {self.virtual_stages} at pp {self.pp}")

    @property
    def boundaries(self) -> int:
        """Pipeline boundaries a micro-batch crosses each way: pp vp - 1 (interleaved, the
        wrap-around ones from the last rank to rank 0 included)."""
        return self.pp * self.virtual_stages - 1

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.num_microbatches * self.dp


@dataclass
class ParamSpec:
    name: str
    shape: Tuple[int, ...]
    tp_split: bool = False
    """Split across tensor-parallel ranks (each holds this local shape)."""
    embedding_or_output: bool = False
    """megatron-core's is_embedding_or_output_parameter (word embedding, output layer)."""
    shared_embedding: bool = False
    """The tied word embedding as this stage holds it (first stage, or the last one's copy)."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def _layer(m: ModelShape, tp: int, i: int) -> List[ParamSpec]:
    H, heads = m.hidden_size, m.num_attention_heads
    head_dim = H // heads
    groups = m.num_query_groups or heads
    norm_bias = m.normalization == "LayerNorm"
    bias_linear = not m.disable_bias_linear
    qkv_bias = (bias_linear or m.add_qkv_bias) and not m.disable_bias_attention
    proj_bias = bias_linear and not m.disable_bias_attention
    fc1_out = m.ffn_hidden_size * (2 if m.swiglu else 1)
    pre = f"decoder.layers.{i}."
    out = [ParamSpec(pre + "input_layernorm.weight", (H,))]
    if norm_bias:
        out.append(ParamSpec(pre + "input_layernorm.bias", (H,)))
    qkv = (heads + 2 * groups) * head_dim // tp
    out.append(ParamSpec(pre + "self_attention.linear_qkv.weight", (qkv, H), True))
    if qkv_bias:
        out.append(ParamSpec(pre + "self_attention.linear_qkv.bias", (qkv,), True))
    out.append(ParamSpec(pre + "self_attention.linear_proj.weight", (H, heads * head_dim // tp),
                         True))
    if proj_bias:
        out.append(ParamSpec(pre + "self_attention.linear_proj.bias", (H,)))
    if not m.parallel_residual_shared_norm:
        out.append(ParamSpec(pre + "pre_mlp_layernorm.weight", (H,)))
        if norm_bias:
            out.append(ParamSpec(pre + "pre_mlp_layernorm.bias", (H,)))
    out.append(ParamSpec(pre + "mlp.linear_fc1.weight", (fc1_out // tp, H), True))
    if bias_linear:
        out.append(ParamSpec(pre + "mlp.linear_fc1.bias", (fc1_out // tp,), True))
    out.append(ParamSpec(pre + "mlp.linear_fc2.weight", (H, m.ffn_hidden_size // tp), True))
    if bias_linear:
        out.append(ParamSpec(pre + "mlp.linear_fc2.bias", (H,)))
    return out


def stage_params(m: ModelShape, tp: int, pp: int, stage: int) -> List[ParamSpec]:
    """Parameters of pipeline stage `stage` on one tensor-parallel rank, in model order."""
    if m.num_layers % pp:
        raise ValueError(f"num_layers ({m.num_layers}) is not divisible by pp ({pp})")
    H, V = m.hidden_size, m.padded_vocab(tp) // tp
    first, last = stage == 0, stage == pp - 1
    per = m.num_layers // pp
    out: List[ParamSpec] = []
    if first:
        out.append(ParamSpec("embedding.word_embeddings.weight", (V, H), True, True, m.tied))
        if m.position_embedding_type == "learned_absolute":
            out.append(ParamSpec("embedding.position_embeddings.weight",
                                 (m.max_position_embeddings, H)))
    for i in range(per):
        out += _layer(m, tp, i)
    if last:
        out.append(ParamSpec("decoder.final_layernorm.weight", (H,)))
        if m.normalization == "LayerNorm":
            out.append(ParamSpec("decoder.final_layernorm.bias", (H,)))
        if not (m.tied and first):   # pp == 1 and tied: the output layer is the embedding
            out.append(ParamSpec("output_layer.weight", (V, H), True, True, m.tied))
        if m.output_layer_bias:
            out.append(ParamSpec("output_layer.bias", (V,), True))
    return out
