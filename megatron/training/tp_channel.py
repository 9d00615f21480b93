"""Route megatron-core's tensor-parallel all-reduces through the tp channel (megatron/cc/tp_reduce.py).

At tp > 1 (without sequence parallelism) megatron-core sums over the tensor-parallel group:
    row-parallel layers (attention and MLP output projections)   their partial outputs, forward
    column-parallel layers (QKV, MLP input, output layer)          their input-gradient shares,
                                                                   backward
    the vocab-parallel embedding                                  its partial lookups, forward
    vocab-parallel cross entropy                                  3 (batch, seq) fp32 tensors
The first two are taken over here (megatron-core's own reduce switched off on the module, ours
around it: the same all-reduce of the same tensor unless --mp-acti-comp / --mp-grad-comp
compress it); the last two are counted. The optimizer's grad-norm all-reduce (one float over
the model-parallel group) is not counted.
"""
from typing import Optional

import torch
from megatron.core.tensor_parallel.layers import (ColumnParallelLinear, RowParallelLinear,
                                                  VocabParallelEmbedding)

from megatron.cc.tp_reduce import LowRankSum, TensorParallelReduce


class _ForwardSum(torch.autograd.Function):
    """Sum over the group forward; gradient passed through (megatron's reduce_from region)."""

    @staticmethod
    def forward(ctx, x, reduce: TensorParallelReduce, site: str):
        return reduce.forward_sum(x, site)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class _BackwardSum(torch.autograd.Function):
    """Identity forward; the gradient summed over the group (megatron's copy_to region)."""

    @staticmethod
    def forward(ctx, x, reduce: TensorParallelReduce, site: str):
        ctx.reduce, ctx.site = reduce, site
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.reduce.backward_sum(grad, ctx.site), None, None


def _sum_forward_output(reduce, site):
    def hook(module, inputs, output):
        out, bias = output
        if not torch.is_grad_enabled():   # validation: exact, not counted (no autograd here)
            return reduce.forward_sum(out, site, training=False), bias
        return _ForwardSum.apply(out, reduce, site), bias
    return hook


def _sum_input_gradient(reduce, site):
    def hook(module, args, kwargs):
        return (_BackwardSum.apply(args[0], reduce, site), *args[1:]), kwargs
    return hook


def _count_lookup(reduce):
    def hook(module, inputs, output):
        reduce.count(output.numel() * output.element_size())
    return hook


def build_tp_channel(args, model: torch.nn.Module, group, stats) -> Optional[TensorParallelReduce]:
    """The tp channel of `model` (the unwrapped GPTModel), or None at tp 1."""
    if args.tp == 1:
        return None
    c = args.compression
    iters = args.training.train_iters

    def lowrank(on, rank, warm_up):
        return LowRankSum(rank, int(warm_up * iters)) if on else None

    reduce = TensorParallelReduce(
        group, stats, forward=lowrank(c.mp_acti_comp, c.mp_acti_comp_rank, c.mp_acti_comp_warm_up),
        backward=lowrank(c.mp_grad_comp, c.mp_grad_comp_rank, c.mp_grad_comp_warm_up),
        seed=c.comp_seed if c.comp_seed is not None else args.training.seed)
    for name, module in model.named_modules():
        if isinstance(module, RowParallelLinear) and not module.sequence_parallel:
            if not module.skip_bias_add:   # megatron-core adds the bias after its reduce
                raise ValueError(f"tp channel: {name} adds its bias before the tp sum")
            module.explicit_expert_comm = True   # megatron-core's forward reduce off
            module.register_forward_hook(_sum_forward_output(reduce, name))
        elif isinstance(module, ColumnParallelLinear) and module.allreduce_dgrad:
            # megatron-core's backward reduce off (neither the fused one nor copy_to's)
            module.allreduce_dgrad, module.disable_grad_reduce = False, True
            module.register_forward_pre_hook(_sum_input_gradient(reduce, name), with_kwargs=True)
        elif isinstance(module, VocabParallelEmbedding):
            module.register_forward_hook(_count_lookup(reduce))
    return reduce


def count_cross_entropy(reduce: Optional[TensorParallelReduce], labels: torch.Tensor) -> None:
    """vocab_parallel_cross_entropy's all-reduces: max, target logit and sum of exp, fp32."""
    if reduce is not None:
        reduce.count(3 * labels.numel() * 4)
