"""How the GPU tests start their ranks: NCCL where every rank has a GPU of its own, gloo (with
its CUDA restrictions enforced) where ranks must share one.

    results = run_ranks(worker, world, args, timeout)     # worker(rank, world, *args)
    argv = tiny_gpt_argv(corpus, **backend_flags(world))  # the flag naming that backend

NCCL is how users train, so a run whose ranks each get a GPU uses it; the device machine has one
GPU, where that means world size 1. NCCL refuses two ranks on one GPU, so the multi-rank layouts
((2,2,2) on one GPU) run on gloo, which takes CUDA tensors in all-reduce, broadcast and
all-gather but refuses them in send/recv (it crashes: "writev ... Bad address") and in a
coalesced all-reduce ("unsupported device type cuda"). The training code must stage the former
(megatron.cc.common.transport) and split the latter (megatron.cc.grad_sync.sync.coalescing_refused);
the fake-CUDA tier (tests/fake_cuda) proves it on every CPU run, and `gloo_guard` turns a
regression on the GPU into a named error in the rank that made it instead of a crash or hang.
"""
import contextlib
import inspect
import os
import threading

import torch

from tests.distributed import free_port, run_distributed


def backend_for(world: int) -> str:
    return "nccl" if 0 < world <= torch.cuda.device_count() else "gloo"


def backend_flags(world: int) -> dict:
    return {"distributed-backend": backend_for(world)}


class GlooRefuses(RuntimeError):
    """A collective that gloo refuses for CUDA tensors was called with one."""


def refusal(op: str, tensors, backend: str, coalescing: bool = False):
    """Why gloo would refuse `op` on these tensors (None: it takes them)."""
    if backend != "gloo" or not any(t.is_cuda for t in tensors):
        return None
    if op in ("send", "recv", "isend", "irecv", "batch_isend_irecv"):
        return (f"{op} of a CUDA tensor on a gloo group: gloo moves host memory only (stage "
                f"through pinned host buffers, megatron.cc.common.transport.P2PTransport)")
    if op == "all_reduce_coalesced" or (op == "all_reduce" and coalescing):
        return ("a coalesced all-reduce of CUDA tensors on a gloo group: gloo's "
                "allreduce_coalesced refuses them (all-reduce each bucket, "
                "megatron.cc.grad_sync.sync.coalescing_refused)")
    return None


def gloo_guard() -> None:
    """In this rank: raise GlooRefuses where gloo would refuse (or crash on) a CUDA tensor."""
    import torch.distributed as dist
    from megatron.core.distributed import param_and_grad_buffer
    state = threading.local()   # inside a _coalescing_manager block on a gloo group

    def guard(op, fn):
        sig = inspect.signature(fn)

        def guarded(*args, **kwargs):
            bound = sig.bind(*args, **kwargs).arguments
            if op == "batch_isend_irecv":
                pairs = [(p.tensor, p.group) for p in bound["p2p_op_list"]]
            else:
                pairs = [(bound["tensor"], bound.get("group"))]
            for tensor, group in pairs:
                why = refusal(op, [tensor], dist.get_backend(group),
                              getattr(state, "coalescing", False))
                if why:
                    raise GlooRefuses(why)
            return fn(*args, **kwargs)
        return guarded

    manager = dist._coalescing_manager

    @contextlib.contextmanager
    def guarded_manager(group=None, *args, **kwargs):
        outer = getattr(state, "coalescing", False)
        state.coalescing = dist.get_backend(group) == "gloo"
        try:
            with manager(group, *args, **kwargs) as cm:
                yield cm
        finally:
            state.coalescing = outer

    for op in ("send", "recv", "all_reduce", "batch_isend_irecv"):
        setattr(dist, op, guard(op, getattr(dist, op)))
    dist._coalescing_manager = param_and_grad_buffer._coalescing_manager = guarded_manager


def _nccl_rank(rank, world, port, worker, args):
    import torch.distributed as dist
    dist.destroy_process_group()   # tests.distributed starts every rank on gloo
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    return worker(rank, world, *args)


def _gloo_rank(rank, world, worker, args):
    gloo_guard()
    return worker(rank, world, *args)


def run_ranks(worker, world: int, args=(), timeout: int = 600):
    """tests.distributed.run_distributed on the backend of backend_for(world)."""
    if backend_for(world) == "nccl":
        return run_distributed(_nccl_rank, world, (free_port(), worker, args), timeout)
    return run_distributed(_gloo_rank, world, (worker, args), timeout)
