"""Whole-model view of a tp x pp checkpoint: merge its shards, split them again (pure functions).

    ckpt = read_checkpoint("ckpts/run1")           # every model_optim_rng.pt of the latest iteration
    full = merge(ckpt)                             # FullCheckpoint: {global name: unsplit tensor}
    shards = split(full, tp=1, pp=4)               # {(tp_rank, pp_rank): model_optim_rng dict}
    write_checkpoint("ckpts/run1_pp4", shards)     # temp dir + os.replace + latest file

Shard directories are read under Megatron-LM's names (mp_rank_XX at pp 1) and our older
ones (mp_rank_XX_000), and written under Megatron-LM's; files Megatron-LM wrote are read too
(megatron/training/checkpointing/checkpoint_compat.py).

`split(merge(c), tp, pp)` at c's own layout gives back c's tensors exactly, and a chain of
re-splits is exact: tensors are only concatenated and sliced, never recomputed.

Global names are megatron/training/model/model.py's: layer indices count over the whole network and
a tied output weight is named after the embedding it duplicates. Sharding is megatron-core's
(contiguous along the partition dim):
    dim 0   linear_qkv.{weight,bias}, linear_fc1.{weight,bias}, word_embeddings, output_layer
    dim 1   linear_proj.weight, linear_fc2.weight
    -       everything else (layer norms, row-parallel biases, position embeddings), replicated
Stage p of pp holds layers [p*L/pp, (p+1)*L/pp); stage 0 the embeddings; the last stage the
final layer norm and the output layer (with tied embeddings and pp > 1, a copy of the word
embedding; with pp == 1 the embedding serves as the output layer and no copy exists).

The optimizer's Adam moments (`optimizer_by_name`) are merged and split like their
parameters. Per-process files (rank_state/: RNG and compressor state) describe one world size
and are not carried over: a resharded checkpoint starts them fresh (training prints a note).

The vocabulary is padded to a multiple of make_vocab_size_divisible_by x tp. When a new tp
changes that size, rows past the old padded size are added as zeros (their Adam moments too)
or padding rows are cut; real-token rows never change. Padding rows take part in the softmax,
so a change of padded size changes the loss slightly (as in Megatron-LM's own converter).
"""
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch

from megatron.cc.plan.shapes import padded_vocab_size
from megatron.training.checkpointing.checkpoint_args import file_state
from megatron.training.checkpointing.checkpoint_compat import (
    normalize_shard, parse_shard_dir, shard_dir_name, to_local_names)
from megatron.training.checkpointing.checkpoint_io import (
    CheckpointLoadError, safe_load, verify_file, write_file)
from megatron.training.checkpointing.save_load import (
    CHECKPOINT_VERSION, LATEST, atomic_write_text, iter_dir, read_latest)
from megatron.training.model.model import is_glu_fc1
from tools.checkpoint.errors import CheckpointError  # noqa: F401  (re-exported)

MODEL_FILE = "model_optim_rng.pt"
WORD_EMB = "embedding.word_embeddings.weight"
OUTPUT = "output_layer.weight"
OUTPUT_BIAS = "output_layer.bias"
# Modules whose state_dict carries an `_extra_state` entry (megatron-core's linear layers).
_EXTRA_STATE_LINEARS = ("self_attention.linear_proj", "self_attention.linear_qkv",
                        "mlp.linear_fc1", "mlp.linear_fc2")
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.*)$")
# Subspace Networks (megatron/training/model/subspace.py): U on every stage, and with coefficients on
# the wire a copy of the embedding on every stage past the first
SUBSPACE_BASIS = "subspace_basis"
SUBSPACE_SCALE = "subspace_write_scale"   # a of W_eff = a U U^T W (absent in older ones: 1)
X0_COPY = "x0_embedding."


# --------------------------------------------------------------------------- naming rules

def partition_dim(gname: str) -> int:
    """Dimension megatron-core splits this parameter along over TP ranks, or -1 (replicated)."""
    if gname.endswith(("linear_qkv.weight", "linear_qkv.bias", "linear_fc1.weight",
                       "linear_fc1.bias")) or gname in (WORD_EMB, OUTPUT, OUTPUT_BIAS):
        return 0
    if gname.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return 1
    return -1


def is_vocab_parallel(gname: str) -> bool:
    return gname in (WORD_EMB, OUTPUT, OUTPUT_BIAS)


