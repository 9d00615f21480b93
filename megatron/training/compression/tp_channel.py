"""Route megatron-core's tensor-parallel all-reduces through the tp channel (megatron/cc/tensor_parallel/tp_reduce.py).

At tp > 1 the row-parallel layers' forward reduce (all-reduce, or reduce-scatter with
--sequence-parallel) and, without sequence parallelism, the column-parallel layers' backward
all-reduce are taken over: megatron-core's own is switched off on the module and ours runs
around it, the same collective unless --mp-acti-comp / --mp-grad-comp compress it. The
embedding's, cross entropy's and the sequence-parallel linears' own collectives are counted.
Which collective crosses where, and how it is counted: docs/embedding_and_tensor_parallel.md.
"""
from typing import Optional

import torch
from megatron.core.tensor_parallel.layers import (ColumnParallelLinear, RowParallelLinear,
                                                  VocabParallelEmbedding)

from megatron.core.models.common.embeddings.language_model_embedding import (
    LanguageModelEmbedding)

from megatron.cc.tensor_parallel.tp_reduce import LowRankSum, TensorParallelReduce, gathered_bytes


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


class _ForwardScatter(torch.autograd.Function):
    """Reduce-scatter along the sequence forward, all-gather backward (megatron's
    reduce_scatter_to_sequence_parallel_region)."""

    @staticmethod
    def forward(ctx, x, reduce: TensorParallelReduce, site: str):
        ctx.reduce = reduce
        return reduce.forward_scatter(x, site)

    @staticmethod
    def backward(ctx, grad):
        return ctx.reduce.backward_gather(grad), None, None


class _CountBackward(torch.autograd.Function):
    """Identity; its backward counts `nbytes` of megatron-core's backward collectives."""

    @staticmethod
    def forward(ctx, x, reduce: TensorParallelReduce, nbytes: int):
        ctx.reduce, ctx.nbytes = reduce, nbytes
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.reduce.stats.add("tp", ctx.nbytes, ctx.nbytes)
        return grad, None, None


def _scatter_forward_output(reduce, site):
    def hook(module, inputs, output):
        out, bias = output
        if not torch.is_grad_enabled():   # validation: exact, not counted
            return reduce.forward_scatter(out, site, training=False), bias
        return _ForwardScatter.apply(out, reduce, site), bias
    return hook


def _count_gathered_input(reduce, tp: int):
    """A sequence-parallel column-parallel layer: megatron-core all-gathers its input forward,
    and in backward gathers it again (for the weight gradient) and reduce-scatters the input
    gradient; the gathered tensor is tp times the rank's block."""
    def hook(module, args, kwargs):
        x = args[0]
        if not torch.is_grad_enabled():
            return None
        full = gathered_bytes(x.numel() * x.element_size() * tp)
        reduce.count(full)
        return (_CountBackward.apply(x, reduce, 2 * full), *args[1:]), kwargs
    return hook


def _count_embedding_gradient(reduce, tp: int):
    """The sequence-parallel embedding's output is the rank's block, scattered (or
    reduce-scattered) from the whole lookup: its gradient is all-gathered in backward."""
    def hook(module, inputs, output):
        if not torch.is_grad_enabled():
            return None
        return _CountBackward.apply(output, reduce,
                                    gathered_bytes(output.numel() * output.element_size() * tp))
    return hook


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


def _count_lookup(reduce, tp: int):
    def hook(module, inputs, output):
        if getattr(module, "reduce_scatter_embeddings", False):   # sequence parallel, rope
            reduce.count(gathered_bytes(output.numel() * output.element_size() * tp))
        else:
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
        if isinstance(module, RowParallelLinear):
            if not module.skip_bias_add:   # megatron-core adds the bias after its reduce
                raise ValueError(f"tp channel: {name} adds its bias before the tp sum")
            module.explicit_expert_comm = True   # megatron-core's forward reduce off
            module.register_forward_hook(_scatter_forward_output(reduce, name)
                                         if module.sequence_parallel else
                                         _sum_forward_output(reduce, name))
        elif isinstance(module, ColumnParallelLinear) and module.sequence_parallel:
            module.register_forward_pre_hook(_count_gathered_input(reduce, args.tp),
                                             with_kwargs=True)
        elif isinstance(module, ColumnParallelLinear) and module.allreduce_dgrad:
            # megatron-core's backward reduce off (neither the fused one nor copy_to's)
            module.allreduce_dgrad, module.disable_grad_reduce = False, True
            module.register_forward_pre_hook(_sum_input_gradient(reduce, name), with_kwargs=True)
        elif isinstance(module, VocabParallelEmbedding):
            module.register_forward_hook(_count_lookup(reduce, args.tp))
        elif isinstance(module, LanguageModelEmbedding) and module.config.sequence_parallel:
            module.register_forward_hook(_count_embedding_gradient(reduce, args.tp))
    return reduce


def sequence_parallel_params(model: torch.nn.Module):
    """Parameters whose gradients sum_grads adds up over the tp group (megatron-core marks
    them `sequence_parallel`; architecture.SequenceParallelNorm marks the torch norms)."""
    if not model.config.sequence_parallel:
        return []
    return [p for p in model.parameters()
            if p.requires_grad and getattr(p, "sequence_parallel", False)]


def sum_sequence_parallel_grads(reduce: Optional[TensorParallelReduce], params) -> None:
    """After the dp and emb channels, before the optimizer step (finalize_model_grads' order)."""
    if reduce is not None and params:
        reduce.sum_grads(p.main_grad for p in params)


def count_cross_entropy(reduce: Optional[TensorParallelReduce], labels: torch.Tensor) -> None:
    """vocab_parallel_cross_entropy's all-reduces: max, target logit and sum of exp, fp32."""
    if reduce is not None:
        reduce.count(3 * labels.numel() * 4)
