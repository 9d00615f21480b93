"""Export a checkpoint (any tp x pp layout) as a Hugging Face model directory.

    python tools/checkpoint/export_hf.py --load ckpts/run1 --output hf/run1 \\
        --vocab-file vocab.json --merge-file merges.txt
    # hf/run1: config.json, generation_config.json, model.safetensors, tokenizer files;
    # transformers.AutoModelForCausalLM.from_pretrained("hf/run1") loads it offline.

The family is the one the checkpoint's model flags describe (tools/checkpoint/hf_families/):
GPT-2 (learned positions, LayerNorm, GeLU, tied), Llama (rope, RMSNorm, SwiGLU, no biases),
Qwen2 (Llama + --add-qkv-bias), OPT (--relu), GPT-NeoX (rope with --rotary-percent, LayerNorm,
GeLU, optionally --parallel-residual), GPT-J (--rotary-interleaved, shared-norm parallel
residual, --output-layer-bias); --hf-model-type picks one explicitly. A model no family can
hold is refused with, per family, the flags that stand in the way.

The tokenizer defaults to the files the checkpoint was trained with (if they still exist);
--vocab-file/--merge-file (GPT-2 BPE) or --tokenizer-model (a local HF tokenizer directory)
override it. The embedding is cut from the padded vocabulary to the tokenizer's size. A
checkpoint with no tokenizer at hand (e.g. imported from a Hugging Face directory without
tokenizer files) is exported without one, at the vocabulary size it records, and one line says
so; from_pretrained loads it, and AutoTokenizer then needs a tokenizer from elsewhere.

The directory is assembled under <output>.tmp-<pid>/ and renamed into place when complete.
"""
import argparse
import os
import shutil
import sys
import time
from typing import Optional

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
        __file__)))))

import torch  # noqa: E402

from tools.checkpoint.common import (  # noqa: E402
    add_tokenizer_flags, build_tokenizer_from, fail, replace_dir)
from tools.checkpoint.errors import ConversionError  # noqa: E402
from tools.checkpoint.hf_families import for_model_args  # noqa: E402
from tools.checkpoint.layout import (  # noqa: E402
    CheckpointError, FullCheckpoint, merge, read_checkpoint)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--load", required=True, help="Checkpoint directory (any tp x pp layout).")
    p.add_argument("--output", required=True, help="Hugging Face model directory to write "
                   "(replaced if it exists).")
    p.add_argument("--iteration", type=int, default=None,
                   help="Iteration to export (default: the latest).")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32",
                   help="Dtype of the saved weights (default float32).")
    p.add_argument("--hf-model-type", default=None,
                   help="Hugging Face model_type to write (gpt2, llama, qwen2, opt, gpt_neox, "
                        "gptj); default: the family the checkpoint's model flags describe.")
    add_tokenizer_flags(p, purpose="saved with the model; default: the checkpoint's")
    p.add_argument("--no-progress", action="store_true", help="Hide the progress bars.")
    p.add_argument("--trust-checkpoint", action="store_true", help="Unpickle the shards "
                   "fully (weights_only=False): only for files you made yourself.")
    return p


def build_hf_model(full: FullCheckpoint, tokenizer, dtype: torch.dtype = torch.float32,
                   model_type=None):
    """A transformers model of the checkpoint's family holding its weights."""
    from transformers import AutoModelForCausalLM
    from tools.checkpoint.subspace_hf import unconstrain
    full = unconstrain(full)   # a subspace checkpoint: its equivalent ordinary model
    family = for_model_args(full.model_args, model_type)
    config = family.hf_config(full.model_args, tokenizer.vocab_size, tokenizer.eod, dtype)
    state = family.to_hf(full.params, full.model_args, tokenizer.vocab_size)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = getattr(config, "tie_word_embeddings", False)
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]
    if missing or unexpected:
        raise ConversionError(f"{family.hf_class} state dict mismatch: missing {missing}, "
                              f"unexpected {unexpected}")
    if tied:
        model.tie_weights()
    return model.to(dtype).eval()


class VocabOnly:
    """What build_hf_model reads of a tokenizer, for a checkpoint exported without one."""

    def __init__(self, vocab_size: int, eod: Optional[int]):
        self.vocab_size, self.eod = vocab_size, eod


def export_tokenizer(full: FullCheckpoint, tokenizer_flags, require_tokenizer: bool):
    """(the tokenizer to save with the model, None) or (VocabOnly, why none is written)."""
    flags = tokenizer_flags or argparse.Namespace()
    if require_tokenizer or full.vocab_size is None:   # no size to export at without one
        return build_tokenizer_from(flags, full.args, required=True), None
    tokenizer = build_tokenizer_from(flags, full.args, required=False)
    if tokenizer is not None:
        return tokenizer, None
    return VocabOnly(full.vocab_size, full.eod), (
        f"no tokenizer written: the checkpoint names no tokenizer files that exist here (pass "
        f"--vocab-file/--merge-file or --tokenizer-model to add one); the model is exported "
        f"with vocab_size {full.vocab_size}")


def export(load: str, output: str, tokenizer_flags=None, iteration=None,
           dtype: str = "float32", progress: bool = False, model_type=None,
           trust: bool = False, require_tokenizer: bool = False) -> str:
    """Write the Hugging Face directory; returns its path. Without a tokenizer (and unless
    `require_tokenizer`), the model alone is written and one line on stdout says so."""
    full = merge(read_checkpoint(load, iteration, progress, trust), progress)
    # Before anything else: the answer does not depend on the tokenizer.
    for_model_args(full.model_args, model_type)
    tokenizer, no_tokenizer = export_tokenizer(full, tokenizer_flags, require_tokenizer)
    model = build_hf_model(full, tokenizer, DTYPES[dtype], model_type)
    output = os.path.abspath(output)
    tmp = f"{output}.tmp-{os.getpid()}"
    os.makedirs(tmp, exist_ok=True)
    try:
        model.save_pretrained(tmp)  # config.json, generation_config.json, model.safetensors
        if no_tokenizer is None:
            tokenizer.save_pretrained(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_dir(tmp, output)
    if no_tokenizer:
        print(f"note: {no_tokenizer}", flush=True)
    return output


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    t0 = time.time()
    try:
        out = export(a.load, a.output, a, a.iteration, a.dtype, progress=not a.no_progress,
                     model_type=a.hf_model_type, trust=a.trust_checkpoint)
    except (CheckpointError, ConversionError, ValueError) as e:
        return fail(str(e))
    print(f"wrote Hugging Face model to {out} in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
