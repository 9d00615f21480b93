"""The CPU shim patches exactly what megatron-core (0.16.1, 0.19) needs; fail loudly if that changes."""
import importlib
import inspect

import pytest
import torch

from megatron.training.runtime import cpu_shim

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the shim is for CPU-only torch")


@pytest.mark.parametrize("owner,attr", cpu_shim.PATCHED, ids=[a for _, a in cpu_shim.PATCHED])
def test_patched_attributes_exist_upstream(owner, attr):
    module = importlib.import_module(owner) if isinstance(owner, str) else owner
    assert hasattr(module, attr), f"{owner}.{attr} is gone: revisit megatron/training/runtime/cpu_shim.py"


@pytest.mark.parametrize("name", cpu_shim.DEVICE_LITERAL_MODULES)
def test_modules_still_use_cuda_literals_through_module_torch(name):
    source = inspect.getsource(importlib.import_module(name))
    assert 'device="cuda"' in source or "device='cuda'" in source, (
        f"{name} no longer creates tensors with a literal CUDA device; drop it from the shim")
    assert "import torch" in source


def test_applied_shim_runs_megatron_cpu_paths():
    cpu_shim.apply()
    from megatron.core.fusions import fused_softmax
    from megatron.core.optimizer import clip_grads
    from megatron.core.tensor_parallel import random as tp_random

    mask = fused_softmax.get_default_causal_mask(4)
    assert mask.device.type == "cpu" and mask.dtype == torch.bool
    assert mask.tolist()[0] == [False, True, True, True]

    # The RNG tracker forks the CPU generator: a draw inside fork() comes from its own stream
    # and leaves the default stream untouched.
    tracker = tp_random.get_cuda_rng_tracker()
    tracker.reset()
    tracker.add("shim-test", 7)
    torch.manual_seed(0)
    outside = torch.rand(3)
    torch.manual_seed(0)
    with tracker.fork("shim-test"):
        inside = torch.rand(3)
    after = torch.rand(3)
    assert torch.equal(after, outside)
    assert torch.equal(inside, torch.rand(3, generator=torch.Generator().manual_seed(7)))

    p = torch.nn.Parameter(torch.ones(4))
    p.grad = torch.full((4,), 2.0)
    clip_grads.clip_grad_by_total_norm_fp32([p], max_norm=1.0, total_norm=4.0)
    assert torch.allclose(p.grad, torch.full((4,), 0.5), atol=1e-6)
    assert torch.zeros(1).cuda().device.type == "cpu"
    torch.cuda.current_stream().wait_event(None)   # 0.19's start_grad_sync
