"""Hugging Face model families <-> our GPTModel, chosen from config.json's model_type.

    family = for_config(config)              # import: by model_type, else a ConversionError
    family = for_model_args(args["model"])   # export: the family our flags describe
    params = family.from_hf(hf_state_dict, config, padded_rows)
    hf_sd = family.to_hf(params, args["model"], vocab_size)

Every mapping only renames, transposes, concatenates and slices tensors, so import followed by
export gives back every tensor bit for bit (OPT's two unused position rows excepted, see opt.py).
"""
from typing import Dict, List, Optional

from tools.checkpoint.errors import ConversionError
from tools.checkpoint.hf_families.base import Family
from tools.checkpoint.hf_families.gpt2 import GPT2
from tools.checkpoint.hf_families.gpt_neox import GPTNeoX
from tools.checkpoint.hf_families.gptj import GPTJ
from tools.checkpoint.hf_families.llama import Llama, Qwen2
from tools.checkpoint.hf_families.opt import OPT

FAMILIES: Dict[str, Family] = {f.model_type: f for f in
                               (GPT2(), Llama(), Qwen2(), OPT(), GPTNeoX(), GPTJ())}

# Attention variants a config can switch on and that our model cannot run (field: value off).
_REFUSED_FEATURES = {"alibi": False, "use_alibi": False, "position_embedding_type": None,
                     "sliding_window": None, "use_sliding_window": False}


def _check_refused_features(config) -> None:
    """ALiBi, sliding windows and the like, whatever the family: named, before anything else."""
    for field, off in _REFUSED_FEATURES.items():
        value = getattr(config, field, off)
        if field == "position_embedding_type" and value in (None, "absolute", "rotary"):
            continue
        if field == "sliding_window" and not getattr(config, "use_sliding_window", True):
            continue  # Qwen2 keeps a window size that only use_sliding_window turns on
        if value not in (off, False, None):
            raise ConversionError(f"{config.model_type} config.json: {field}={value!r} is not "
                                  f"supported (our attention is full causal softmax attention "
                                  f"with learned or rotary positions)")


def for_config(config) -> Family:
    _check_refused_features(config)  # first: "ALiBi" says more than "model_type falcon"
    model_type = getattr(config, "model_type", None)
    family = FAMILIES.get(model_type)
    if family is None:
        raise ConversionError(f"config.json model_type '{model_type}' is not supported; "
                              f"importable: {', '.join(sorted(FAMILIES))}")
    return family


def for_model_args(model_args: dict, model_type: Optional[str] = None) -> Family:
    """The family that can hold this model (or `model_type`'s, checked)."""
    if model_type is not None:
        if model_type not in FAMILIES:
            raise ConversionError(f"--hf-model-type {model_type} is not one of "
                                  f"{', '.join(sorted(FAMILIES))}")
        candidates = [FAMILIES[model_type]]
    else:
        candidates = list(FAMILIES.values())
    reasons: List[str] = []
    for family in candidates:
        why = family.unsupported(model_args)
        if not why:
            return family
        reasons.append(f"{family.hf_class}: {'; '.join(why)}")
    raise ConversionError("this model cannot be written as a Hugging Face model: "
                          + " | ".join(reasons))
