"""This rank's device and moving micro-batches onto it.

Device index = LOCAL_RANK modulo the visible devices: one rank per GPU on a normal node, and
several ranks on one GPU when a job starts more ranks than there are GPUs (possible with gloo
only; NCCL refuses two ranks on one GPU, see check_backend).
"""
import os
from typing import Dict

import torch

from megatron.training.config_flags import ConfigError


def rank_device() -> torch.device:
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())


def check_backend(backend: str) -> None:
    """Refuse NCCL with more local ranks than GPUs before NCCL fails mid-collective."""
    if backend != "nccl" or not torch.cuda.is_available():
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
