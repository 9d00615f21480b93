"""What every Hugging Face family mapping shares: the contract, tensor look-up, padding, QKV.

A family is a `Family` subclass with a `model_type` (config.json's), the transformers class
name, and five pure functions over state dicts and configs. Our side is always
{global name: unsplit tensor} (megatron/training/model/model.py's names, vocabulary padded).
"""
from typing import Dict, List

import torch

from tools.checkpoint.errors import ConversionError

WORD_EMB = "embedding.word_embeddings.weight"
POS_EMB = "embedding.position_embeddings.weight"
OUTPUT = "output_layer.weight"
OUTPUT_BIAS = "output_layer.bias"
FINAL_NORM = "decoder.final_layernorm"


def layer(i: int, suffix: str) -> str:
    return f"decoder.layers.{i}.{suffix}"


class Family:
    """One Hugging Face architecture <-> our GPTModel with the matching flags."""

    model_type: str = ""
    hf_class: str = ""

    def model_flags(self, config) -> Dict[str, object]:
        """args['model'] fields for this config; ConversionError naming a field we cannot run."""
        raise NotImplementedError

    def from_hf(self, sd: Dict[str, torch.Tensor], config, rows: int
                ) -> Dict[str, torch.Tensor]:
        """HF state dict -> {our global name: tensor}, vocabulary padded to `rows`."""
        raise NotImplementedError

    def requires(self, model_args: dict) -> Dict[str, tuple]:
        """{args['model'] field: (value this family needs, why)} for export."""
        raise NotImplementedError

    def hf_config(self, model_args: dict, vocab_size: int, eod: int, dtype: torch.dtype):
        raise NotImplementedError

    def to_hf(self, params: Dict[str, torch.Tensor], model_args: dict, vocab_size: int
              ) -> Dict[str, torch.Tensor]:
        raise NotImplementedError

    def unsupported(self, model_args: dict) -> List[str]:
        """Why our model (its args['model']) is not this family; empty when it is."""
        reasons = []
        for name, (want, why) in self.requires(model_args).items():
            have = model_args.get(name, _DEFAULTS.get(name))
            if have != want:
                reasons.append(f"--{name.replace('_', '-')}={have} ({why})")
        return reasons


# Values of architecture fields in checkpoints written before the fields existed.
_DEFAULTS = {"position_embedding_type": "learned_absolute", "normalization": "LayerNorm",
             "swiglu": False, "relu": False, "openai_gelu": False,
             "group_query_attention": False, "disable_bias_linear": False,
             "add_qkv_bias": False, "disable_bias_attention": False,
             "parallel_residual": False, "parallel_residual_shared_norm": False,
             "output_layer_bias": False, "rotary_interleaved": False, "rotary_percent": 1.0,
             "untie_embeddings_and_output_weights": False}


def refuse(config, field: str, value, why: str) -> None:
    raise ConversionError(f"{config.model_type} config.json: {field}={value!r} is not supported "
                          f"({why})")


def check_fields(config, wanted: Dict[str, tuple]) -> None:
    """{config field: (accepted values, why)}: refuse the first field holding another value."""
    for field, (accepted, why) in wanted.items():
        if not hasattr(config, field):
            continue
        value = getattr(config, field)
        if value not in accepted:
            refuse(config, field, value, why)


def getter(sd: Dict[str, torch.Tensor], model_type: str):
    def get(name: str) -> torch.Tensor:
        if name not in sd:
            raise ConversionError(f"the Hugging Face {model_type} state dict has no '{name}'")
        return sd[name]
    return get


def pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[0] > rows:
        raise ConversionError(f"{t.shape[0]} vocabulary rows exceed {rows}")
    return torch.cat([t, t.new_zeros((rows - t.shape[0],) + tuple(t.shape[1:]))])


def cut_vocab(t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    if t.shape[0] < vocab_size:
        raise ConversionError(f"the tokenizer has {vocab_size} tokens but the embedding only "
                              f"{t.shape[0]} rows; wrong tokenizer?")
    return t[:vocab_size].clone()


def pack_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, groups: int
             ) -> torch.Tensor:
    """Separate q (heads*d), k, v (groups*d) rows -> megatron-core's linear_qkv rows.

    megatron-core orders rows per query group: [q of the group's heads | k | v] for group 0,
    then group 1, ...; tensor parallelism then gives each rank whole groups.
    """
    rest = tuple(q.shape[1:])
    d = q.shape[0] // heads
    per = heads // groups
    parts = [q.reshape(groups, per * d, *rest), k.reshape(groups, d, *rest),
             v.reshape(groups, d, *rest)]
    return torch.cat(parts, dim=1).reshape(-1, *rest).contiguous()


def unpack_qkv(t: torch.Tensor, heads: int, groups: int):
    rest = tuple(t.shape[1:])
    d = t.shape[0] // (heads + 2 * groups)
    per = heads // groups
    q, k, v = t.reshape(groups, (per + 2) * d, *rest).split([per * d, d, d], dim=1)
    return (q.reshape(-1, *rest).contiguous(), k.reshape(-1, *rest).contiguous(),
            v.reshape(-1, *rest).contiguous())


def common_flags(num_layers, hidden, heads, ffn, max_pos, eps, init_std, tied) -> dict:
    return {"num_layers": num_layers, "hidden_size": hidden, "num_attention_heads": heads,
            "ffn_hidden_size": ffn, "max_position_embeddings": max_pos,
            "layernorm_epsilon": eps, "init_method_std": init_std,
            "untie_embeddings_and_output_weights": not tied}


def rope_parameters(config) -> dict:
    """rope_parameters (transformers >= 5) or the older rope_theta/rope_scaling fields."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    if not params:
        params["rope_theta"] = getattr(config, "rope_theta", 10000.0)
        scaling = getattr(config, "rope_scaling", None)
        params["rope_type"] = (scaling or {}).get("rope_type", (scaling or {}).get("type",
                                                                                  "default"))
        if getattr(config, "partial_rotary_factor", None) is not None:
            params["partial_rotary_factor"] = config.partial_rotary_factor
        if getattr(config, "rotary_pct", None) is not None:
            params["partial_rotary_factor"] = config.rotary_pct
    if params.get("rope_type", "default") != "default":
        refuse(config, "rope_parameters.rope_type", params["rope_type"],
               "only plain rotary embeddings; scaled RoPE variants have no flag here")
    return params
