"""The GPT model: megatron-core's GPTModel with Megatron's GPT-2-shaped defaults.

By default learned absolute positions, LayerNorm, GeLU, tied input/output embeddings: this
maps one to one onto Hugging Face GPT2LMHeadModel. The architecture flags (rope, RMSNorm,
SwiGLU, GQA, bias switches, parallel residual; megatron/training/model/architecture.py) give the
Llama/Qwen, OPT, GPT-NeoX and GPT-J families (tools/checkpoint/hf_families maps them).

Initial weights depend on --seed alone, never on the tp/pp split: every parameter is drawn
from a generator keyed by (seed, its name in the *unsplit* model), in its full shape, and then
sliced to this rank's shard, so comparing layouts compares like with like.
"""
import hashlib
import math
import re
from typing import Iterator, Tuple

import torch

from megatron.core.models.gpt import GPTModel
from megatron.core.transformer import TransformerConfig
from megatron.cc.grad_sync.sync import unwrap
from megatron.training.model import architecture
from megatron.training.model import subspace
from megatron.training.runtime.compat import transformer_config_kwargs
from megatron.training.model.attention import default_impl, layer_spec
from megatron.training.runtime.topology import Topology, cuda_available


def transformer_config(args) -> TransformerConfig:
    m = args.model
    dtype = torch.bfloat16 if m.bf16 else torch.float16 if m.fp16 else torch.float32
    on_gpu = cuda_available()
    return TransformerConfig(
        num_layers=m.num_layers, hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads, ffn_hidden_size=m.ffn_hidden_size,
        tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp,
        sequence_parallel=bool(getattr(args, "sequence_parallel", False)),
        # interleaved 1F1B: megatron-core numbers each chunk's layers from this and vp_stage
        virtual_pipeline_model_parallel_size=_vp(args) if _vp(args) > 1 else None,
        attention_dropout=m.attention_dropout, hidden_dropout=m.hidden_dropout,
        layernorm_epsilon=m.layernorm_epsilon, init_method_std=m.init_method_std,
        **architecture.config_kwargs(m, on_gpu),
        bf16=m.bf16, fp16=m.fp16, params_dtype=dtype, pipeline_dtype=dtype,
        # The fused kernels are CUDA-only; on CPU their unfused equivalents run.
        # (bias_activation_fusion comes from config_kwargs: only what megatron-core can fuse)
        gradient_accumulation_fusion=False,
        masked_softmax_fusion=on_gpu and not _compat(args, "no_masked_softmax_fusion"),
        bias_dropout_fusion=on_gpu, apply_rope_fusion=False,
        persist_layer_norm=False, use_cpu_initialization=True,
        # Partial micro-batch pipelining is not used: our schedule sends whole tensors.
        variable_seq_lengths=False, deallocate_pipeline_outputs=False,
        **(args.recompute.transformer_config_kwargs() if getattr(args, "recompute", None)
           else {}),
        **transformer_config_kwargs())


def _vp(args) -> int:
    return getattr(args, "vp", 1)


def _compat(args, name: str) -> bool:
    """A Megatron-LM v2.5 compatibility flag (seed_flags.CompatArgs), False when absent."""
    return bool(getattr(getattr(args, "compat", None), name, False))


def build_gpt_model(args, config: TransformerConfig, padded_vocab_size: int,
                    topo: Topology):
    """This rank's model: a GPTModel, or with interleaving (vp > 1) its ModelChunks."""
    if _vp(args) > 1:
        return ModelChunks([_build_chunk(args, config, padded_vocab_size, topo, c)
                            for c in range(_vp(args))])
    return _build_chunk(args, config, padded_vocab_size, topo, None)


def _build_chunk(args, config: TransformerConfig, padded_vocab_size: int, topo: Topology,
                 vp_stage) -> GPTModel:
    """One GPTModel; `vp_stage` (interleaved): its chunk index. Chunk c of pp rank r holds
    virtual stage c pp + r's layers, as megatron-core numbers them (layer_number), so the
    seed-keyed init and the checkpoint names see the layers' global indices."""
    m = args.model
    chunk = 0 if vp_stage is None else vp_stage
    spec = layer_spec(_impl(args), base=architecture.layer_spec(m))
    if config.sequence_parallel:
        spec = architecture.sequence_parallel_spec(spec, config, topo.pp_rank, vp_stage)
    model = subspace.gpt_class(args)(   # GPTModel, or its subspace-constrained form
        config=config,
        transformer_layer_spec=spec,
        vocab_size=padded_vocab_size, max_sequence_length=m.max_position_embeddings,
        pre_process=topo.chunk_is_first(chunk), post_process=topo.chunk_is_last(chunk),
        parallel_output=True,
        share_embeddings_and_output_weights=not m.untie_embeddings_and_output_weights,
        position_embedding_type=m.position_embedding_type, rotary_percent=m.rotary_percent,
        rotary_base=m.rotary_base, **({} if vp_stage is None else {"vp_stage": vp_stage}))
    if m.output_layer_bias:
        architecture.add_output_layer_bias(model)
    subspace.constrain(model, args)   # --subspace-rank / --forward-compress-method subspace
    init_weights_by_seed(model, args.training.seed, args.model.init_method_std,
                         args.model.num_layers, topo.tp_rank, topo.tp_size)
    # Every parameter in the training dtype, as Megatron's Float16Module casts the module:
    # megatron-core builds torch LayerNorm and the position embedding in fp32, and on CUDA
    # bf16 word + fp32 position embeddings give fp32 activations that a bf16 linear refuses.
    # The optimizer keeps fp32 main weights of all of them.
    # Built and initialised on the CPU, trained on the rank's GPU.
    return model.to(device=topo.device, dtype=config.params_dtype)


