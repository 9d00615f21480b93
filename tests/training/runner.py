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
