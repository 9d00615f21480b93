"""Import a Hugging Face causal LM into our checkpoint layout at any tensor x pipeline split.

    python tools/checkpoint/import_hf.py --hf-model hf/llama --save ckpts/llama_tp2pp2 \\
        --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2
    # prints the exact pretrain_gpt.py model flags, e.g. for a Llama:
    #   --load ckpts/llama_tp2pp2 --finetune --num-layers 2 ... --position-embedding-type rope
    #   --normalization RMSNorm --swiglu --disable-bias-linear --group-query-attention ...

Families, detected from config.json's model_type (tools/checkpoint/hf_families/): gpt2
(GPT2LMHeadModel), llama (LlamaForCausalLM), qwen2 (Qwen2ForCausalLM), opt (OPTForCausalLM),
gpt_neox (GPTNeoXForCausalLM), gptj (GPTJForCausalLM). A config field our model cannot express
(sliding-window attention, ALiBi, scaled RoPE, post-LayerNorm OPT, ...) is refused by name
before any weight is read.

Writes an iteration-0 checkpoint with model weights only (no optimizer or scheduler state):
load it with --finetune. The args stored in it carry the architecture and, if the directory
holds tokenizer files, the tokenizer as --tokenizer-type HuggingFaceTokenizer --tokenizer-model
<dir>. The vocabulary is padded with zero rows to Megatron's multiple
(--make-vocab-size-divisible-by x tp); the training loss masks the padding logits, so it
equals Hugging Face's on the same batch.

From Python (the fine-tuning code):

    from tools.checkpoint.import_hf import import_hf
    shards = import_hf("hf/llama", tp=2, pp=2)   # list, index pp_rank * tp + tp_rank
    model.load_state_dict(shards[i]["model"])    # each a model_optim_rng.pt dict
"""
import argparse
import os
import sys
import time
from typing import List, Optional

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
        __file__)))))

import torch  # noqa: E402

from tools.checkpoint.common import add_tokenizer_flags, fail  # noqa: E402
from tools.checkpoint.errors import ConversionError  # noqa: E402
from tools.checkpoint.hf_families import for_config  # noqa: E402
from tools.checkpoint.layout import (  # noqa: E402
    CheckpointError, FullCheckpoint, padded_vocab_size, split, write_checkpoint)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hf-model", required=True, help="Local Hugging Face model directory "
                   "(config.json + safetensors or pytorch_model.bin) of a supported family.")
    p.add_argument("--save", required=True, help="Checkpoint directory to write.")
    p.add_argument("--tensor-model-parallel-size", dest="tp", type=int, default=1,
                   help="Tensor-parallel size of the new checkpoint (default 1).")
    p.add_argument("--pipeline-model-parallel-size", dest="pp", type=int, default=1,
                   help="Pipeline-parallel size of the new checkpoint (default 1).")
    p.add_argument("--make-vocab-size-divisible-by", type=int, default=128,
                   help="Pad the vocabulary to a multiple of this times tp, as the training "
                        "flag of the same name (default 128).")
    p.add_argument("--seq-length", type=int, default=None,
                   help="--seq-length recorded in the args (default: the model's "
                        "max_position_embeddings / n_positions).")
    add_tokenizer_flags(p, purpose="recorded in the args; default: the --hf-model directory's")
    p.add_argument("--no-progress", action="store_true", help="Hide the progress bars.")
    return p


def _load_hf(hf_dir_or_model):
    """(state dict, config, directory or None) of a model given as a path or a model object."""
    if not isinstance(hf_dir_or_model, (str, os.PathLike)):
        for_config(hf_dir_or_model.config)
        return hf_dir_or_model.state_dict(), hf_dir_or_model.config, None
    path = str(hf_dir_or_model)
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ConversionError(f"--hf-model {path}: no config.json; give a directory written "
                              f"by save_pretrained")
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    for_config(config).model_flags(config)  # refuse what we cannot run before loading weights
    try:
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True,
                                                     dtype=torch.float32)
    except (OSError, ValueError, RuntimeError) as e:
        raise ConversionError(f"--hf-model {path}: cannot load the weights ({e})") from None
    return model.state_dict(), model.config, path


def _argv(fields: dict) -> list:
    argv = []
    for k, v in fields.items():
        if v is None or v is False:
            continue
        argv += [f"--{k.replace('_', '-')}"] + ([] if v is True else [str(v)])
    return argv


