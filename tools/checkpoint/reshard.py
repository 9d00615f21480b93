"""Convert a checkpoint between tensor x pipeline layouts, or merge it into one piece (1 x 1).

    # (2,2) -> (1,4): then train with --tensor-model-parallel-size 1
    #                 --pipeline-model-parallel-size 4 --load ckpts/run1_pp4
    python tools/checkpoint/reshard.py --load ckpts/run1 --save ckpts/run1_pp4 \\
        --target-tensor-parallel-size 1 --target-pipeline-model-parallel-size 4

    # merge every tp x pp piece into one (Megatron's merge_mp_partitions / ckpt_convert)
    python tools/checkpoint/reshard.py --load ckpts/run1 --save ckpts/run1_merged

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
    add_tokenizer_flags(p, purpose="only to learn the vocabulary size when the new tp "
                                   "changes the vocabulary padding; default: the checkpoint's")
    p.add_argument("--true-vocab-size", type=int, default=None, help="The tokenizer's "
                   "vocabulary size, instead of building the tokenizer.")
    p.add_argument("--no-progress", action="store_true", help="Hide the progress bars.")
    p.add_argument("--trust-checkpoint", action="store_true", help="Unpickle the shards "
                   "fully (weights_only=False): only for files you made yourself.")
    return p


def reshard(load: str, save: str, tp: int, pp: int, iteration=None, vocab_size=None,
            with_optimizer: bool = True, progress: bool = False, tokenizer_flags=None,
            trust: bool = False) -> str:
    """Read `load`, write it to `save` at (tp, pp); returns the new iteration directory."""
    if os.path.realpath(load) == os.path.realpath(save):
        raise CheckpointError(f"--save {save} is the --load directory; write somewhere else")
    full = merge(read_checkpoint(load, iteration, progress, trust), progress)
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
                      trust=a.trust_checkpoint)
    except (CheckpointError, ValueError) as e:
        return fail(str(e))
    print(f"wrote {out} (tp={a.tp} pp={a.pp}) in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
