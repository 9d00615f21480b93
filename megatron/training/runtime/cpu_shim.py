"""The one place where megatron-core (0.16.1, 0.19) is made to run without CUDA.

megatron-core assumes a CUDA device in a few spots even when every tensor is on the CPU (the
tensor-parallel RNG tracker's generator state, buffers on `torch.cuda.current_device()`,
`torch.cuda.synchronize()` / `current_stream()`, the unfused softmax's causal mask, the
distributed optimizer's `torch.cuda.*Tensor` check). `apply()` redirects exactly those calls to
their CPU meaning and is a no-op when CUDA is present. One patch applies on GPUs too
(batch_grad_norm: megatron-core's grad-norm fallback without Transformer Engine or apex reads
every norm to the host). tests/training/test_cpu_shim.py fails if an upgrade changes a target.
"""
import contextlib
import functools
import importlib
import logging
import types

import torch

_applied = False

# Modules that create tensors with a literal device="cuda" (optimizer scale/found-inf buffers,
# grad-norm accumulators, schedules' token counter, default causal masks). Each gets a `torch`
# whose factory functions map a CUDA device to the CPU; all else is the real torch.
DEVICE_LITERAL_MODULES = [
    "megatron.core.optimizer.optimizer",
    "megatron.core.optimizer.clip_grads",
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.transformer.utils",
    "megatron.core.utils",
]
_FACTORIES = ("tensor", "zeros", "ones", "empty", "full", "arange", "zeros_like", "ones_like")

# (object, attribute) pairs this module replaces; the test checks each still exists upstream.
PATCHED = [
    (torch.cuda, "current_device"),
    (torch.cuda, "synchronize"),
    (torch.cuda, "current_stream"),
    (torch.cuda, "get_rng_state"),
    (torch.cuda, "set_rng_state"),
    (torch.cuda, "manual_seed"),
    (torch.cuda, "manual_seed_all"),
    (torch.Tensor, "cuda"),
    ("megatron.core.tensor_parallel.random", "_get_cuda_rng_state"),
    ("megatron.core.tensor_parallel.random", "_set_cuda_rng_state"),
    ("megatron.core.fusions.fused_softmax", "get_default_causal_mask"),
    ("megatron.core.optimizer.clip_grads", "clip_grad_by_total_norm_fp32"),
    ("megatron.core.optimizer.optimizer", "clip_grad_by_total_norm_fp32"),
    ("megatron.core.optimizer.clip_grads", "l2_norm_impl"),
    ("megatron.core.optimizer.distrib_optimizer", "DistributedOptimizer"),   # its __init__
]


def needed() -> bool:
    return not torch.cuda.is_available()


def _cpu_device():
    return torch.device("cpu")


class _NoStream:
    """The CPU's "current stream": work is already done when a call returns.
    megatron-core 0.19's start_grad_sync asks for it to wait on CUDA-graph events."""

    def wait_event(self, event):
        pass

    def wait_stream(self, stream):
        pass

    def synchronize(self):
        pass


def _get_rng_state(device="cuda", clone=False, graph_safe=False):
    state = torch.get_rng_state()
    return state.clone() if clone else state


def _set_rng_state(new_state, device=-1, graph_safe=False):
    torch.set_rng_state(new_state)


def _causal_mask(sq: int) -> torch.Tensor:
    return torch.triu(torch.ones(sq, sq, dtype=torch.bool), diagonal=1)


def _is_cuda(device) -> bool:
    return device is not None and str(device).startswith("cuda")


def _on_cpu(factory):
    @functools.wraps(factory)
    def wrapper(*args, device=None, **kwargs):
        return factory(*args, device="cpu" if _is_cuda(device) else device, **kwargs)
    return wrapper


class _TorchOnCpu(types.ModuleType):
    """`torch`, except that tensor factories asked for device "cuda" allocate on the CPU."""

    def __init__(self):
        super().__init__("torch")
        for name in _FACTORIES:
            setattr(self, name, _on_cpu(getattr(torch, name)))

    def __getattr__(self, name):
        return getattr(torch, name)


_CPU_TO_CUDA_TYPE = {f"torch.{t}Tensor": f"torch.cuda.{t}Tensor"
                     for t in ("Float", "Half", "BFloat16")}


@contextlib.contextmanager
def _cpu_tensors_typed_cuda():
    """`tensor.type()` (no argument) of a CPU tensor names its CUDA type. Scoped to the
    DistributedOptimizer's constructor, whose one use of it is to sort parameters by dtype
    (fp32 / 16-bit) and to refuse anything that is not on a GPU."""
    real = torch.Tensor.type

    def typed(self, dtype=None, non_blocking=False, **kwargs):
        if dtype is None and not kwargs:
            name = real(self)
            return _CPU_TO_CUDA_TYPE.get(name, name)
        return real(self, dtype, non_blocking, **kwargs)

    torch.Tensor.type = typed
    try:
        yield
    finally:
        torch.Tensor.type = real