def _args_dict(config, tp: int, pp: int, divisible_by: int, seq_length: Optional[int],
               tokenizer: dict) -> dict:
    """Our training Args (as saved in checkpoints) for this model, validated by the driver."""
    from megatron.training.flags.arguments import parse_args
    fields = dict(for_config(config).model_flags(config))
    fields.update({"seq_length": seq_length or fields["max_position_embeddings"],
                   "make_vocab_size_divisible_by": divisible_by,
                   "tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp})
    fields.update({k: v for k, v in tokenizer.items() if v})
    return parse_args(_argv(fields), world_size=tp * pp).to_dict()


def _tokenizer_fields(hf_dir: Optional[str], cli) -> dict:
    if cli is not None and (cli.vocab_file or cli.tokenizer_model):
        ttype = cli.tokenizer_type or ("HuggingFaceTokenizer" if cli.tokenizer_model
                                       else "GPT2BPETokenizer")
        return {"tokenizer_type": ttype, "vocab_file": cli.vocab_file,
                "merge_file": cli.merge_file, "tokenizer_model": cli.tokenizer_model}
    if hf_dir and any(os.path.isfile(os.path.join(hf_dir, f)) for f in _TOKENIZER_FILES):
        return {"tokenizer_type": "HuggingFaceTokenizer",
                "tokenizer_model": os.path.abspath(hf_dir)}
    return {}


def full_from_hf(hf_dir_or_model, tp: int = 1, pp: int = 1, make_vocab_size_divisible_by=128,
                 seq_length: Optional[int] = None, tokenizer_flags=None) -> FullCheckpoint:
    """A Hugging Face model as a FullCheckpoint (our global names, vocabulary padded for tp)."""
    hf_sd, config, hf_dir = _load_hf(hf_dir_or_model)
    tok = _tokenizer_fields(hf_dir, tokenizer_flags)
    args = _args_dict(config, tp, pp, make_vocab_size_divisible_by, seq_length, tok)
    vocab = config.vocab_size
    if tok:
        from megatron.training.data.tokenizer import build_tokenizer
        n = build_tokenizer(tok["tokenizer_type"], tok.get("vocab_file"), tok.get("merge_file"),
                            tok.get("tokenizer_model")).vocab_size
        if n > vocab:
            raise ConversionError(
                f"config.json has vocab_size {vocab} but the tokenizer has {n} tokens; our "
                f"driver sizes the embedding from the tokenizer, so the checkpoint would not "
                f"load. Pass the matching tokenizer (--vocab-file/--merge-file or "
                f"--tokenizer-model)")
        if n < vocab:  # OPT, GPT-J, GPT-NeoX, Qwen2 round their embeddings up past the tokenizer
            hf_sd = _cut_vocab_rows(hf_sd, vocab, n)
            vocab = n
    rows = padded_vocab_size(vocab, make_vocab_size_divisible_by, tp)
    params = for_config(config).from_hf(hf_sd, config, rows)
    eos = getattr(config, "eos_token_id", None)
    return FullCheckpoint(params=params, args=args, padded_vocab_size=rows, vocab_size=vocab,
                          optimizer=None, eod=eos if isinstance(eos, int) else None)


_VOCAB_TENSORS = ("embed_tokens.", "wte.", "embed_in.", "lm_head.", "embed_out.")


def _cut_vocab_rows(hf_sd: dict, config_vocab: int, tokenizer_vocab: int) -> dict:
    """Drop the embedding/lm_head rows of ids the tokenizer never produces.

    Our driver sizes the embedding from the tokenizer (padded to Megatron's multiple) and
    masks the padding logits in the loss; Hugging Face keeps these rows in its softmax, so
    with them cut our loss differs from HF's by their (small, untrained) probability mass.
    """
    print(f"note: config.json has vocab_size {config_vocab}, the tokenizer {tokenizer_vocab} "
          f"tokens; the {config_vocab - tokenizer_vocab} rows past the tokenizer are dropped "
          f"(an export writes vocab_size {tokenizer_vocab})", file=sys.stderr)
    return {k: (v[:tokenizer_vocab] if any(p in k for p in _VOCAB_TENSORS)
                and v.shape[0] == config_vocab else v) for k, v in hf_sd.items()}


def import_hf(hf_dir_or_model, tp: int = 1, pp: int = 1, make_vocab_size_divisible_by=128,
              seq_length: Optional[int] = None, tokenizer_flags=None) -> List[dict]:
    """Shard dicts (model_optim_rng.pt format) indexed pp_rank * tp + tp_rank."""
    full = full_from_hf(hf_dir_or_model, tp, pp, make_vocab_size_divisible_by, seq_length,
                        tokenizer_flags)
    shards = split(full, tp, pp)
    return [shards[(t, p)] for p in range(pp) for t in range(tp)]


import_hf_gpt2 = import_hf  # the name from when GPT-2 was the only family


def model_flags(args: dict) -> str:
    """The pretrain_gpt.py model flags matching an imported checkpoint (defaults omitted)."""
    import dataclasses
    from megatron.training.flags.arguments import ModelArgs
    m = args["model"]
    always = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size",
              "max_position_embeddings", "seq_length", "layernorm_epsilon",
              "make_vocab_size_divisible_by")
    out = []
    for f in dataclasses.fields(ModelArgs):
        if f.name not in m or f.name in ("bf16", "fp16"):
            continue
        value = m[f.name]
        if f.name in always or value != f.default:
            out += _argv({f.name: value}) if not isinstance(value, bool) or value else []
    return " ".join(out)


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    t0 = time.time()
    try:
        full = full_from_hf(a.hf_model, a.tp, a.pp, a.make_vocab_size_divisible_by,
                            a.seq_length, a)
        shards = split(full, a.tp, a.pp, progress=not a.no_progress)
        os.makedirs(a.save, exist_ok=True)
        out = write_checkpoint(a.save, shards, progress=not a.no_progress)
    except (CheckpointError, ConversionError, ValueError) as e:
        return fail(str(e))
    print(f"wrote {out} (tp={a.tp} pp={a.pp}) in {time.time() - t0:.1f}s\n"
          f"train from it with: --load {a.save} --finetune {model_flags(full.args)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
