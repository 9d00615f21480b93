"""Run the training driver inside a test's spawned ranks (see tests/distributed.py)."""
import torch.distributed as dist


def destroy_subgroups():
    """Every process group but the default one: megatron-core's destroy_model_parallel drops its
    references, but torch keeps each group (and its gloo threads, which poll) until destroyed,
    so a rank running several trainings would pile them up."""
    from torch.distributed import distributed_c10d as c10d
    default = c10d._get_default_group()
    for pg in list(c10d._world.pg_map):
        if pg is not default:
            dist.destroy_process_group(pg)


def _run(argv, world_size, after_train=None):
    """Parse, initialise, train, tear down; return (last rank's losses, after_train(trainer))."""
    from megatron.training.flags.arguments import parse_args
    from megatron.training.runtime.initialize import initialize_distributed
    from megatron.training.loop.training import Trainer
    from megatron.core import parallel_state as ps

    args = parse_args(argv, world_size=world_size)
    initialize_distributed(args)
    trainer = Trainer(args)
    if after_train is not None:
        args.logging.log_interval = 10**9  # keep every count: no log line resets the stats
    trainer.train()
    extra = after_train(trainer) if after_train is not None else None
    losses = list(trainer.loss_history)
    trainer.close()
    ps.destroy_model_parallel()
    destroy_subgroups()
    return (losses if dist.get_rank() == dist.get_world_size() - 1 else None), extra


def train(argv, world_size):
    """Train with `argv`; return the last rank's per-iteration lm loss list (None elsewhere)."""
    return _run(argv, world_size)[0]


def train_with_stats(argv, world_size, channel):
    """Train; return (last rank's losses, whole-job {sent, raw, messages} of `channel`)."""
    from megatron.cc.common.stats import ChannelStats

    def totals(trainer):
        snapshots = [None] * dist.get_world_size()
        dist.all_gather_object(snapshots, trainer.stats.snapshot())
        return ChannelStats.merge(snapshots).get(channel)

    return _run(argv, world_size, after_train=totals)


def train_counting_graphs(argv, world_size):
    """Train; return (last rank's losses, the graphs dynamo captured in this rank)."""
    import torch
    return _run(argv, world_size,
                after_train=lambda t: torch._dynamo.utils.counters["stats"]["unique_graphs"])


def rewind(ckpt: str, iteration: int) -> None:
    """Point Megatron's tracker file back at an earlier save (collective): a run saving at k and
    2k then resumes from k, one run fewer than a separate k-iteration run."""
    import os
    dist.barrier()
    if dist.get_rank() == 0:
        with open(os.path.join(ckpt, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(iteration))
    dist.barrier()