def _typed_cuda(init):
    @functools.wraps(init)
    def wrapper(*args, **kwargs):
        with _cpu_tensors_typed_cuda():
            return init(*args, **kwargs)
    return wrapper


def _clip_grad_by_total_norm_fp32(parameters, max_norm, total_norm, use_decoupled_grad=False):
    """megatron-core's version asserts grads are torch.cuda.FloatTensor; same math on CPU."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    attr = "decoupled_grad" if use_decoupled_grad else "grad"
    grads = [getattr(p, attr).detach() for p in parameters if getattr(p, attr, None) is not None]
    clip_coeff = max_norm / (total_norm + 1.0e-6)
    if clip_coeff < 1.0:
        torch._foreach_mul_(grads, clip_coeff)


def batched_l2_norm(chunk_size, noop_flag, tensor_lists, per_tensor, *args):
    """megatron.core.utils.local_multi_tensor_l2_norm without its host reads.

    The fallback (clip_grad_norm without Transformer Engine or apex) reads every parameter's
    norm to the host; here the norms stay on the device, with the same float32 result.
    """
    tensors = [t for tensor_list in tensor_lists for t in tensor_list]
    norms = torch._foreach_norm(tensors)   # one per tensor, on their device
    return torch.linalg.vector_norm(torch.stack([n.float() for n in norms])).reshape(1), None


def batch_grad_norm() -> None:
    """Swap megatron-core's grad-norm fallback for batched_l2_norm (CPU and GPU alike); a
    Transformer Engine or apex kernel, when megatron-core found one, stays."""
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads
    if clip_grads.l2_norm_impl is utils.local_multi_tensor_l2_norm:
        clip_grads.l2_norm_impl = batched_l2_norm


class _ExpectedOnCpu(logging.Filter):
    """The tracker warns when the CPU generator moves inside fork(); on CPU that is the point."""

    def filter(self, record):
        return "CPU RNG state changed within GPU RNG context" not in record.getMessage()


def apply() -> None:
    """Patch the CUDA-only calls megatron-core makes, if (and only if) CUDA is absent (and the
    grad-norm fallback everywhere)."""
    global _applied
    if _applied:
        return
    batch_grad_norm()
    if not needed():
        _applied = True
        return
    from megatron.core.fusions import fused_softmax
    from megatron.core.tensor_parallel import random as tp_random

    # "The CUDA generator" of the RNG tracker becomes the CPU generator, which is what CPU
    # dropout draws from; fork() then swaps CPU states exactly as it swaps CUDA ones on GPUs.
    torch.cuda.current_device = _cpu_device
    # e.g. LanguageModule moves the tied output weight with .cuda() before its first all-reduce
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_stream = lambda *a, **k: _NoStream()
    torch.cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
    torch.cuda.set_rng_state = lambda state, device="cuda": torch.set_rng_state(state)
    # The tracker seeds "CUDA", snapshots, then restores the previous state; on CPU the same
    # dance runs on the CPU generator. The driver re-seeds the CPU generator afterwards.
    # (torch.manual_seed itself calls torch.cuda.manual_seed_all: that one must do nothing.)
    torch.cuda.manual_seed = lambda seed: torch.default_generator.manual_seed(int(seed))
    torch.cuda.manual_seed_all = lambda seed: None
    tp_random._get_cuda_rng_state = _get_rng_state
    tp_random._set_cuda_rng_state = _set_rng_state
    logging.getLogger(tp_random.__name__).addFilter(_ExpectedOnCpu())
    # The unfused softmax builds its causal mask with device="cuda".
    fused_softmax.get_default_causal_mask = _causal_mask
    cpu_torch = _TorchOnCpu()
    for name in DEVICE_LITERAL_MODULES:
        importlib.import_module(name).torch = cpu_torch
    from megatron.core.optimizer import clip_grads, optimizer
    clip_grads.clip_grad_by_total_norm_fp32 = _clip_grad_by_total_norm_fp32
    optimizer.clip_grad_by_total_norm_fp32 = _clip_grad_by_total_norm_fp32
    # --use-distributed-optimizer: its shards of CPU parameters are plain views and clones
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    DistributedOptimizer.__init__ = _typed_cuda(DistributedOptimizer.__init__)
    _applied = True