def _glu(args_or_model: dict) -> bool:
    """SwiGLU fc1 tensors are split per half ([gate_r; up_r] on rank r), see model.shard."""
    model = args_or_model.get("model", args_or_model)
    return bool(model.get("swiglu", False))


def layers_per_stage(num_layers: int, pp: int) -> int:
    if num_layers % pp:
        raise CheckpointError(f"pipeline size {pp} does not divide --num-layers ({num_layers})")
    return num_layers // pp


def to_global(local: str, pp_rank: int, pp: int, num_layers: int, tied: bool,
              chunk: int = 0, vp: int = 1) -> str:
    """Name in the unsplit model of a local state_dict key of stage pp_rank (interleaved:
    of its model chunk `chunk` of `vp`, which holds virtual stage chunk pp + pp_rank)."""
    m = _LAYER.match(local)
    if m:
        per = layers_per_stage(num_layers, pp * vp)
        return f"decoder.layers.{int(m.group(1)) + (chunk * pp + pp_rank) * per}.{m.group(2)}"
    if local == OUTPUT and tied:
        return WORD_EMB
    if local.startswith(X0_COPY):   # subspace: a stage's copy of the embedding is the embedding
        return "embedding." + local[len(X0_COPY):]
    return local


def model_keys(sd: dict) -> List[str]:
    """The shard's model entries: 'model', or 'model0', 'model1', ... when interleaved."""
    vp = sd.get("layout", {}).get("vp", 1) if isinstance(sd, dict) else 1
    return ["model"] if vp == 1 else [f"model{c}" for c in range(vp)]


def stage_keys(gnames: List[str], pp_rank: int, pp: int, num_layers: int, tied: bool,
               x0_copies: bool = False) -> List[Tuple[str, str]]:
    """(local key, global name) of every tensor stage pp_rank holds, in GPTModel's order.
    `x0_copies`: subspace coefficients on the wire, every later stage holds the embedding too."""
    per = layers_per_stage(num_layers, pp)
    first, last = pp_rank == 0, pp_rank == pp - 1
    out = []
    for g in gnames:
        m = _LAYER.match(g)
        if m:
            layer = int(m.group(1))
            if layer // per == pp_rank:
                out.append((f"decoder.layers.{layer - pp_rank * per}.{m.group(2)}", g))
        elif g.startswith("embedding."):
            if first:
                out.append((g, g))
            elif x0_copies:
                out.append((X0_COPY + g[len("embedding."):], g))
            if g == WORD_EMB and tied and last and pp > 1:
                out.append((OUTPUT, g))
        elif g.startswith(("decoder.final_layernorm", "output_layer")):
            if last:
                out.append((g, g))
        elif g in (SUBSPACE_BASIS, SUBSPACE_SCALE):
            out.append((g, g))
        else:
            raise CheckpointError(f"do not know which pipeline stage holds '{g}'")
    return out


def x0_copies(args: dict) -> bool:
    """Does the run these args describe keep x0 embedding copies (subspace coefficients)?"""
    return (args.get("compression") or {}).get("forward_compress_method") == "subspace"


def extra_state_keys(num_layers: int, pp_rank: int, pp: int) -> List[str]:
    """The `_extra_state` keys megatron-core's linear layers add to stage pp_rank's state_dict."""
    per = layers_per_stage(num_layers, pp)
    keys = [f"decoder.layers.{i}.{mod}._extra_state" for i in range(per)
            for mod in _EXTRA_STATE_LINEARS]
    if pp_rank == pp - 1:
        keys.append("output_layer._extra_state")
    return keys


# --------------------------------------------------------------------------- whole model

@dataclass
class FullCheckpoint:
    """One checkpoint with every tensor unsplit, keyed by its name in the whole model."""
    params: Dict[str, torch.Tensor]
    """Global name -> tensor; the vocabulary stays padded to `padded_vocab_size` rows."""
    args: dict
    """The training Args as a dict (args['model'] holds the architecture)."""
    padded_vocab_size: int
    vocab_size: Optional[int] = None
    """The tokenizer's vocabulary size when known (needed to re-pad for a new tp)."""
    optimizer: Optional[Dict[str, dict]] = None
    """Global name -> Adam state with unsplit moments; None when not reshardable."""
    optimizer_kinds: Optional[list] = None
    """The optimizers that state belongs to ('adam', 'muon', 'sgd'), as saved; None before
    the record existed. Resuming under another --optimizer is refused by it."""
    grad_scaler: Optional[dict] = None
    """fp16's loss-scale state (the same on every rank)."""
    iteration: int = 0
    consumed_samples: int = 0
    scheduler: Optional[dict] = None
    extra_state: Dict[str, object] = field(default_factory=dict)
    """Local `_extra_state` values of megatron-core's modules (None for the local spec)."""
    eod: Optional[int] = None
    """End-of-document token id when no tokenizer is recorded (import_hf: config.json's
    eos_token_id); an export without a tokenizer writes it as bos/eos."""

    @property
    def model_args(self) -> dict:
        return self.args["model"]

    @property
    def tied(self) -> bool:
        return not self.model_args.get("untie_embeddings_and_output_weights", False)


