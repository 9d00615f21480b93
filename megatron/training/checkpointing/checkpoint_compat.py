"""Megatron-LM's checkpoint layout, written by us and read from it: shard directory names,
files without our metadata, and the two spellings of megatron-core's layer names.

Shards are mp_rank_{tp:02d} at pp == 1 and mp_rank_{tp:02d}_{pp:03d} otherwise; our older
checkpoints used the second at pp == 1 too (`shard_dir_candidates` lists both). A Megatron-LM
file lacks our 'layout', 'consumed_samples' and optimizer-by-name keys: `normalize_shard`
derives them (its positional optimizer state is not read). The Transformer Engine spec fuses
each pre-norm into the next linear (`...linear_qkv.layer_norm_weight` for
`input_layernorm.weight`) and adds `_extra_state`: `to_model_names` maps a state dict onto a
model's names, `to_local_names` onto the local spec's, which tools/checkpoint works in.
"""
import os
import re
from typing import Dict, List, Optional, Tuple

from megatron.training.checkpointing.checkpoint_args import args_dict, args_from_megatron_lm

_SHARD_DIR = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?$")
# (local spec suffix, Transformer Engine spec suffix) of the fused pre-norms
_SPELLINGS = (("input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight"),
              ("input_layernorm.bias", "self_attention.linear_qkv.layer_norm_bias"),
              ("pre_mlp_layernorm.weight", "mlp.linear_fc1.layer_norm_weight"),
              ("pre_mlp_layernorm.bias", "mlp.linear_fc1.layer_norm_bias"))
# `_extra_state` of the local spec's linears (value None); the Transformer Engine spec has more
_LOCAL_EXTRA = ("self_attention.linear_proj._extra_state", "self_attention.linear_qkv._extra_state",
                "mlp.linear_fc1._extra_state", "mlp.linear_fc2._extra_state",
                "output_layer._extra_state")


def shard_dir_name(tp_rank: int, pp_rank: int, pp: int) -> str:
    """Megatron-LM's name of a shard directory: mp_rank_XX at pp == 1, else mp_rank_XX_YYY."""
    return f"mp_rank_{tp_rank:02d}" if pp == 1 else f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"


def shard_dir_candidates(tp_rank: int, pp_rank: int, pp: int) -> List[str]:
    """Names a shard may have on disk, the one we write first."""
    legacy = f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"
    return [shard_dir_name(tp_rank, pp_rank, pp)] + ([legacy] if pp == 1 else [])


def find_shard_dir(idir: str, tp_rank: int, pp_rank: int, pp: int) -> str:
    """The shard directory that exists in idir (else the name we write, for the message)."""
    names = shard_dir_candidates(tp_rank, pp_rank, pp)
    found = next((n for n in names if os.path.isdir(os.path.join(idir, n))), names[0])
    return os.path.join(idir, found)


def parse_shard_dir(name: str) -> Optional[Tuple[int, int]]:
    """(tp_rank, pp_rank) of a shard directory name, or None for anything else."""
    m = _SHARD_DIR.match(name)
    return None if m is None else (int(m.group(1)), int(m.group(2) or 0))


def _padded_rows(model: dict, tp: int) -> Optional[int]:
    for key in ("embedding.word_embeddings.weight", "output_layer.weight"):
        if key in model:
            return model[key].shape[0] * tp
    return None


def normalize_shard(sd: dict, dir_name: str) -> dict:
    """A loaded model_optim_rng.pt in our in-memory form: args as our dict and, for a file
    Megatron-LM wrote, the layout and progress keys ours carry. Returns a new dict."""
    sd = dict(sd)
    chunks = [k for k in sd if re.fullmatch(r"model\d+", k)]   # interleaved: model0, model1..
    if "layout" in sd:
        sd["args"] = args_dict(sd.get("args"))
        return sd
    ranks = parse_shard_dir(dir_name)
    ns = sd.get("args")
    if ranks is None or ns is None or isinstance(ns, dict) or not ("model" in sd or chunks):
        return sd   # not ours, not Megatron-LM's: the caller names what is missing
    args = args_from_megatron_lm(ns)
    tp = args["parallel"]["tensor_model_parallel_size"]
    sd["args"] = args
    models = [sd["model"]] if "model" in sd else [sd[f"model{c}"] for c in range(len(chunks))]
    rows = next((r for r in (_padded_rows(m, tp) for m in models) if r is not None), None)
    sd["layout"] = {"tp": tp, "pp": args["parallel"]["pipeline_model_parallel_size"],
                    "tp_rank": ranks[0], "pp_rank": ranks[1],
                    "padded_vocab_size": getattr(ns, "padded_vocab_size", None) or rows}
    if len(chunks) > 1:
        sd["layout"]["vp"] = len(chunks)
    sd["consumed_samples"] = getattr(ns, "consumed_train_samples", 0) or 0
    sd.update(optimizer=None, optimizer_by_name=None)   # its positional state: not read
    sd.setdefault("opt_param_scheduler", None)
    return sd


def _other_spelling(key: str) -> Optional[str]:
    for local, te in _SPELLINGS:
        if key.endswith(local):
            return key[: -len(local)] + te
        if key.endswith(te):
            return key[: -len(te)] + local
    return None


def to_model_names(saved: Dict[str, object], expected: Dict[str, object]) -> Dict[str, object]:
    """`saved` renamed to the spec of `expected` (a model's state_dict). `_extra_state`
    entries the model does not have are dropped, those it has and `saved` lacks take the
    model's own value; any other mismatch is left for check_state_matches to name."""
    out = {}
    for k, v in saved.items():
        if k in expected:
            out[k] = v
        elif _other_spelling(k) in expected:
            out[_other_spelling(k)] = v
        elif not k.endswith("_extra_state"):
            out[k] = v
    for k, v in expected.items():
        if k.endswith("_extra_state") and k not in out:
            out[k] = v
    return out


def to_local_names(saved: Dict[str, object]) -> Dict[str, object]:
    """`saved` in the local spec's names: fused pre-norms renamed, Transformer Engine's extra
    state (fp8 metadata, rebuilt by Transformer Engine at its first step) dropped, and the
    linears' `_extra_state` set to what the local spec holds there (None)."""
    te_suffixes = tuple(te for _, te in _SPELLINGS)
    out = {}
    for k, v in saved.items():
        if k.endswith("_extra_state"):
            if k.endswith(_LOCAL_EXTRA):
                out[k] = None
        elif k.endswith(te_suffixes):
            out[_other_spelling(k)] = v
        else:
            out[k] = v
    return out
