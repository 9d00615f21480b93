"""Inside spawned ranks: a Trainer on the tiny corpus, one backward, and grad snapshots."""
import dataclasses

import torch


def make_trainer(corpus, world, tp=1, pp=1, **flags):
    from megatron.training.flags.arguments import parse_args
    from megatron.training.runtime.initialize import initialize_distributed
    from megatron.training.loop.training import Trainer
    from tests.conftest import tiny_gpt_argv

    argv = tiny_gpt_argv(corpus, **{"tensor-model-parallel-size": tp,
                                    "pipeline-model-parallel-size": pp, **flags})
    args = parse_args(argv, world_size=world)
    initialize_distributed(args)
    return Trainer(args)


def backward_once(trainer) -> None:
    """Local (unsynchronised) gradients of the first global batch in the DDP buffers."""
    trainer.model.zero_grad_buffer()
    trainer.forward_backward(trainer.train_ds, 0)


def save_buffers(model):
    return [b.grad_data.clone() for b in model.buffers]


def restore_buffers(model, saved) -> None:
    for b, s in zip(model.buffers, saved):
        b.grad_data.copy_(s)


def named_grads(model):
    return {n: p.main_grad.clone() for n, p in model.named_parameters()}


def with_compression(args, **changes):
    """A copy of args whose CompressionConfig has `changes` (validated like the flags)."""
    comp = args.compression.replace(**changes)
    comp.validate(pp=args.pp, dp=args.dp, tp=args.tp)
    return dataclasses.replace(args, compression=comp)


def max_diff(a: dict, b: dict, names=None) -> float:
    names = a.keys() if names is None else names
    return max((float((a[n] - b[n]).abs().max()) for n in names), default=0.0)


def embedding_name(model):
    from megatron.cc.grad_sync.sync import shared_embedding_weight
    w = shared_embedding_weight(model)
    return next((n for n, p in model.named_parameters() if p is w), None)


def teardown() -> None:
    from megatron.core import parallel_state as ps
    ps.destroy_model_parallel()


def allclose_across(group, t: torch.Tensor) -> float:
    """max |t - t on the group's first rank|: 0 when every replica holds the same tensor."""
    import torch.distributed as dist
    ref = t.clone()
    dist.broadcast(ref, src=dist.get_global_rank(group, 0), group=group)
    return float((ref - t).abs().max())
