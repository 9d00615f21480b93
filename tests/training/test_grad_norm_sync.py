"""The grad norm behind --clip-grad reads no per-parameter value to the host.

Without Transformer Engine or apex, megatron-core's clip_grad_norm uses
megatron.core.utils.local_multi_tensor_l2_norm, which builds a host tensor from every
parameter's norm (a device-to-host read per parameter per step on a GPU). cpu_shim installs
batched_l2_norm in its place on every device. Checked here: the same value, bit for bit, on the
CPU; no data-dependent read under FakeTensorMode with CUDA tensors (which raises on any), where
the fallback it replaces does read.
"""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from megatron.training.runtime import cpu_shim


def _grads(seed, n=30):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(int(torch.randint(1, 3000, (1,), generator=g)), generator=g)
            * (1 + 10 * seed) for _ in range(n)]


def test_megatron_core_uses_the_batched_norm():
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads
    cpu_shim.apply()
    have_kernel = clip_grads.multi_tensor_applier is not utils.local_multi_tensor_applier
    if have_kernel:
        pytest.skip("Transformer Engine or apex provides megatron-core's l2 norm kernel")
    assert clip_grads.l2_norm_impl is cpu_shim.batched_l2_norm


@pytest.mark.parametrize("seed", range(5))
def test_batched_norm_is_bit_identical_to_the_fallback(seed):
    from megatron.core.utils import local_multi_tensor_l2_norm
    cpu_shim.apply()   # the fallback's own device="cuda" output maps to the CPU
    grads = _grads(seed)
    ref, _ = local_multi_tensor_l2_norm(2048 * 32, None, [grads], False)
    out, _ = cpu_shim.batched_l2_norm(2048 * 32, None, [grads], False)
    assert out.shape == ref.shape == (1,) and out.dtype == ref.dtype == torch.float32
    assert torch.equal(out, ref), (out, ref)


class _HostReads(TorchDispatchMode):
    """Counts aten._local_scalar_dense: the op behind .item(), float(t), torch.tensor([t])."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))


def test_batched_norm_reads_nothing_to_the_host():
    from megatron.core.utils import local_multi_tensor_l2_norm
    cpu_shim.apply()
    grads = _grads(0)
    with _HostReads() as fallback:
        local_multi_tensor_l2_norm(2048 * 32, None, [grads], False)
    with _HostReads() as batched:
        cpu_shim.batched_l2_norm(2048 * 32, None, [grads], False)
    # on the CPU torch.tensor([norms]) reads the 0-d tensors without dispatching, so only the
    # fallback's float(total) shows; on a GPU each norm is a read (see the fake-CUDA test)
    assert fallback.count >= 1
    assert batched.count == 0


def test_batched_norm_stays_on_a_cuda_device():
    with FakeTensorMode():   # fake CUDA tensors on the CPU; raises on a data-dependent read
        grads = [torch.empty(100, device="cuda"), torch.empty(7, 3, device="cuda")]
        out, _ = cpu_shim.batched_l2_norm(2048 * 32, None, [grads], False)
        assert out.device.type == "cuda" and out.shape == (1,)
        # the fallback cannot run without reading each CUDA norm's value on the host
        from megatron.core.utils import local_multi_tensor_l2_norm
        with pytest.raises(Exception):
            local_multi_tensor_l2_norm(2048 * 32, None, [grads], False)
