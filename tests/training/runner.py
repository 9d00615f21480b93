"""Run the training driver inside a test's spawned ranks (see tests/distributed.py)."""
import torch.distributed as dist


def train(argv, world_size, load_then=None):
    """Train with `argv`; return the last rank's per-iteration lm loss list (None elsewhere)."""
    from megatron.training.arguments import parse_args
    from megatron.training.initialize import initialize_distributed
    from megatron.training.training import Trainer
    from megatron.core import parallel_state as ps

    args = parse_args(argv, world_size=world_size)
    initialize_distributed(args)
    trainer = Trainer(args)
    trainer.train()
    losses = list(trainer.loss_history)
    trainer.close()
    ps.destroy_model_parallel()
    return losses if dist.get_rank() == dist.get_world_size() - 1 else None


def train_with_stats(argv, world_size, channel):
    """Train; return (last rank's losses, whole-job {sent, raw, messages} of `channel`)."""
    from megatron.training.arguments import parse_args
    from megatron.training.initialize import initialize_distributed
    from megatron.training.training import Trainer
    from megatron.cc.stats import ChannelStats
    from megatron.core import parallel_state as ps

    args = parse_args(argv, world_size=world_size)
    initialize_distributed(args)
    trainer = Trainer(args)
    args.logging.log_interval = 10**9  # keep every count: no log line resets the stats
    trainer.train()
    snapshots = [None] * dist.get_world_size()
    dist.all_gather_object(snapshots, trainer.stats.snapshot())
    totals = ChannelStats.merge(snapshots).get(channel)
    losses = list(trainer.loss_history)
    trainer.close()
    ps.destroy_model_parallel()
    return (losses if dist.get_rank() == dist.get_world_size() - 1 else None), totals