@dataclass
class ShardedCheckpoint:
    """Every shard file of one iteration, as loaded."""
    root: str
    iteration: int
    tp: int
    pp: int
    shards: Dict[Tuple[int, int], dict]


def _progress(iterable, desc: str, show: bool, unit: str = "shard"):
    """A progress bar on stderr (the tools' --no-progress turns it off)."""
    if not show:
        return iterable
    from tqdm import tqdm
    return tqdm(iterable, desc=desc, file=sys.stderr, unit=unit, leave=False)


def load_shard_file(path: str, trust: bool = False) -> dict:
    """Load a model_optim_rng.pt (checksum verified, weights_only unless `trust`), turning
    every failure into a CheckpointError naming it. Ours (either layout) or Megatron-LM's,
    returned in one form: args as our dict, tensors under the local spec's names."""
    if not os.path.isfile(path):
        raise CheckpointError(f"missing shard {path}")
    problem = verify_file(path)
    if problem:
        raise CheckpointError(f"{problem}; re-save it from training or use another iteration "
                              f"(--iteration)")
    try:
        sd = safe_load(path, trust)
    except CheckpointLoadError as e:
        raise CheckpointError(str(e)) from None
    except Exception as e:  # zip, pickle, EOF, unicode: all mean "unreadable"
        raise CheckpointError(f"{path} is corrupt or truncated and cannot be loaded "
                              f"({type(e).__name__}: {e}); re-save it from training or use "
                              f"another iteration (--iteration)") from None
    if isinstance(sd, dict):
        try:
            sd = normalize_shard(sd, os.path.basename(os.path.dirname(path)))
        except (ValueError, TypeError) as e:
            raise CheckpointError(f"{path}: {e}") from None
    keys = model_keys(sd)
    missing = [k for k in keys + ["layout", "args", "iteration"] if not isinstance(sd, dict)
               or k not in sd]
    if missing:
        raise CheckpointError(f"{path} is not a megatron-cc or Megatron-LM model_optim_rng.pt "
                              f"(no {', '.join(missing)})")
    for k in keys:
        sd[k] = to_local_names(sd[k])
    return sd


def read_checkpoint(root: str, iteration: Optional[int] = None, progress: bool = False,
                    trust: bool = False) -> ShardedCheckpoint:
    """Load every shard of `iteration` (default: the latest) and check they form one layout.

    `trust`: unpickle without weights_only (--trust-checkpoint; only for your own files)."""
    if not os.path.isdir(root):
        raise CheckpointError(f"--load {root} is not a directory")
    if iteration is None:
        try:
            iteration = read_latest(root)
        except (FileNotFoundError, ValueError) as e:
            raise CheckpointError(str(e)) from None
    idir = iter_dir(root, iteration)
    if not os.path.isdir(idir):
        raise CheckpointError(f"--load {root}: no {os.path.basename(idir)} directory")
    found = sorted(d for d in os.listdir(idir) if d.startswith("mp_rank_"))
    if not found:
        raise CheckpointError(f"{idir} holds no mp_rank_* shard directories")
    first = load_shard_file(os.path.join(idir, found[0], MODEL_FILE), trust)
    tp, pp = first["layout"]["tp"], first["layout"]["pp"]
    # Megatron-LM's names (mp_rank_XX at pp 1) or our older ones (mp_rank_XX_000): by rank
    ranks = {}
    for d in found:
        ranks.setdefault(parse_shard_dir(d), []).append(d)
    expected = [(t, p) for p in range(pp) for t in range(tp)]   # stage by stage
    missing = [os.path.join(idir, shard_dir_name(t, p, pp), MODEL_FILE)
               for t, p in expected if (t, p) not in ranks]
    if missing:
        raise CheckpointError(f"missing shard(s) of the tp={tp} pp={pp} checkpoint: "
                              f"{', '.join(missing)}")
    strays = sorted(d for r, names in ranks.items() for d in names[r in expected:])
    if strays:
        raise CheckpointError(f"mismatched layouts in {idir}: {found[0]} says tp={tp} pp={pp}, "
                              f"but {', '.join(strays)} lie outside it")
    shards = {}
    for rank in _progress(expected, "reading shards", progress):
        name = ranks[rank][0]
        sd = first if name == found[0] else load_shard_file(os.path.join(idir, name, MODEL_FILE),
                                                           trust)
        lay = sd["layout"]
        if (lay["tp"], lay["pp"]) != (tp, pp) or (lay["tp_rank"], lay["pp_rank"]) != rank:
            raise CheckpointError(
                f"mismatched layouts in {idir}: {found[0]} says tp={tp} pp={pp}, but {name} "
                f"says tp={lay['tp']} pp={lay['pp']} tp_rank={lay['tp_rank']} "
                f"pp_rank={lay['pp_rank']}; the directory mixes two checkpoints")
        if sd["iteration"] != iteration:
            raise CheckpointError(f"{name} in {idir} is from iteration {sd['iteration']}")
        shards[rank] = sd
    return ShardedCheckpoint(root, iteration, tp, pp, shards)


