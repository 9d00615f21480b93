"""The fake GPU itself: each emulation does what it stands for, and fails loudly when a torch
or megatron-core upgrade moves what fake_gpu.py patches (STYLE: every monkeypatch has a test
that breaks with the upgrade)."""
import pytest
import torch
import torch.distributed as dist

from tests.fake_cuda.fake_gpu import (FakeGroup, GlooRefuses, HostSync, NcclRefuses, UNSHIMMED,
                                      python_backward)


def test_host_reads_of_cuda_values_raise_in_strict_blocks(gpu):
    x = torch.randn(4, 3).to(gpu.device)
    for read in (lambda: x.sum().item(), lambda: bool((x > 0).any()), lambda: x.tolist(),
                 lambda: x.cpu(), lambda: x[x > 0], lambda: int(x.argmax())):
        with pytest.raises(HostSync), gpu.strict():
            read()
    n = len(gpu.events)
    x.sum().item()   # outside: recorded, answered with 0
    assert gpu.syncs(since=n)[0].kind == "read"
    with gpu.strict():   # host metadata stays real and readable
        assert torch.arange(3).tolist() == [0, 1, 2]
        pinned = torch.empty(4, 3, pin_memory=True)
        pinned.copy_(x, non_blocking=True)   # an asynchronous copy down: no sync
    assert pinned.is_pinned()


def test_a_cpu_tensor_meeting_a_cuda_one_raises(gpu):
    scores = torch.randn(2, 4, 4).to(gpu.device)
    mask = torch.ones(4, 4, dtype=torch.bool).triu(1)         # made on the CPU
    with pytest.raises(RuntimeError, match="same device"):
        scores.masked_fill(mask, float("-inf"))
    scores.masked_fill(mask.to(gpu.device), float("-inf"))     # on the device: fine
    lin = torch.nn.Linear(4, 4)                                # a module not moved
    with pytest.raises(RuntimeError, match="same device"):
        lin(scores)


def test_gloo_refuses_cuda_in_p2p_and_coalesced_all_reduce(gpu):
    x, h = torch.ones(4).to(gpu.device), torch.ones(4)
    for send in (dist.isend, dist.irecv):
        with pytest.raises(GlooRefuses, match="unsupported device type cuda"):
            send(x, 1)
        send(h, 1).wait()
    with pytest.raises(GlooRefuses, match="allreduce_coalesced"):
        with dist.distributed_c10d._coalescing_manager(None):
            dist.all_reduce(x)
    dist.all_reduce(x)   # a plain all-reduce of a CUDA tensor gloo does take


def test_megatron_ddp_still_coalesces(gpu, tiny_corpus):
    """megatron DDP's own grad sync is what gloo refuses with CUDA buffers (the reason
    sync.coalescing_refused exists): if an upgrade stops coalescing, revisit it."""
    from tests.conftest import tiny_gpt_argv
    from tests.fake_cuda.test_training_step import SMALL, build_trainer
    trainer = build_trainer(gpu, tiny_gpt_argv(tiny_corpus, **SMALL))
    with pytest.raises(GlooRefuses, match="allreduce_coalesced"):
        trainer.model.finish_grad_sync()


def test_nccl_refuses_cpu_tensors_and_another_gpu(fake_gpu):
    with fake_gpu(backend="nccl", device_count=2) as gpu:
        dist.all_reduce(torch.ones(2).to(gpu.device))
        with pytest.raises(NcclRefuses, match="device type cpu"):
            dist.all_reduce(torch.ones(2))
        with pytest.raises(NcclRefuses, match="communicator is on cuda:0"):
            dist.all_reduce(torch.ones(2).to(torch.device("cuda", 1)))
        with pytest.raises(NcclRefuses, match="device type cpu"):
            dist.broadcast(torch.ones(2), src=0, group=FakeGroup(2, backend="nccl"))


def test_nccl_refuses_two_ranks_on_one_gpu(fake_gpu, tiny_corpus):
    """Two local ranks, one GPU: initialize_distributed refuses --distributed-backend nccl
    with a ConfigError naming the fix, before NCCL would ("Duplicate GPU detected")."""
    from megatron.training.flags.arguments import parse_args
    from megatron.training.config.config_flags import ConfigError
    from megatron.training.runtime.initialize import initialize_distributed
    from tests.conftest import tiny_gpt_argv
    with pytest.raises(NcclRefuses, match="Duplicate GPU"):
        with fake_gpu(backend="nccl", local_world_size=2):
            pass
    with fake_gpu(backend="gloo", local_world_size=2, local_rank=1):
        args = parse_args(tiny_gpt_argv(tiny_corpus, **{"distributed-backend": "nccl"}),
                          world_size=1)
        with pytest.raises(ConfigError, match="--distributed-backend gloo"):
            initialize_distributed(args)


def test_python_backward_equals_autograd():
    """The emulated engine against the real one (on real CPU tensors): broadcasting, a custom
    Function, a parameter used twice, a non-scalar root with its gradient."""
    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g

    def run(backward):
        torch.manual_seed(0)
        w = torch.randn(3, 4, requires_grad=True)
        b = torch.randn(4, requires_grad=True)
        x = torch.randn(5, 3)
        y = Square.apply(x @ w + b) + (x @ w).tanh()
        g = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
        backward(y, g)
        return w.grad, b.grad

    want = run(lambda y, g: torch.autograd.backward(y, g))
    have = run(lambda y, g: python_backward(y, g))
    assert all(torch.allclose(a, b, rtol=1e-6, atol=1e-6) for a, b in zip(want, have))


def test_unshimmed_megatron_was_captured_before_the_shim():
    """The CPU shim replaces megatron-core attributes; the fake GPU restores what it captured
    at import. The capture must hold upstream objects, not the shim's."""
    from megatron.training.runtime import cpu_shim
    for (owner, attr), value in UNSHIMMED.items():
        assert getattr(value, "__module__", None) != cpu_shim.__name__, (owner, attr)


def test_patched_upstream_names_exist():
    """What fake_gpu.py reaches into; an upgrade that moves one fails here by name."""
    from megatron.cc.common import background
    from megatron.core.distributed import param_and_grad_buffer
    from megatron.core.distributed.distributed_data_parallel import DistributedDataParallel
    from megatron.core.tensor_parallel import random as tp_random
    assert hasattr(param_and_grad_buffer, "_coalescing_manager")
    assert hasattr(DistributedDataParallel, "_make_backward_post_hook")
    assert hasattr(tp_random, "_get_cuda_rng_state") and hasattr(tp_random, "_set_cuda_rng_state")
    assert hasattr(background, "threading")
    assert hasattr(torch.autograd.graph.Node, "_input_metadata") or \
        hasattr(torch.ones(1, requires_grad=True).sum().grad_fn, "_input_metadata")
