"""The one place that bridges API differences between the torch releases we support, so callers
use one name whatever is installed (megatron-core's: megatron/training/runtime/compat.py, since
megatron/cc never imports megatron-core)."""
import torch.distributed as dist


def all_gather_single(output, input, group=None, async_op=False):
    """Gather every rank's `input` into `output` (dim 0 concatenation).

    torch 2.13 renamed all_gather_into_tensor to all_gather_single and warns on the old name;
    looked up per call so that wrappers installed on torch.distributed (tests) see it.
    """
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(output, input, group=group, async_op=async_op)


def reduce_scatter_single(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
    """Sum `input` over ranks and keep this rank's dim-0 block in `output` (torch 2.13 renamed
    reduce_scatter_tensor to reduce_scatter_single)."""
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(output, input, op=op, group=group, async_op=async_op)

