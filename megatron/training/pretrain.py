"""What pretrain_gpt.py runs: parse the flags, fill in the default data, train, report errors.

`main(argv)` is the whole entry point (pretrain_gpt.py calls it with sys.argv, tools such as
tools/dist_lm_runner.py with the argv they build): flag errors are one line on stderr and exit
code 2, as are data and checkpoint errors found later; any other failure prints the traceback
(after one line naming the collective a rank was stuck in, if any) and exits the process with 1
so the launcher stops the other ranks.
"""
import os
import sys
import time
import traceback

from megatron.training.flags.arguments import ConfigError, parse_args


def resolve_default_data(args) -> None:
    """No --data-path: train on the embedded corpus with its own tokenizer (built once, cached)."""
    if args.data.data_path:
        return
    from megatron.training.data.corpus import default_assets
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
        from megatron.training.flags.seed_flags import seed_notes
        for note in seed_notes(args):
            print(f"note: {note}", flush=True)
        from megatron.training.runtime.fallback_warnings import fallback_note
        from megatron.training.runtime.topology import cuda_available
        note = fallback_note() if cuda_available() else None  # CPU: fallbacks expected
        if note:
            print(f"note: {note}", flush=True)

    from megatron.training.checkpointing.checkpoint_io import CheckpointLoadError
    from megatron.training.runtime.initialize import destroy, initialize_distributed
    from megatron.training.loop.training import Trainer
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
        from megatron.training.runtime.collective_errors import describe_collective_failure
        collective = describe_collective_failure(sys.exc_info()[1])
        if collective:  # one line first: which collective this rank was stuck in
            os.write(2, f"[rank {rank}] error: {collective}\n".encode())
        print(f"[rank {rank}] training failed:\n{traceback.format_exc()}", file=sys.stderr,
              flush=True)
        os._exit(1)
    destroy()
    return 0