class ModelChunks(torch.nn.Module):
    """The model chunks of one rank under interleaved 1F1B, as one module under one DDP, so
    the optimizer and the dp channels see one model, as at vp = 1. `chunk` picks which runs.
    The attributes below are the embedding's chunk's (chunk 0 of pp rank 0) and the output
    layer's (last chunk of the last rank), so the emb channel finds the tied weight as it
    does for a GPTModel.
    """

    def __init__(self, chunks):
        super().__init__()
        self.chunks = torch.nn.ModuleList(chunks)

    @property
    def config(self):
        return self.chunks[0].config

    @property
    def share_embeddings_and_output_weights(self) -> bool:
        return self.chunks[0].share_embeddings_and_output_weights

    @property
    def pre_process(self) -> bool:
        return self.chunks[0].pre_process

    @property
    def post_process(self) -> bool:
        return self.chunks[-1].post_process

    def shared_embedding_or_output_weight(self):
        return (self.chunks[0] if self.pre_process else self.chunks[-1]) \
            .shared_embedding_or_output_weight()

    def set_input_tensor(self, input_tensor, chunk: int = 0) -> None:
        self.chunks[chunk].set_input_tensor(input_tensor)

    def forward(self, *inputs, chunk: int = 0, **kwargs):
        return self.chunks[chunk](*inputs, **kwargs)


def chunks_of(model):
    """The GPTModels of a (wrapped) model: [model] at vp = 1."""
    m = unwrap(model)
    return list(m.chunks) if isinstance(m, ModelChunks) else [m]


def _impl(args) -> str:
    gpu = getattr(args, "gpu", None)
    return (gpu.transformer_impl if gpu is not None else None) or default_impl()


# --------------------------------------------------------------------------- global names

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")


def global_param_names(model: GPTModel) -> Iterator[Tuple[str, str, torch.nn.Parameter]]:
    """(local name, name in the unsplit model, parameter).

    The global name replaces the local layer index with the layer's index in the whole
    network, and names a tied output weight after the embedding it duplicates. ModelChunks:
    every chunk's, local names prefixed with chunks.<c>.
    """
    if isinstance(model, ModelChunks):
        for c, chunk in enumerate(model.chunks):
            for name, gname, param in global_param_names(chunk):
                yield f"chunks.{c}.{name}", gname, param
        return
    layers = getattr(getattr(model, "decoder", None), "layers", [])
    offsets = {i: layer.layer_number - 1 for i, layer in enumerate(layers)}
    for name, param in model.named_parameters():
        gname = _LAYER.sub(lambda mt: f"decoder.layers.{offsets[int(mt.group(1))]}.", name)
        # a stage's x0 embedding copy is the embedding; a learned boundary is named by its place
        gname = subspace.global_name(gname, offsets.get(0, 0), len(layers))
        if gname == "output_layer.weight" and model.share_embeddings_and_output_weights:
            gname = "embedding.word_embeddings.weight"
        yield name, gname, param


def partition_dim(param: torch.nn.Parameter) -> int:
    """The dimension a tensor-parallel parameter is split along, -1 for a replicated one."""
    return param.partition_dim if getattr(param, "tensor_model_parallel", False) else -1


def full_shape(param: torch.nn.Parameter, tp: int) -> Tuple[int, ...]:
    dim = partition_dim(param)
    shape = list(param.shape)
    if dim >= 0:
        shape[dim] *= tp
    return tuple(shape)


def is_glu_fc1(gname: str, glu: bool) -> bool:
    """A SwiGLU linear_fc1 is stored unsplit as [gate; up]; each tp rank holds [gate_r; up_r]."""
    return glu and gname.endswith(("linear_fc1.weight", "linear_fc1.bias"))


def shard(full: torch.Tensor, param: torch.nn.Parameter, rank: int, tp: int,
          glu: bool = False) -> torch.Tensor:
    """Rank `rank`'s slice of an unsplit tensor (contiguous shards; a GLU fc1 per half)."""
    dim = partition_dim(param)
    if dim < 0:
        return full
    if glu:
        return torch.cat([half.chunk(tp, dim=0)[rank] for half in full.chunk(2, dim=0)])
    return full.chunk(tp, dim=dim)[rank]


# --------------------------------------------------------------------------- init

def _generator(seed: int, name: str) -> torch.Generator:
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


def initial_value(gname: str, shape, seed: int, std: float, num_layers: int) -> torch.Tensor:
    """Megatron's GPT initialisation of one unsplit parameter, keyed by seed and name."""
    fixed = subspace.initial_value(gname, shape, seed)
    if fixed is not None:
        return fixed
    if "layernorm" in gname or "layer_norm" in gname or gname.endswith(("norm.weight",
                                                                        "norm.bias")):
        return torch.ones(shape) if gname.endswith("weight") else torch.zeros(shape)
    if gname.endswith(".bias"):
        return torch.zeros(shape)
    if gname.endswith(("linear_proj.weight", "linear_fc2.weight")):
        std = std / math.sqrt(2.0 * num_layers)  # Megatron's scaled init for output projections
    return torch.empty(shape).normal_(0.0, std, generator=_generator(seed, gname))


@torch.no_grad()
def init_weights_by_seed(model: GPTModel, seed: int, std: float, num_layers: int,
                         tp_rank: int, tp: int) -> None:
    glu = model.config.gated_linear_unit
    for _, gname, param in global_param_names(model):
        value = initial_value(gname, full_shape(param, tp), seed, std, num_layers)
        param.copy_(shard(value, param, tp_rank, tp, is_glu_fc1(gname, glu)).to(param.dtype))
