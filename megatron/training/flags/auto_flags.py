"""The flags outside the compression config that --compression auto sets or cannot plan.

Kept apart from auto_compression.py (which validates a candidate through arguments.py) so that
argument parsing checks them without importing the planner.
"""
from megatron.training.config.config_flags import ConfigError

# the planner's overlap choice, as flags and as ParallelArgs fields
OVERLAP_FLAGS = {"--overlap-p2p-comm": "overlap_p2p_comm",
                 "--overlap-grad-reduce": "overlap_grad_reduce"}


def validate_auto_args(args) -> None:
    """The non-compression flags --compression auto sets or cannot plan (at parse time)."""
    if args.compression.compression != "auto":
        return
    for flag_, field in OVERLAP_FLAGS.items():
        if getattr(args.parallel, field):
            raise ConfigError(f"{flag_} is chosen by --compression auto; drop it, or use "
                              f"--compression manual")
    if args.gpu.use_distributed_optimizer:
        raise ConfigError("--compression auto plans the all-reduce gradient sync; "
                          "--use-distributed-optimizer replaces it: drop one of them")
    if args.compat.pp_mode == "gpipe":
        raise ConfigError("--compression auto plans a 1F1B schedule; drop --pp-mode gpipe or "
                          "use --compression manual")
    if args.compat.rampup_batch_size is not None:
        raise ConfigError("--compression auto plans a fixed global batch; drop "
                          "--rampup-batch-size or use --compression manual")