def _warn(msg: str) -> None:
    print(f"warning: {msg}", file=sys.stderr, flush=True)


def _cat(pieces: List[torch.Tensor], gname: str, glu: bool = False) -> torch.Tensor:
    dim = partition_dim(gname)
    if is_glu_fc1(gname, glu):  # [gate_r; up_r] per rank -> [gate; up]
        halves = [p.chunk(2, dim=0) for p in pieces]
        return torch.cat([torch.cat([h[i] for h in halves]) for i in (0, 1)])
    if dim < 0:
        for i, p in enumerate(pieces[1:], 1):
            if not torch.equal(p, pieces[0]):
                _warn(f"replicated tensor {gname} differs between tp ranks 0 and {i} "
                      f"(max |diff| {(p.float() - pieces[0].float()).abs().max():.3g}); "
                      f"keeping tp rank 0's")
        return pieces[0]
    return torch.cat(pieces, dim=dim)


def _merge_state(states: List[dict], gname: str, glu: bool = False) -> dict:
    """Merge one parameter's Adam state over TP ranks: moments like the param, scalars as is."""
    out = {}
    for k, v in states[0].items():
        if torch.is_tensor(v) and v.dim() > 0:
            out[k] = _cat([s[k] for s in states], gname, glu)
        else:
            out[k] = v
    return out


def _merge_stage(tp_sds, optims, p, chunk, vp, pp, num_layers, tied, glu, params, extra,
                 optim) -> None:
    """One stage's (interleaved: one model chunk's) tensors over its tp ranks, into params."""
    for local in tp_sds[0]:
        g = to_global(local, p, pp, num_layers, tied, chunk, vp)
        if local.endswith("_extra_state"):
            extra.setdefault(g, tp_sds[0][local])
            continue
        try:
            pieces = [sd[local] for sd in tp_sds]
        except KeyError:
            raise CheckpointError(f"stage {p}: {local} is in tp rank 0's shard but not in "
                                  f"every other tp rank's; mismatched shards") from None
        value = _cat(pieces, g, glu)
        if g in params:  # the tied output weight, subspace x0 copies and U: as on stage 0
            if not torch.equal(params[g], value):
                _warn(f"stage {p}'s {local} differs from {g} on stage 0 "
                      f"(max |diff| {(params[g].float() - value.float()).abs().max():.3g});"
                      f" keeping stage 0's")
            continue
        params[g] = value
        if optim is not None:
            states = [o.get(g) for o in optims]
            if all(s is not None for s in states):
                optim[g] = _merge_state(states, g, glu)


