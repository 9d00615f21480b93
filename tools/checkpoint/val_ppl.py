"""Validation loss and perplexity of a checkpoint on a .bin/.idx dataset, in one CPU process.

    python tools/checkpoint/val_ppl.py --load ckpts/run1
    # -> validation loss 5.123456E+00 | perplexity 1.678E+02 | 10 iterations x 16 samples x 128 tokens
    python tools/checkpoint/val_ppl.py --load ckpts/run1 --data-path other_text_document \\
        --split 0,100,0 --eval-iters 50

The checkpoint may have any tp x pp layout: its shards are merged (layout.py) into one
GPTModel. The number is computed by the training loop's own code: a 1-process Trainer built
from the checkpoint's saved args runs `Trainer.evaluate`, i.e. the mean loss over the first
--eval-iters global batches of the valid split, with the same dataset construction (seed,
split, sample counts) as the run that saved it. So, with unchanged flags, it equals the
validation loss the training loop printed at that iteration (the loop's number differs only
if a lossy pipeline codec compressed its forward activations; here nothing is compressed).
"""
import argparse
import dataclasses
import math
import os
import sys
import time

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
        __file__)))))

from tools.checkpoint.common import add_tokenizer_flags, fail  # noqa: E402
from megatron.cc.pipeline.subspace import saved_constrain_mode  # noqa: E402
from tools.checkpoint.layout import (  # noqa: E402
    SUBSPACE_BASIS, CheckpointError, FullCheckpoint, merge, read_checkpoint, split)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--load", required=True, help="Checkpoint directory (any tp x pp layout).")
    p.add_argument("--iteration", type=int, default=None,
                   help="Iteration to evaluate (default: the latest).")
    p.add_argument("--data-path", nargs="+", default=None,
                   help="Dataset prefix(es) as for training (default: the checkpoint's).")
    p.add_argument("--split", default=None,
                   help="Train,valid,test proportions (default: the checkpoint's).")
    p.add_argument("--eval-iters", type=int, default=None,
                   help="Global batches to average over (default: the checkpoint's).")
    p.add_argument("--global-batch-size", type=int, default=None,
                   help="Samples per batch (default: the checkpoint's).")
    p.add_argument("--micro-batch-size", type=int, default=None,
                   help="Samples per forward pass (default: the checkpoint's).")
    p.add_argument("--data-cache-path", default=None,
                   help="Where GPTDataset caches its index files (default: the checkpoint's).")
    add_tokenizer_flags(p, purpose="default: the checkpoint's")
    return p


def _build(cls, values: dict):
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})


def eval_args(full: FullCheckpoint, **overrides):
    """The saved training Args at tp = pp = 1 in one process, with `overrides` (flag names)."""
    from megatron.cc.config import CompressionConfig
    from megatron.training.flags import arguments as A
    d = full.args
    groups = {name: _build(cls, dict(d.get(name, {}))) for name, cls, _ in A.GROUPS}
    # Uncompressed: nothing crosses a process boundary in one process anyway. But a subspace
    # model (megatron/training/model/subspace.py) is another model: keep its rank.
    constrain = saved_constrain_mode(d.get("compression"))
    if constrain != "writes":
        raise SystemExit(f"this checkpoint was trained with --subspace-constrain {constrain}: its "
                         "stage boundaries are part of the model, which one process cannot "
                         "build; evaluate it with pretrain_gpt.py at its own "
                         "--pipeline-model-parallel-size (--load it with --train-iters equal "
                         "to its iteration: the final validation runs, no step is taken)")
    # k as trained: the saved basis is (H, k) whatever the defaults were then
    basis = full.params.get(SUBSPACE_BASIS)
    rank = None if basis is None else int(basis.shape[1])
    args = A.Args(**groups, compression=CompressionConfig(subspace_rank=rank), world_size=1)
    args.parallel.tensor_model_parallel_size = args.parallel.pipeline_model_parallel_size = 1
    args.parallel.distributed_backend = "gloo"
    # One process needs none of the training run's GPU options (transports, loss scaling);
    # a bf16/fp16 checkpoint read without a GPU is evaluated in fp32.
    args.gpu = A.GpuArgs()
    import torch
    if not torch.cuda.is_available():
        args.model.bf16 = args.model.fp16 = False
    c = args.checkpoint
    c.load = c.save = c.save_interval = c.exit_interval = None
    args.logging.tensorboard_dir = None
    for key, value in overrides.items():
        if value is None:
            continue
        group = next(g for g in (args.data, args.training, args.logging)
                     if key in {f.name for f in dataclasses.fields(g)})
        setattr(group, key, value)
    if args.training.global_batch_size % args.training.micro_batch_size:
        args.training.micro_batch_size = 1  # a smaller batch than trained with
    A.validate_args(args)
    return args


def validation_loss(load: str, iteration=None, **overrides) -> float:
    """Mean validation lm loss of the checkpoint (see the module docstring)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.training.runtime.initialize import initialize_distributed
    from megatron.training.model.model import unwrap
    from megatron.training.loop.training import Trainer

    full = merge(read_checkpoint(load, iteration))
    args = eval_args(full, **overrides)
    created = not dist.is_initialized()
    if created:  # a private 1-process group, whatever a launcher left in the environment
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0",
                          WORLD_SIZE="1", LOCAL_RANK="0")
    elif dist.get_world_size() != 1:
        raise CheckpointError("val_ppl runs in one process; call it outside a multi-rank job")
    initialize_distributed(args)
    try:
        trainer = Trainer(args)
        shard = split(full, 1, 1, vocab_size=trainer.tokenizer.vocab_size,
                      with_optimizer=False)[(0, 0)]
        if shard["layout"]["padded_vocab_size"] != trainer.padded_vocab_size:
            raise CheckpointError("tokenizer and checkpoint disagree on the vocabulary size")
        unwrap(trainer.model).load_state_dict(shard["model"], strict=True)
        trainer.iteration = full.iteration
        loss = trainer.evaluate()
        trainer.close()
    finally:
        ps.destroy_model_parallel()
        if created:
            dist.destroy_process_group()
    if loss is None:
        raise CheckpointError("no validation data: the valid split is empty (check --split "
                              "and --data-path)")
    return loss


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    # The driver runs torch on OMP_NUM_THREADS threads (1 if unset): use the machine here.
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    t0 = time.time()
    overrides = dict(data_path=a.data_path, split=a.split, eval_iters=a.eval_iters,
                     global_batch_size=a.global_batch_size, micro_batch_size=a.micro_batch_size,
                     data_cache_path=a.data_cache_path, tokenizer_type=a.tokenizer_type,
                     vocab_file=a.vocab_file, merge_file=a.merge_file,
                     tokenizer_model=a.tokenizer_model)
    if (a.vocab_file or a.tokenizer_model) and not a.tokenizer_type:
        overrides["tokenizer_type"] = ("HuggingFaceTokenizer" if a.tokenizer_model
                                       else "GPT2BPETokenizer")
    try:
        loss = validation_loss(a.load, a.iteration, **overrides)
    except (CheckpointError, ValueError) as e:
        return fail(str(e))
    print(f"validation loss {loss:.8E} | perplexity {math.exp(min(20.0, loss)):.6E} | "
          f"{time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
