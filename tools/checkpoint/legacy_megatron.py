"""A merged (1, 1) checkpoint in legacy Megatron-LM's nested layout (Megatron-LM v2.x, which
Optimus-CC is built on), for tools written against it, foremost transformers 4.x's
models/megatron_gpt2/convert_megatron_gpt2_checkpoint.py (removed in transformers 5).

    write_legacy(full, "ckpts/run1_legacy", tokenizer)
    # ckpts/run1_legacy/latest_checkpointed_iteration.txt
    # ckpts/run1_legacy/iter_0000006/mp_rank_00/model_optim_rng.pt   (+ .sha256)
    #                                          /config.json, tokenizer files

model_optim_rng.pt holds
    checkpoint_version  3.0
    iteration           the checkpoint's iteration
    args                the flat argument set (see legacy_args)
    model               {"language_model": {
                           "embedding": {"word_embeddings": {"weight": (V, H)},
                                         "position_embeddings": {"weight": (S, H)}},
                           "encoder": {"layers.N.input_layernorm.weight", ...
                                       "final_layernorm.weight", ...}}}

Per layer: input_layernorm, self_attention.query_key_value, self_attention.dense,
post_attention_layernorm, mlp.dense_h_to_4h, mlp.dense_4h_to_h (weight and bias each), in that
order, layers in order, final_layernorm last (transformers' converter stops reading layers at
the first other key). The tensors are megatron-core's, unchanged: linear_qkv's rows are
already per head [q_h k_h v_h], the order Megatron-LM stores from checkpoint_version 2.0 on,
which the converter regroups into c_attn's [all q | all k | all v].

The vocabulary is cut to the tokenizer's V rows (the padding rows are dropped, as export_hf.py
does), and args.padded_vocab_size is V: the converter sizes the model from it, so its Hugging
Face model is the one export_hf.py writes, tensor for tensor.

`args` must survive torch.load(weights_only=True), which the converter's torch.load does by
default from torch 2.6 on, and which refuses an argparse.Namespace. It is a
collections.OrderedDict carrying every field both as an item and as an attribute: the
weights-only unpickler restores an OrderedDict's attributes (as it does a state_dict's
_metadata), and the converter and Megatron-LM read args by attribute.

config.json (the Hugging Face GPT2Config export_hf.py writes) and the tokenizer files lie next
to the file: args.tokenizer_type is "PretrainedFromHF" with tokenizer_name_or_path naming that
directory, so the converter takes the tokenizer from there instead of downloading
openai-community/gpt2; `--config_file config.json` gives it what args cannot (layer-norm
epsilon: the converter otherwise assumes 1e-5).
"""
import os
import sys
from collections import OrderedDict
from typing import Dict, List, Tuple

import torch

from megatron.training.checkpointing.checkpoint_args import OURS, args_namespace
from megatron.training.checkpointing.save_load import iter_dir
from megatron.training.checkpointing.checkpoint_io import write_file
from tools.checkpoint.errors import ConversionError
from tools.checkpoint.gpt2_mapping import POS_EMB, WORD_EMB, hf_config, unsupported_features
from tools.checkpoint.layout import MODEL_FILE, FullCheckpoint, publish_iteration

CHECKPOINT_VERSION = 3.0     # Megatron-LM v2.x: per-head [q k v] rows, tp and pp in args
SHARD_DIR = "mp_rank_00"     # Megatron-LM's name for the one piece at pp = 1

# (our suffix under decoder.layers.N, legacy suffix under layers.N), in legacy module order
LAYER_NAMES: List[Tuple[str, str]] = [
    (f"{ours}.{p}", f"{legacy}.{p}")
    for ours, legacy in (("input_layernorm", "input_layernorm"),
                         ("self_attention.linear_qkv", "self_attention.query_key_value"),
                         ("self_attention.linear_proj", "self_attention.dense"),
                         ("pre_mlp_layernorm", "post_attention_layernorm"),
                         ("mlp.linear_fc1", "mlp.dense_h_to_4h"),
                         ("mlp.linear_fc2", "mlp.dense_4h_to_h"))
    for p in ("weight", "bias")]