def merge(ckpt: ShardedCheckpoint, progress: bool = False) -> FullCheckpoint:
    """All shards -> one FullCheckpoint (unsplit tensors by global name)."""
    first = ckpt.shards[(0, 0)]
    margs = first["args"]["model"]
    tied = not margs.get("untie_embeddings_and_output_weights", False)
    num_layers = margs["num_layers"]
    glu = _glu(margs)
    params: Dict[str, torch.Tensor] = {}
    extra: Dict[str, object] = {}
    has_optim = all(sd.get("optimizer_by_name") is not None for sd in ckpt.shards.values())
    optim: Optional[Dict[str, dict]] = {} if has_optim else None
    vp = first["layout"].get("vp", 1)   # interleaved: model0, model1, ... per shard
    for p in _progress(range(ckpt.pp), "merging stages", progress, "stage"):
        for c, key in enumerate(model_keys(first)):
            tp_sds = [ckpt.shards[(t, p)][key] for t in range(ckpt.tp)]
            optims = [ckpt.shards[(t, p)].get("optimizer_by_name") for t in range(ckpt.tp)]
            _merge_stage(tp_sds, optims, p, c, vp, ckpt.pp, num_layers, tied, glu, params,
                         extra, optim)
    return FullCheckpoint(
        params=params, args=first["args"], padded_vocab_size=first["layout"]["padded_vocab_size"],
        vocab_size=first["layout"].get("vocab_size"), optimizer=optim,
        iteration=first["iteration"], consumed_samples=first.get("consumed_samples", 0),
        scheduler=first.get("opt_param_scheduler"), extra_state=extra,
        eod=first["layout"].get("eod"), optimizer_kinds=first.get("kinds"),
        grad_scaler=first.get("grad_scaler"))


# --------------------------------------------------------------------------- splitting

def target_padded_vocab(full: FullCheckpoint, tp: int, vocab_size: Optional[int] = None) -> int:
    """Padded vocabulary rows at tensor-parallel size tp (Megatron's rule)."""
    m = full.model_args.get("make_vocab_size_divisible_by", 128)
    src_tp = full.args["parallel"]["tensor_model_parallel_size"]
    vocab_size = vocab_size or full.vocab_size
    if vocab_size is not None:
        if vocab_size > full.padded_vocab_size:
            raise CheckpointError(f"vocabulary size {vocab_size} exceeds the checkpoint's "
                                  f"{full.padded_vocab_size} embedding rows")
        return padded_vocab_size(vocab_size, m, tp)
    # Unknown true size: any size in (padded - m*src_tp, padded] is consistent with the file.
    lo = max(1, full.padded_vocab_size - m * src_tp + 1)
    a, b = padded_vocab_size(lo, m, tp), padded_vocab_size(full.padded_vocab_size, m, tp)
    if a != b:
        raise CheckpointError(
            f"cannot tell the tokenizer's vocabulary size (the checkpoint has "
            f"{full.padded_vocab_size} padded rows at tp={src_tp}, and at tp={tp} the padding "
            f"depends on the exact size); pass --true-vocab-size or the tokenizer flags")
    return a


def _resize_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[0] == rows:
        return t
    if t.shape[0] > rows:
        return t[:rows].clone()
    pad = torch.zeros((rows - t.shape[0],) + tuple(t.shape[1:]), dtype=t.dtype)
    return torch.cat([t, pad])


def _slice(t: torch.Tensor, gname: str, tp: int, tp_rank: int, glu: bool = False
           ) -> torch.Tensor:
    dim = partition_dim(gname)
    if dim < 0:
        return t.clone()
    if is_glu_fc1(gname, glu):  # [gate; up] -> [gate_r; up_r]
        if t.shape[0] % (2 * tp):
            raise CheckpointError(f"{gname} has {t.shape[0]} rows, not two halves divisible "
                                  f"by tensor-parallel size {tp}")
        return torch.cat([h.chunk(tp, dim=0)[tp_rank] for h in t.chunk(2, dim=0)]).clone()
    if t.shape[dim] % tp:
        raise CheckpointError(f"{gname} has {t.shape[dim]} entries along dim {dim}, not "
                              f"divisible by tensor-parallel size {tp}")
    return t.chunk(tp, dim=dim)[tp_rank].clone()  # clone: each shard file owns its storage


def check_target(full: FullCheckpoint, tp: int, pp: int) -> None:
    m = full.model_args
    if tp < 1 or pp < 1:
        raise CheckpointError("target tensor and pipeline parallel sizes must be >= 1")
    if m["num_layers"] % pp:
        raise CheckpointError(f"target pipeline size {pp} does not divide --num-layers "
                              f"({m['num_layers']})")
    for field_name in ("num_attention_heads", "hidden_size", "ffn_hidden_size"):
        if m[field_name] % tp:
            raise CheckpointError(f"target tensor-parallel size {tp} does not divide "
                                  f"--{field_name.replace('_', '-')} ({m[field_name]})")
    groups = m.get("num_query_groups") if m.get("group_query_attention") else None
    if groups is not None and groups % tp:
        raise CheckpointError(f"target tensor-parallel size {tp} does not divide "
                              f"--num-query-groups ({groups})")


