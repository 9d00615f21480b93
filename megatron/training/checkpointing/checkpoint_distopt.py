"""The distributed optimizer's Adam state in the checkpoint's by-name form.

megatron-core's DistributedOptimizer keeps on each dp rank the fp32 main weights and Adam
moments of a 1/dp slice of every gradient bucket. Here it is stored as the other optimizers'
is, {global parameter name: {"step", "exp_avg", "exp_avg_sq"[, "main_param"]}}, each tensor
whole, so the file does not depend on the dp size. Saving gathers each bucket's slices on dp
rank 0 (collective); loading needs no communication: each rank keeps its own slice.
"""
from typing import Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist

from megatron.training.runtime.compat import optimizer_parts

# Adam's per-element state; the DistributedOptimizer supports Adam only (its constructor
# asserts it), and the fp32 main weight rides along for 16-bit parameters
MOMENTS = ("exp_avg", "exp_avg_sq")


def distributed_optimizers(optimizer) -> List:
    """The DistributedOptimizers among `optimizer` (a ChainedOptimizer's parts, or itself)."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    parts = optimizer_parts(optimizer)
    return [o for o in parts if isinstance(o, DistributedOptimizer)]


def _buckets(o) -> Iterator[Tuple[object, object, dict]]:
    """(buffer, bucket, this rank's range map of the bucket) of every gradient bucket."""
    for buffer, by_dtype in zip(o.buffers, o.gbuf_ranges):
        for bucket_maps in by_dtype.values():
            for bucket, range_map in zip(buffer.buckets, bucket_maps):
                yield buffer, bucket, range_map


def _main_param(o, model_param) -> torch.Tensor:
    """The fp32 shard (main weight) the inner torch optimizer steps for `model_param`."""
    group_index, group_order = o.model_param_group_index_map[model_param]
    return o.optimizer.param_groups[group_index]["params"][group_order]


def _keys(buffer) -> Tuple[str, ...]:
    sixteen_bit = buffer.param_dtype != torch.float32
    return (("main_param",) if sixteen_bit else ()) + MOMENTS


def _comm_device(group) -> torch.device:
    """NCCL gathers device tensors; gloo (the CPU, or --distributed-backend gloo) host ones."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _check_plain(o) -> None:
    if o.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8:
        raise NotImplementedError(
            "--use-distributed-optimizer with a precision-aware optimizer keeps its state inside "
            "the fused optimizer, which checkpoints do not read; drop the precision-aware option")


def _step(o) -> Optional[float]:
    """Adam's step count (the same for every parameter), None before the first step."""
    for s in o.optimizer.state.values():
        if "step" in s:
            return float(s["step"])
    for g in o.optimizer.param_groups:   # Transformer Engine's / apex's fused Adam
        if "step" in g and g["params"] and o.optimizer.state:
            return float(g["step"])
    return None


def gather_state(optimizer, names: Dict[int, str]) -> Optional[Dict[str, dict]]:
    """Collective over each DistributedOptimizer's dp group. dp rank 0 gets the by-name state
    ({} before the first step: Adam has no state yet); the other dp ranks get None."""
    out: Dict[str, dict] = {}
    root = True
    for o in distributed_optimizers(optimizer):
        _check_plain(o)
        group = o.data_parallel_group
        dp, rank = group.size(), group.rank()
        root = rank == 0
        device = _comm_device(group)
        mine = _step(o)   # sent as -1 while this rank has no state yet
        step = torch.tensor([-1.0 if mine is None else mine], dtype=torch.float64, device=device)
        all_steps = [torch.empty_like(step) for _ in range(dp)] if root else None
        dist.gather(step, all_steps, dst=dist.get_global_rank(group, 0), group=group)
        if root and min(float(s) for s in all_steps) < 0:
            step_value = None   # some rank never stepped: nothing to save (as without dist-opt)
        else:
            step_value = float(all_steps[0]) if root else None
        for buffer, bucket, range_map in _buckets(o):
            keys = _keys(buffer)
            width = bucket.grad_data.numel() // dp   # each dp rank's slice of the bucket
            local = torch.zeros((len(keys), width), dtype=torch.float32, device=device)
            for model_param, ranges in range_map["param_map"].items():
                main = _main_param(o, model_param)
                state = o.optimizer.state.get(main, {})
                r = ranges["gbuf_local"]
                for i, k in enumerate(keys):
                    value = main if k == "main_param" else state.get(k)
                    if value is not None:
                        local[i, r.start:r.end] = value.detach().view(-1)
            pieces = [torch.empty_like(local) for _ in range(dp)] if root else None
            dist.gather(local, pieces, dst=dist.get_global_rank(group, 0), group=group)
            if not root or step_value is None:
                continue
            whole = torch.cat(pieces, dim=1).cpu()   # the bucket's positions, padding included
            for p in bucket.params_list:
                # the buffer's index (bucket.param_to_index leaves out the 64-element
                # alignment padding the distributed optimizer puts between parameters)
                start, end, _ = buffer.param_index_map[p]
                start, end = start - bucket.offset, end - bucket.offset
                entry = {"step": torch.tensor(step_value, dtype=torch.float32)}
                for i, k in enumerate(keys):
                    entry[k] = whole[i, start:end].view(p.shape).clone()
                out[names[id(p)]] = entry
    return out if root else None


def load_state(optimizer, names: Dict[int, str], state: Dict[str, dict]) -> None:
    """This rank's slice of the by-name `state` into each DistributedOptimizer (no collective).
    A parameter absent from `state` keeps a fresh Adam state; a 16-bit parameter given no
    "main_param" (e.g. saved by an fp32 run) keeps the main weight rebuilt from the model."""
    for o in distributed_optimizers(optimizer):
        _check_plain(o)
        for _, _, range_map in _buckets(o):
            for model_param, ranges in range_map["param_map"].items():
                saved = state.get(names[id(model_param)])
                if saved is None:
                    continue
                missing = [k for k in ("step",) + MOMENTS if k not in saved]
                if missing:
                    raise ValueError(
                        f"the optimizer state of {names[id(model_param)]} has no {missing} "
                        f"(saved by another optimizer than Adam?); --use-distributed-optimizer "
                        f"runs Adam: resume with --no-load-optim, or without the flag")
                main = _main_param(o, model_param)
                r = ranges["param"]   # this rank's slice of the flattened parameter

                def piece(k):
                    return saved[k].reshape(-1)[r.start:r.end].to(main.device, main.dtype)

                if "main_param" in saved and model_param.dtype != torch.float32:
                    with torch.no_grad():
                        main.copy_(piece("main_param"))
                step = torch.as_tensor(saved["step"], dtype=torch.float32).clone()
                group = o.optimizer.param_groups[o.model_param_group_index_map[model_param][0]]
                if "step" in group:   # fused Adam counts per group
                    group["step"] = int(step)
                if group.get("capturable") or group.get("fused"):
                    step = step.to(main.device)   # else on the host, as torch's Adam keeps it
                o.optimizer.state[main] = {"step": step, **{k: piece(k).clone() for k in MOMENTS}}
