"""Convert a checkpoint between tensor x pipeline layouts, or merge it into one piece (1 x 1).

    # (2,2) -> (1,4): then train with --tensor-model-parallel-size 1
    #                 --pipeline-model-parallel-size 4 --load ckpts/run1_pp4
    python tools/checkpoint/reshard.py --load ckpts/run1 --save ckpts/run1_pp4 \\
        --target-tensor-parallel-size 1 --target-pipeline-model-parallel-size 4

    # merge every tp x pp piece into one (Megatron's merge_mp_partitions / ckpt_convert)
    python tools/checkpoint/reshard.py --load ckpts/run1 --save ckpts/run1_merged

    # the same one piece in legacy Megatron-LM's nested layout (Optimus-CC's), for
    # transformers 4.x's convert_megatron_gpt2_checkpoint.py (see legacy_megatron.py)
    python tools/checkpoint/reshard.py --load ckpts/run1 --save ckpts/run1_legacy --legacy-layout

Model weights and Adam moments are concatenated and re-sliced exactly, so training resumed from
the new layout continues with the losses the old layout would have produced. The iteration,
consumed samples and LR schedule carry over; each file's 'layout' and the args' parallel sizes
are rewritten. Per-process RNG and compressor state (rank_state/) is dropped: it belongs to
one world size, and training starts it fresh (dropout masks and codec error buffers then
differ from an uninterrupted run). See layout.py for the vocabulary-padding rule.

The new checkpoint is written under iter_N.tmp/ and renamed into place before the
latest_checkpointed_iteration.txt file is replaced, so an interrupted run leaves no
half-written checkpoint.
"""
import argparse
import os
import sys
import time

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
        __file__)))))

from tools.checkpoint.common import add_tokenizer_flags, fail, tokenizer_vocab_size  # noqa: E402
from tools.checkpoint.errors import ConversionError  # noqa: E402
from tools.checkpoint.layout import (  # noqa: E402
    CheckpointError, merge, read_checkpoint, split, write_checkpoint)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--load", required=True, help="Checkpoint directory to read (as --save "
                   "wrote it: holds latest_checkpointed_iteration.txt).")
    p.add_argument("--save", required=True, help="Directory to write the converted checkpoint "
                   "to; must differ from --load.")
    p.add_argument("--target-tensor-parallel-size", "--target-tensor-model-parallel-size",
                   dest="tp", type=int, default=1, help="Tensor-parallel size of the new "
                   "checkpoint (default 1).")
    p.add_argument("--target-pipeline-parallel-size", "--target-pipeline-model-parallel-size",
                   dest="pp", type=int, default=1, help="Pipeline-parallel size of the new "
                   "checkpoint (default 1).")
    p.add_argument("--iteration", type=int, default=None, help="Iteration to convert "
                   "(default: the one latest_checkpointed_iteration.txt names).")
    p.add_argument("--no-optimizer", action="store_true", help="Drop the Adam moments "
                   "(smaller files; training from it starts the optimizer fresh).")
    p.add_argument("--legacy-layout", action="store_true", help="Write the merged (1, 1) "
                   "checkpoint in legacy Megatron-LM's nested layout (model -> language_model "
                   "-> embedding / encoder, checkpoint_version 3.0, args loadable with "
                   "weights_only), weights only, with config.json and the tokenizer files "
                   "beside it: the input of transformers 4.x's "
                   "convert_megatron_gpt2_checkpoint.py. GPT-2-shaped models only; needs the "
                   "tokenizer.")
    add_tokenizer_flags(p, purpose="the vocabulary size when the new tp changes the "
                                   "vocabulary padding, and the tokenizer --legacy-layout "
                                   "writes; default: the checkpoint's")
    p.add_argument("--true-vocab-size", type=int, default=None, help="The tokenizer's "
                   "vocabulary size, instead of building the tokenizer.")
    p.add_argument("--no-progress", action="store_true", help="Hide the progress bars.")
    p.add_argument("--trust-checkpoint", action="store_true", help="Unpickle the shards "
                   "fully (weights_only=False): only for files you made yourself.")
    return p


def reshard(load: str, save: str, tp: int, pp: int, iteration=None, vocab_size=None,
            with_optimizer: bool = True, progress: bool = False, tokenizer_flags=None,
            trust: bool = False, legacy: bool = False) -> str:
    """Read `load`, write it to `save` at (tp, pp); returns the new iteration directory
    (`legacy`: legacy Megatron-LM's layout at (1, 1); returns its shard directory)."""
    if os.path.realpath(load) == os.path.realpath(save):
        raise CheckpointError(f"--save {save} is the --load directory; write somewhere else")
    if legacy and (tp, pp) != (1, 1):
        raise CheckpointError(f"--legacy-layout writes one piece: the target sizes must be "
                              f"1 and 1 (got tensor {tp}, pipeline {pp})")
    full = merge(read_checkpoint(load, iteration, progress, trust), progress)
    if legacy:
        from tools.checkpoint.common import build_tokenizer_from
        from tools.checkpoint.legacy_megatron import write_legacy
        return write_legacy(full, save, build_tokenizer_from(
            tokenizer_flags or argparse.Namespace(), full.args, required=True))
    if vocab_size is None and full.vocab_size is None:
        # The padded size at the new tp may depend on the exact vocabulary size.
        vocab_size = tokenizer_vocab_size(tokenizer_flags or argparse.Namespace(), full.args)
    if full.optimizer is None and with_optimizer:
        print("note: this checkpoint's optimizer state is not stored by parameter name (saved "
              "before bf16/fp16 runs, or --use-distributed-optimizer runs, stored it so); the "
              "new checkpoint has none and training starts Adam's moments fresh",
              file=sys.stderr)
    shards = split(full, tp, pp, vocab_size=vocab_size, with_optimizer=with_optimizer,
                   progress=progress)
    os.makedirs(save, exist_ok=True)
    return write_checkpoint(save, shards, progress)


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    t0 = time.time()
    try:
        out = reshard(a.load, a.save, a.tp, a.pp, a.iteration, a.true_vocab_size,
                      not a.no_optimizer, progress=not a.no_progress, tokenizer_flags=a,
                      trust=a.trust_checkpoint, legacy=a.legacy_layout)
    except (CheckpointError, ConversionError, ValueError) as e:
        return fail(str(e))
    layout = "legacy Megatron-LM layout" if a.legacy_layout else f"tp={a.tp} pp={a.pp}"
    print(f"wrote {out} ({layout}) in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