def retarget_args(args: dict, tp: int, pp: int) -> dict:
    """The args dict with the new parallel sizes (the data-parallel size is kept)."""
    import copy
    out = copy.deepcopy(args)
    par = out["parallel"]
    old = par["tensor_model_parallel_size"] * par["pipeline_model_parallel_size"]
    dp = max(1, out.get("world_size", old) // old)
    par["tensor_model_parallel_size"], par["pipeline_model_parallel_size"] = tp, pp
    # the shards written hold one model chunk per stage (interleaved ones are merged)
    par["virtual_pipeline_model_parallel_size"] = None
    par["num_layers_per_virtual_pipeline_stage"] = None
    out["world_size"] = tp * pp * dp
    return out


def split(full: FullCheckpoint, tp: int, pp: int, vocab_size: Optional[int] = None,
          with_optimizer: bool = True, progress: bool = False) -> Dict[Tuple[int, int], dict]:
    """FullCheckpoint -> {(tp_rank, pp_rank): model_optim_rng dict} for a (tp, pp) run."""
    check_target(full, tp, pp)
    rows = target_padded_vocab(full, tp, vocab_size)
    num_layers = full.model_args["num_layers"]
    glu = _glu(full.model_args)
    args = retarget_args(full.args, tp, pp)
    gnames = list(full.params)
    optim = full.optimizer if with_optimizer else None
    out = {}
    for p in _progress(range(pp), "splitting stages", progress, "stage"):
        keys = stage_keys(gnames, p, pp, num_layers, full.tied, x0_copies(full.args))
        for t in range(tp):
            model, opt = {}, ({} if optim is not None else None)
            for local, g in keys:
                value = full.params[g]
                if is_vocab_parallel(g):
                    value = _resize_rows(value, rows)
                model[local] = _slice(value, g, tp, t, glu)
                if opt is not None and g in optim and g not in opt:
                    opt[g] = {k: (_slice(_resize_rows(v, rows) if is_vocab_parallel(g) else v,
                                         g, tp, t, glu) if torch.is_tensor(v) and v.dim() > 0
                                  else v)
                              for k, v in optim[g].items()}
            for key in extra_state_keys(num_layers, p, pp):
                gkey = to_global(key, p, pp, num_layers, full.tied)
                model[key] = full.extra_state.get(gkey)
            layout = {"tp": tp, "pp": pp, "tp_rank": t, "pp_rank": p, "padded_vocab_size": rows}
            if vocab_size or full.vocab_size:
                layout["vocab_size"] = vocab_size or full.vocab_size
            if full.eod is not None:
                layout["eod"] = full.eod
            out[(t, p)] = {
                "checkpoint_version": CHECKPOINT_VERSION,
                "iteration": full.iteration,
                "consumed_samples": full.consumed_samples,
                "args": args,
                "layout": layout,
                "model": model,
                # {} (not None) when dropped: training then starts Adam's moments fresh.
                "optimizer_by_name": opt if opt is not None else {},
                "optimizer": None,
                "opt_param_scheduler": full.scheduler,
            }
            if optim is not None:   # a fresh optimizer, of any kind, may start from {}
                out[(t, p)].update(kinds=full.optimizer_kinds, grad_scaler=full.grad_scaler)
    return out


def write_checkpoint(root: str, shards: Dict[Tuple[int, int], dict], progress: bool = False
                     ) -> str:
    """Write shards as <root>/iter_N/ atomically (temp dir, os.replace, then the latest file).

    A failure (or Ctrl-C) part-way removes the temp dir; `latest` still names the previous
    checkpoint, if any.
    """
    iteration = next(iter(shards.values()))["iteration"]

    def write(tmp):
        for (t, p), sd in _progress(sorted(shards.items()), "writing shards", progress):
            d = os.path.join(tmp, shard_dir_name(t, p, sd["layout"]["pp"]))
            os.makedirs(d, exist_ok=True)
            write_file(file_state(sd), os.path.join(d, MODEL_FILE))   # with its .sha256
    return publish_iteration(root, iteration, write)


def publish_iteration(root: str, iteration: int, write) -> str:
    """`write(tmp)` fills <root>/iter_N.tmp/, which then replaces <root>/iter_N/, and only then
    is the latest file rewritten; a failure part-way removes the temp dir. Returns iter_N/."""
    final = iter_dir(root, iteration)
    tmp = final + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if os.path.exists(final):
        shutil.rmtree(final)
    os.replace(tmp, final)
    atomic_write_text(os.path.join(root, LATEST), str(iteration))
    return final
