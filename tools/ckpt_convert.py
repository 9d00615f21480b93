"""Optimus-CC's checkpoint converter, with the seed README's arguments: merge (or re-split) a
tensor x pipeline checkpoint, and write the result as a Hugging Face GPT-2 for zero-shot tasks.

A thin front over tools/checkpoint/reshard.py and export_hf.py. The README's command runs as
written (its Megatron model flags are checked against the checkpoint, not needed):

    WORLD_SIZE=8 python tools/ckpt_convert.py --model-type GPT \\
        --tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 \\
        --target-pipeline-model-parallel-size 1 --vocab-file gpt2-vocab.json \\
        --merge-file gpt2-merges.txt --num-layers 52 --hidden-size 1920 \\
        --num-attention-heads 24 --seq-length 1024 --max-position-embeddings 1024 \\
        --load ckpts/GPT-2.5B-Baseline/ --save ckpts/GPT-2.5B-Baseline/merge/ \\
        --experiment_name merge_baseline --tokenizer-type GPT2BPETokenizer \\
        --activations-checkpoint-method uniform --data-impl mmap --DDP-impl local \\
        -i ckpts/GPT-2.5B-Baseline/iter_0300000/ -o ckpts/GPT-2.5B-Baseline/merged/ \\
        -i_g 1 -p 1

  --save DIR   the checkpoint at (--target-tensor-model-parallel-size,
               --target-pipeline-model-parallel-size), default (1, 1): Megatron's layout, which
               pretrain_gpt.py --load and every tool here read
  --legacy-layout
               --save writes the (1, 1) checkpoint in legacy Megatron-LM's nested layout
               instead (Optimus-CC's own: model -> language_model -> embedding / encoder,
               checkpoint_version 3.0), weights only, with config.json and the tokenizer files
               in DIR/iter_N/mp_rank_00/: the seed's next step, transformers 4.x's
               convert_megatron_gpt2_checkpoint.py, reads it as it reads the seed's merge
               (tools/checkpoint/legacy_megatron.py; docs/seed_commands.md)
  -o DIR       the same model as a Hugging Face GPT2LMHeadModel directory (where the seed writes
               FasterTransformer weights, then converts to Hugging Face with transformers'
               convert_megatron_gpt2_checkpoint.py): lm-evaluation-harness loads it directly
               (tools/checkpoint/eval_lm.py)

The conversion runs in one process: WORLD_SIZE and -p are accepted and not needed.
"""
import argparse
import os
import re
import sys
import time

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tools.checkpoint.common import add_tokenizer_flags, fail  # noqa: E402
from tools.checkpoint.errors import CheckpointError, ConversionError  # noqa: E402

# Megatron model flags of the README command -> the key the checkpoint's args store them under
MODEL_FLAGS = ("num_layers", "hidden_size", "num_attention_heads", "seq_length",
               "max_position_embeddings")
# Training-only flags the README passes along; they mean nothing to a conversion.
IGNORED = ("experiment_name", "activations_checkpoint_method", "data_impl", "DDP_impl")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-type", default="GPT", choices=["GPT", "BERT", "T5"],
                   help="Only GPT checkpoints exist here (BERT and T5 are refused).")
    p.add_argument("--load", default=None, help="Training run directory (holds "
                   "latest_checkpointed_iteration.txt and iter_*/). Optional with -i.")
    p.add_argument("-i", "--in-file", dest="in_file", default=None, help="One iteration "
                   "directory, e.g. RUN/iter_0300000/ (default: the latest of --load).")
    p.add_argument("--save", default=None, help="Write the converted Megatron-layout "
                   "checkpoint here.")
    p.add_argument("--legacy-layout", action="store_true", help="--save writes the merged "
                   "(1, 1) checkpoint in legacy Megatron-LM's nested layout, for transformers "
                   "4.x's convert_megatron_gpt2_checkpoint.py (weights only; config.json and "
                   "tokenizer files beside it).")
    p.add_argument("-o", "--saved-dir", dest="saved_dir", default=None, help="Write a "
                   "Hugging Face GPT-2 directory here.")
    p.add_argument("--tensor-model-parallel-size", type=int, default=None, help="Layout the "
                   "checkpoint was trained at; checked against the files (optional).")
    p.add_argument("--pipeline-model-parallel-size", type=int, default=None,
                   help="As --tensor-model-parallel-size.")
    p.add_argument("--target-tensor-model-parallel-size", type=int, default=1,
                   help="Tensor-parallel size of --save (default 1).")
    p.add_argument("--target-pipeline-model-parallel-size", type=int, default=1,
                   help="Pipeline-parallel size of --save (default 1).")
    p.add_argument("-i_g", "--infer-gpu-num", dest="infer_gpu_num", type=int, default=1,
                   help="Seed: GPUs of the FasterTransformer output. A Hugging Face model is "
                        "one piece: only 1 (use --target-tensor-model-parallel-size for a "
                        "tensor-parallel Megatron checkpoint).")
    p.add_argument("-p", "--processes", type=int, default=1,
                   help="Seed: conversion processes; accepted, the conversion is one process.")
    for name in MODEL_FLAGS:
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=int, default=None,
                       help="Checked against the checkpoint's own value (optional).")
    for name in IGNORED:
        names = ["--" + name.replace("_", "-")] + (["--" + name] if "_" in name else [])
        p.add_argument(*names, dest=name, default=None,
                       help="Training flag of the seed's command; accepted and unused here.")
    add_tokenizer_flags(p, purpose="vocabulary size and the Hugging Face tokenizer files; "
                                   "default: the checkpoint's")
    p.add_argument("--no-progress", action="store_true", help="Hide the progress bars.")
    return p


