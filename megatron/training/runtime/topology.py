"""Where this rank sits and on which device: built once after megatron-core's process groups
(`Topology.from_parallel_state`, the driver's one reader of parallel_state), then handed down.
With the CPU shim, the one module that asks torch.cuda whether there is a GPU."""
import os
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import torch
import torch.distributed as dist

from megatron.cc.grad_sync.groups import clone_groups
from megatron.training.config.config_flags import ConfigError


def cuda_available() -> bool:
    """The question before a topology exists (argument checks, the model config)."""
    return torch.cuda.is_available()


def rank_device() -> torch.device:
    """LOCAL_RANK modulo the visible GPUs: several ranks may share one GPU (gloo only)."""
    if not cuda_available():
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())


def check_backend(backend: str) -> None:
    """Refuse NCCL with more local ranks than GPUs before NCCL fails mid-collective."""
    if backend != "nccl" or not cuda_available():
        return
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if local > torch.cuda.device_count():
        raise ConfigError(f"{local} ranks on this node share {torch.cuda.device_count()} GPU(s); "
                          f"NCCL refuses two ranks on one GPU: pass --distributed-backend gloo "
                          f"(or start one rank per GPU)")


def to_device(batch: Dict[str, torch.Tensor], device: torch.device) -> Dict[str, torch.Tensor]:
    """Pinned host memory, then an asynchronous copy: the host does not wait for the GPU."""
    if device.type == "cpu":
        return batch
    return {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}


@dataclass(frozen=True)
class Topology:
    rank: int
    world_size: int
    tp_rank: int
    tp_size: int
    pp_rank: int                  # the pipeline stage
    pp_size: int
    is_first: bool                # stage 0: embeds the tokens (interleaved: in its chunk 0)
    is_last: bool                 # computes the loss (interleaved: in its last chunk)
    prev_rank: int                # global ranks of the previous and next stage (wrapping)
    next_rank: int
    dp_rank: int
    dp_size: int
    pp_ranks: Tuple[int, ...]     # global ranks of this rank's pipeline, stage by stage
    dp_ranks: Tuple[int, ...]     # global ranks of this rank's data-parallel group
    device: torch.device          # of the model, the micro-batches and the receive buffers
    backend: str = "gloo"         # the default group's
    tp_group: Any = None
    pp_group: Any = None
    dp_group: Any = None
    emb_group: Any = None         # the tied embedding's (first and last stage only)
    vp_size: int = 1              # model chunks on this rank (interleaved 1F1B when > 1)

    def chunk_is_first(self, chunk: int) -> bool:
        """Does model chunk `chunk` hold virtual stage 0 (the embedding)?"""
        return self.is_first and chunk == 0

    def chunk_is_last(self, chunk: int) -> bool:
        """Does model chunk `chunk` hold the last virtual stage (output layer and loss)?"""
        return self.is_last and chunk == self.vp_size - 1

    def channel_group(self, group, backend: Optional[str] = None, own: bool = False):
        """`group` (one of megatron-core's; None: the world) as a channel uses it: itself, or
        a copy over the same ranks when the channel runs on another backend (--pp-backend,
        --dp-backend) or needs a group no other thread uses (`own`: a background exchange).
        Copying is collective: every rank calls it, in the same order."""
        from megatron.training.runtime import transports
        if not own and not transports._differs(backend):
            return group
        return clone_groups(group or dist.group.WORLD, backend)

    @property
    def collective_device(self) -> torch.device:
        """Of a small operand (a flag, a count) of a collective on the default group."""
        return self.device if self.backend == "nccl" else torch.device("cpu")

    @classmethod
    def from_parallel_state(cls) -> "Topology":
        """After megatron-core's initialize_model_parallel (and torch.cuda.set_device)."""
        from megatron.core import parallel_state as ps
        pp_group, dp_group = ps.get_pipeline_model_parallel_group(), ps.get_data_parallel_group()
        first, last = ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()
        return cls(
            rank=dist.get_rank(), world_size=dist.get_world_size(),
            tp_rank=ps.get_tensor_model_parallel_rank(),
            tp_size=ps.get_tensor_model_parallel_world_size(),
            pp_rank=ps.get_pipeline_model_parallel_rank(),
            pp_size=ps.get_pipeline_model_parallel_world_size(), is_first=first, is_last=last,
            prev_rank=ps.get_pipeline_model_parallel_prev_rank(),
            next_rank=ps.get_pipeline_model_parallel_next_rank(),
            dp_rank=ps.get_data_parallel_rank(), dp_size=ps.get_data_parallel_world_size(),
            pp_ranks=tuple(dist.get_process_group_ranks(pp_group)),
            dp_ranks=tuple(dist.get_process_group_ranks(dp_group)),
            device=rank_device(), backend=dist.get_backend(),
            tp_group=ps.get_tensor_model_parallel_group(), pp_group=pp_group, dp_group=dp_group,
            emb_group=ps.get_embedding_group(check_initialized=False) if first or last else None,
            vp_size=ps.get_virtual_pipeline_model_parallel_world_size() or 1)