FINAL_NAMES = [("decoder.final_layernorm.weight", "final_layernorm.weight"),
               ("decoder.final_layernorm.bias", "final_layernorm.bias")]


def legacy_args(full: FullCheckpoint, vocab_size: int, tokenizer_dir: str) -> OrderedDict:
    """The flat argument set Megatron-LM saves, as a weights-only-loadable OrderedDict whose
    attributes equal its items."""
    layout = {"tp": 1, "pp": 1, "padded_vocab_size": vocab_size, "vocab_size": vocab_size}
    fields = {k: v for k, v in vars(args_namespace(full.args, layout, full.consumed_samples)
                                     ).items() if k != OURS}
    fields.update(
        tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
        virtual_pipeline_model_parallel_size=None,
        padded_vocab_size=vocab_size,
        bias_gelu_fusion=False,   # ours is unfused: exact GeLU, or tanh with openai_gelu
        # the converter reads a local tokenizer only under this type (GPT2BPETokenizer makes
        # it download openai-community/gpt2)
        tokenizer_type="PretrainedFromHF", tokenizer_name_or_path=tokenizer_dir,
        iteration=full.iteration)
    args = OrderedDict(sorted(fields.items()))
    args.__dict__.update(args)
    return args


def legacy_state(full: FullCheckpoint, vocab_size: int, tokenizer_dir: str) -> dict:
    """The model_optim_rng.pt dict (see the module docstring)."""
    from tools.checkpoint.subspace_hf import unconstrain
    full = unconstrain(full)   # a subspace checkpoint: its equivalent ordinary model
    m = full.model_args
    reasons = unsupported_features(m)
    if reasons:
        raise ConversionError("legacy Megatron-LM's GPT layout holds GPT-2-shaped models "
                              "only; this one has " + "; ".join(reasons))
    emb = full.params[WORD_EMB]
    if emb.shape[0] < vocab_size:
        raise ConversionError(f"the tokenizer has {vocab_size} tokens but the embedding only "
                              f"{emb.shape[0]} rows; wrong tokenizer?")
    encoder: Dict[str, torch.Tensor] = OrderedDict()
    for layer in range(m["num_layers"]):
        for ours, legacy in LAYER_NAMES:
            encoder[f"layers.{layer}.{legacy}"] = full.params[f"decoder.layers.{layer}.{ours}"]
    for ours, legacy in FINAL_NAMES:
        encoder[legacy] = full.params[ours]
    embedding = {"word_embeddings": {"weight": emb[:vocab_size].clone()},
                 "position_embeddings": {"weight": full.params[POS_EMB]}}
    return {"checkpoint_version": CHECKPOINT_VERSION, "iteration": full.iteration,
            "args": legacy_args(full, vocab_size, tokenizer_dir),
            "model": {"language_model": {"embedding": embedding, "encoder": encoder}}}


def write_legacy(full: FullCheckpoint, root: str, tokenizer) -> str:
    """Write <root>/iter_N/mp_rank_00/ (model_optim_rng.pt, config.json, tokenizer files)
    atomically, then <root>/latest_checkpointed_iteration.txt; returns the shard directory."""
    root = os.path.abspath(root)
    shard = os.path.join(iter_dir(root, full.iteration), SHARD_DIR)
    state = legacy_state(full, tokenizer.vocab_size, shard)   # refuses before writing
    config = hf_config(full.model_args, tokenizer.vocab_size, tokenizer.eod, torch.float32)

    def write(tmp):
        d = os.path.join(tmp, SHARD_DIR)
        os.makedirs(d)
        write_file(state, os.path.join(d, MODEL_FILE))
        config.to_json_file(os.path.join(d, "config.json"))
        tokenizer.save_pretrained(d)
    publish_iteration(root, full.iteration, write)
    if full.model_args.get("layernorm_epsilon", 1e-5) != 1e-5:
        print(f"note: layer-norm epsilon {full.model_args['layernorm_epsilon']}: give "
              f"transformers' converter --config_file {os.path.join(shard, 'config.json')} "
              f"(without it, it assumes 1e-5)", file=sys.stderr)
    return shard
