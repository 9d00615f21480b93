"""tests/gpu/launch.py on the CPU: which backend a GPU test's ranks get, and the guard that
turns gloo's CUDA refusals into a named error (checked with FakeTensorMode's CUDA tensors,
which the guard rejects before gloo could see them)."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from tests.distributed import run_distributed
from tests.gpu import launch


def _cuda(n=4):
    with FakeTensorMode():
        return torch.empty(n, device="cuda")


def test_backend_is_nccl_only_with_a_gpu_per_rank(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert (launch.backend_for(1), launch.backend_for(8)) == ("nccl", "gloo")
    assert launch.backend_flags(2) == {"distributed-backend": "gloo"}
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert launch.backend_for(8) == "nccl"


@pytest.mark.parametrize("op,coalescing,refused", [
    ("send", False, True), ("recv", False, True), ("batch_isend_irecv", False, True),
    ("all_reduce", True, True), ("all_reduce_coalesced", False, True),
    ("all_reduce", False, False), ("broadcast", False, False), ("all_gather", False, False),
])
def test_refusal_names_what_gloo_refuses_for_cuda(op, coalescing, refused):
    why = launch.refusal(op, [_cuda()], "gloo", coalescing)
    assert (why is not None) == refused
    assert launch.refusal(op, [torch.zeros(4)], "gloo", coalescing) is None   # host memory
    assert launch.refusal(op, [_cuda()], "nccl", coalescing) is None


def _guarded(rank, world):
    import torch.distributed as dist
    from megatron.core.distributed import param_and_grad_buffer
    launch.gloo_guard()
    out = {}
    x = torch.ones(3)
    dist.all_reduce(x)                                  # host tensors pass through
    with param_and_grad_buffer._coalescing_manager(dist.group.WORLD, async_ops=False):
        dist.all_reduce(x)
    out["host"] = x.tolist()
    for name, call in [
            ("send", lambda: dist.send(_cuda(), 0)),
            ("batch", lambda: dist.batch_isend_irecv([dist.P2POp(dist.isend, _cuda(), 0)])),
            ("coalesced", lambda: _coalesced(dist, param_and_grad_buffer))]:
        try:
            call()
            out[name] = None
        except launch.GlooRefuses as e:
            out[name] = str(e)
    return out


def _coalesced(dist, module):
    with module._coalescing_manager(dist.group.WORLD, async_ops=False):
        dist.all_reduce(_cuda())


def test_guard_raises_named_errors_in_a_gloo_rank():
    out = run_distributed(_guarded, 1, timeout=120)[0]
    assert out["host"] == [1.0, 1.0, 1.0]
    assert "send of a CUDA tensor on a gloo group" in out["send"]
    assert "batch_isend_irecv of a CUDA tensor" in out["batch"]
    assert "coalesced all-reduce of CUDA tensors" in out["coalesced"]
