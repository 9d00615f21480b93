"""Pretrain a GPT model with tensor x pipeline x data parallelism and compressed communication.

CPU demo (8 processes, TP2 x PP2 x DP2, the embedded corpus and tokenizer):
    OMP_NUM_THREADS=1 torchrun --nproc-per-node 8 pretrain_gpt.py \
        --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \
        --num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 128 \
        --micro-batch-size 4 --global-batch-size 32 --train-iters 300 --lr 1e-3

GPU node (8 GPUs, your data):
    torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 4 \
        --pipeline-model-parallel-size 2 --num-layers 24 --hidden-size 1024 \
        --num-attention-heads 16 --seq-length 1024 --micro-batch-size 8 \
        --global-batch-size 256 --train-iters 10000 --lr 3e-4 --bf16 \
        --data-path my_text_document --vocab-file vocab.json --merge-file merges.txt

See examples/ for multi-node torchrun, Slurm and LSF (docs/running.md), and README.md for the
compression flags.
Optimus-CC's scripts (Megatron-LM v2.5 flags, `python -m torch.distributed.launch`) run as they
are; docs/seed_commands.md maps every seed command, and tools/dist_lm_runner.py takes AC-SGD's,
TAH-Quant's and CocktailSGD's runner command lines.
"""
import os
import sys
import time
import traceback

from megatron.training.arguments import ConfigError, parse_args


def resolve_default_data(args) -> None:
    """No --data-path: train on the embedded corpus with its own tokenizer (built once, cached)."""
    if args.data.data_path:
        return
    from tools.corpus import default_assets
    assets = default_assets()
    if not args.data.task_name:   # --task-name brings its own data, maybe not the tokenizer
        args.data.data_path = [assets.data_prefix]
    if args.data.vocab_file is None and args.data.tokenizer_type == "GPT2BPETokenizer":
        args.data.vocab_file, args.data.merge_file = assets.vocab_file, assets.merge_file


def report_error(e: Exception) -> None:
    """One line on stderr, written in one call so lines of ranks sharing a terminal never mix."""
    os.write(2, f"[rank {os.environ.get('RANK', '0')}] error: {e}\n".encode())


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
    except ConfigError as e:
        report_error(e)
        # Every rank reaches the same verdict in milliseconds; linger briefly so that a
        # launcher that kills the job on the first exit does not cut the others' message.
        time.sleep(3 if int(os.environ.get("WORLD_SIZE", "1")) > 1 else 0)
        return 2
    resolve_default_data(args)
    if args.compat.local_rank is not None:   # python -m torch.distributed.launch's --local-rank
        os.environ.setdefault("LOCAL_RANK", str(args.compat.local_rank))
    if int(os.environ.get("RANK", "0")) == 0:
        from megatron.training.seed_flags import seed_notes
        for note in seed_notes(args):
            print(f"note: {note}", flush=True)
        import torch
        from megatron.training.fallback_warnings import fallback_note
        note = fallback_note() if torch.cuda.is_available() else None  # CPU: fallbacks expected
        if note:
            print(f"note: {note}", flush=True)

    from megatron.training.checkpoint_io import CheckpointLoadError
    from megatron.training.initialize import destroy, initialize_distributed
    from megatron.training.training import Trainer
    try:
        trainer = Trainer(args, initialize_distributed(args))
        trainer.train()
        trainer.final_evaluate()
        trainer.close()
    except (ConfigError, CheckpointLoadError) as e:
        # found only once the data or memory is known (activation caches), or at --load
        report_error(e)
        os._exit(2)
    except Exception:
        # Never leave the other ranks blocked in a collective: report and exit hard; torchrun
        # (or srun --kill-on-bad-exit) then stops the rest of the job.
        rank = os.environ.get("RANK", "0")
        from megatron.training.collective_errors import describe_collective_failure
        collective = describe_collective_failure(sys.exc_info()[1])
        if collective:  # one line first: which collective this rank was stuck in
            os.write(2, f"[rank {rank}] error: {collective}\n".encode())
        print(f"[rank {rank}] training failed:\n{traceback.format_exc()}", file=sys.stderr,
              flush=True)
        os._exit(1)
    destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
