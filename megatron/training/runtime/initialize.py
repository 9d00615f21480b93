"""Process groups, seeds and the CPU shim: everything before the model exists."""
import datetime
import os
import random

import numpy as np
import torch
import torch.distributed as dist

from megatron.core import parallel_state as ps
from megatron.core import tensor_parallel
from megatron.training.runtime import cpu_shim
from megatron.training.runtime import rendezvous
from megatron.training.runtime.topology import Topology, check_backend, cuda_available, rank_device


def initialize_distributed(args) -> Topology:
    """torch.distributed + megatron-core's model-parallel groups + seeds; this rank's place."""
    cpu_shim.apply()
    backend = args.parallel.distributed_backend or ("nccl" if cuda_available() else "gloo")
    check_backend(backend)
    if cuda_available():
        torch.cuda.set_device(rank_device())  # LOCAL_RANK modulo the visible GPUs
    else:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if not dist.is_initialized():
        rendezvous.init_process_group(backend, group_timeout(args))
    if dist.get_world_size() != args.world_size:
        raise RuntimeError(f"WORLD_SIZE={args.world_size} but the process group has "
                           f"{dist.get_world_size()} ranks")
    ps.initialize_model_parallel(
        tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp,
        virtual_pipeline_model_parallel_size=args.vp if args.vp > 1 else None,
        distributed_timeout_minutes=args.parallel.distributed_timeout_minutes)
    set_seeds(args.training.seed)
    return Topology.from_parallel_state()


def group_timeout(args) -> datetime.timedelta:
    """--distributed-timeout-minutes, for every group we create (torch's default is 30 min)."""
    return datetime.timedelta(minutes=args.parallel.distributed_timeout_minutes)


def set_seeds(seed: int) -> None:
    """Same seed on every rank: weights are keyed by name (model.py), data by sample index.

    Dropout streams: the tensor-parallel tracker gives each TP rank its own stream inside
    TP regions, as in Megatron; elsewhere every rank draws from the seed.
    """
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)
    torch.manual_seed(seed)  # the tracker set the default generator; restore the data-parallel one


def destroy() -> None:
    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
