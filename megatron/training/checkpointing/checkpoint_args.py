"""The `args` of a checkpoint file: an argparse.Namespace as Megatron-LM stores it, read back as our dict.

    file_args = args_namespace(args.to_dict(), layout, consumed_samples)   # what is saved
    write_file(file_state(shard), path)                # the same, for a whole shard dict
    args = args_dict(sd["args"])                       # our nested dict, from any of the three

The Namespace holds every flag under its Megatron-LM name plus the values Megatron-LM derives
(MEGATRON_LM_DERIVED), so tools written for Megatron-LM checkpoints read it, and our grouped
dict under `megatron_cc_args`. `args_dict` also reads our older plain dict and a Namespace
written by Megatron-LM itself (its model and parallel fields).
"""
import argparse
import dataclasses
from typing import Optional

import torch

OURS = "megatron_cc_args"   # the Namespace attribute holding our grouped args dict


def _dtype(model: dict) -> torch.dtype:
    return torch.bfloat16 if model.get("bf16") else torch.float16 if model.get("fp16") \
        else torch.float32


def _megatron_lm_derived(args: dict, layout: dict, consumed_samples: int) -> dict:
    """Attributes Megatron-LM computes in validate_args (or spells differently) and saves."""
    m, par = args.get("model", {}), args.get("parallel", {})
    tp, pp = par.get("tensor_model_parallel_size", 1), par.get("pipeline_model_parallel_size", 1)
    world = args.get("world_size", tp * pp)
    return {
        "padded_vocab_size": layout.get("padded_vocab_size"),
        "true_vocab_size": layout.get("vocab_size"),
        "consumed_train_samples": consumed_samples,
        "data_parallel_size": max(1, world // (tp * pp)),
        "bias_gelu_fusion": False,        # our GeLU is unfused: exact erf, or tanh (openai_gelu)
        "add_bias_linear": not m.get("disable_bias_linear", False),
        "add_position_embedding": m.get("position_embedding_type") == "learned_absolute",
        "use_rotary_position_embeddings": m.get("position_embedding_type") == "rope",
        "norm_epsilon": m.get("layernorm_epsilon"),
        "kv_channels": (m["hidden_size"] // m["num_attention_heads"]
                        if m.get("hidden_size") and m.get("num_attention_heads") else None),
        "params_dtype": _dtype(m),
        "apply_layernorm_1p": False, "apply_query_key_layer_scaling": False,
        "squared_relu": False, "num_experts": None,
        # interleaved runs store their chunks as model0, model1, ... (Megatron-LM's keys)
        "virtual_pipeline_model_parallel_size": par.get("virtual_pipeline_model_parallel_size"),
        "sequence_parallel": bool(par.get("sequence_parallel")) and tp > 1,
        "data_parallel_random_init": False,
        "ckpt_format": "torch", "use_dist_ckpt": False,
    }


def args_namespace(args: dict, layout: dict, consumed_samples: int = 0) -> argparse.Namespace:
    """Our args dict as the flat Namespace Megatron-LM saves (our dict kept whole inside)."""
    flat = {}
    for group in args.values():
        if isinstance(group, dict):
            for k, v in group.items():
                flat.setdefault(k, v)   # flag names are unique across groups
    flat["world_size"] = args.get("world_size")
    flat.update(_megatron_lm_derived(args, layout, consumed_samples))
    flat[OURS] = args
    return argparse.Namespace(**flat)


def file_state(shard: dict) -> dict:
    """A shard dict as written to model_optim_rng.pt: its args dict made the Namespace."""
    return dict(shard, args=args_namespace(shard["args"], shard["layout"],
                                           shard.get("consumed_samples", 0)))


def _model_from_megatron_lm(ns: argparse.Namespace) -> dict:
    from megatron.training.flags.arguments import ModelArgs
    names = {f.name for f in dataclasses.fields(ModelArgs)}
    given = {k: v for k, v in vars(ns).items() if k in names and v is not None}
    if getattr(ns, "norm_epsilon", None) is not None:
        given["layernorm_epsilon"] = ns.norm_epsilon
    if getattr(ns, "add_bias_linear", None) is not None:
        given["disable_bias_linear"] = not ns.add_bias_linear
    if getattr(ns, "use_rotary_position_embeddings", False):
        given["position_embedding_type"] = "rope"
    return dataclasses.asdict(ModelArgs(**given))   # defaults (e.g. ffn 4h) for the rest


def args_from_megatron_lm(ns: argparse.Namespace) -> dict:
    """Our grouped dict from a Namespace Megatron-LM saved (the groups tools read)."""
    tp = getattr(ns, "tensor_model_parallel_size", 1) or 1
    pp = getattr(ns, "pipeline_model_parallel_size", 1) or 1
    dp = getattr(ns, "data_parallel_size", None) or 1
    return {
        "model": _model_from_megatron_lm(ns),
        "parallel": {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
                     "virtual_pipeline_model_parallel_size":
                         getattr(ns, "virtual_pipeline_model_parallel_size", None)},
        "data": {k: getattr(ns, k, None) for k in ("tokenizer_type", "vocab_file", "merge_file",
                                                    "tokenizer_model")},
        "world_size": getattr(ns, "world_size", None) or tp * pp * dp,
        "written_by": "Megatron-LM",
    }


def args_dict(saved) -> Optional[dict]:
    """Our grouped args dict from a checkpoint's `args`, whoever wrote it (None: none saved)."""
    if saved is None or isinstance(saved, dict):
        return saved
    if isinstance(saved, argparse.Namespace):
        ours = getattr(saved, OURS, None)
        return ours if isinstance(ours, dict) else args_from_megatron_lm(saved)
    raise TypeError(f"checkpoint args of type {type(saved).__name__}: expected an "
                    f"argparse.Namespace or a dict")


def written_by_megatron_lm(args: Optional[dict]) -> bool:
    return bool(args) and args.get("written_by") == "Megatron-LM"