def source(a):
    """(run directory, iteration or None) from --load and -i."""
    if a.in_file is None:
        if a.load is None:
            raise CheckpointError("give the checkpoint: --load RUN_DIR and/or -i RUN_DIR/iter_N/")
        return a.load, None
    path = os.path.normpath(a.in_file)
    m = re.fullmatch(r"iter_(\d+)", os.path.basename(path))
    if not m:
        raise CheckpointError(f"-i {a.in_file}: expected an iteration directory named "
                              f"iter_NNNNNNN inside the run directory")
    root = os.path.dirname(path)
    if a.load is not None and os.path.realpath(a.load) != os.path.realpath(root):
        raise CheckpointError(f"-i {a.in_file} is not inside --load {a.load}")
    return root, int(m.group(1))


def check_against(a, shards) -> None:
    """The README's layout and model flags must describe the checkpoint being converted."""
    first = next(iter(shards.shards.values())) if hasattr(shards, "shards") else None
    layout = first["layout"] if first else {}
    for flag, have in (("tensor_model_parallel_size", layout.get("tp")),
                       ("pipeline_model_parallel_size", layout.get("pp"))):
        want = getattr(a, flag)
        if want is not None and have is not None and want != have:
            raise CheckpointError(f"--{flag.replace('_', '-')} {want}: the checkpoint was "
                                  f"saved at {have}; drop the flag or fix it")
    model = (first or {}).get("args", {}).get("model", {})
    for name in MODEL_FLAGS:
        want, have = getattr(a, name), model.get(name)
        if want is not None and have is not None and want != have:
            raise CheckpointError(f"--{name.replace('_', '-')} {want}: the checkpoint's model "
                                  f"has {have}")


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    t0 = time.time()
    try:
        if a.model_type != "GPT":
            raise CheckpointError(f"--model-type {a.model_type}: only GPT checkpoints exist "
                                  f"here; use --model-type GPT")
        if a.infer_gpu_num != 1:
            raise CheckpointError(f"-i_g {a.infer_gpu_num}: the Hugging Face output is one "
                                  f"piece; use -i_g 1, and --target-tensor-model-parallel-size "
                                  f"{a.infer_gpu_num} with --save for a split Megatron checkpoint")
        if a.save is None and a.saved_dir is None:
            raise CheckpointError("nothing to write: give --save DIR (Megatron layout) and/or "
                                  "-o DIR (Hugging Face)")
        if a.legacy_layout and a.save is None:
            raise CheckpointError("--legacy-layout is the layout of --save: give --save DIR")
        from tools.checkpoint.export_hf import export
        from tools.checkpoint.layout import read_checkpoint
        from tools.checkpoint.reshard import reshard
        root, iteration = source(a)
        check_against(a, read_checkpoint(root, iteration))
        if a.save is not None:
            out = reshard(root, a.save, a.target_tensor_model_parallel_size,
                          a.target_pipeline_model_parallel_size, iteration,
                          progress=not a.no_progress, tokenizer_flags=a,
                          legacy=a.legacy_layout)
            print(f"wrote {out} (legacy Megatron-LM layout)" if a.legacy_layout else
                  f"wrote {out} (tp={a.target_tensor_model_parallel_size} "
                  f"pp={a.target_pipeline_model_parallel_size})")
        if a.saved_dir is not None:
            out = export(root, a.saved_dir, a, iteration, progress=not a.no_progress)
            print(f"wrote Hugging Face GPT-2 to {out}")
    except (CheckpointError, ConversionError, ValueError) as e:
        return fail(str(e))
    print(f"done in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
