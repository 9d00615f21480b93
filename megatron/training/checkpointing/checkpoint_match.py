"""Refuse a checkpoint whose tensors do not fit the model the flags build, naming the tensor.

A Llama checkpoint loaded with GPT-NeoX flags (or any other mix of families) would otherwise
fail in torch's load_state_dict with a page of key lists, or, where shapes happen to agree,
not at all. `check_state_matches` raises one ValueError naming the first tensor that is
missing, unexpected or of another shape, followed by the model flags that differ from the
ones the checkpoint was saved with.
"""
import dataclasses
from typing import Dict

import torch


def _flag_differences(saved_model_args: dict, model_args) -> str:
    current = dataclasses.asdict(model_args)
    diffs = [f"--{k.replace('_', '-')} {saved_model_args[k]!r} (saved) vs {v!r} (given)"
             for k, v in current.items()
             if k in saved_model_args and saved_model_args[k] != v and k not in ("bf16", "fp16")]
    return ("; model flags that differ: " + ", ".join(diffs)) if diffs else ""


def check_state_matches(saved: Dict[str, torch.Tensor], expected: Dict[str, torch.Tensor],
                        saved_args: dict, model_args) -> None:
    """ValueError naming the first tensor of `saved` that does not fit `expected`."""
    problem = None
    for name, tensor in expected.items():
        if name.endswith("_extra_state"):
            continue
        if name not in saved:
            problem = (f"the checkpoint has no tensor '{name}', which the model built from "
                       f"these flags has")
        elif tuple(saved[name].shape) != tuple(tensor.shape):
            problem = (f"checkpoint tensor '{name}' has shape {tuple(saved[name].shape)}, the "
                       f"model built from these flags {tuple(tensor.shape)}")
        if problem:
            break
    if problem is None:
        extra = [n for n in saved if n not in expected and not n.endswith("_extra_state")]
        if extra:
            problem = (f"checkpoint tensor '{extra[0]}' has no place in the model built from "
                       f"these flags")
    if problem:
        diff = _flag_differences((saved_args or {}).get("model", {}), model_args)
        raise ValueError(f"{problem}; the checkpoint was saved with other model "
                         f"flags (another family?){diff}. Give the flags import_hf.py printed")
