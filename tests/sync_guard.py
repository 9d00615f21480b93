"""Fail on device-to-host synchronisation inside a block of code.

On CUDA, `torch.cuda.set_sync_debug_mode("error")` makes every synchronising call raise.
On the CPU nothing ever waits, so the same mistakes are caught by what they are made of:
a TorchDispatchMode rejects the ops that need a value or a size from the device (item(),
bool()/int()/float() of a tensor, boolean-mask indexing, nonzero, masked_select, unique,
index assignment of a scalar, which CUDA copies up from pageable memory), and
`tolist()` of a non-integer tensor is rejected too (it bypasses the dispatcher). Integer
`tolist()` stays allowed: sample ids and cache slots are host metadata, never on the device.
"""
import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
_SYNCING = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
            aten._unique2.default, aten.unique_consecutive.default, aten.unique_dim.default,
            aten.repeat_interleave.Tensor}


class HostSync(AssertionError):
    """Code under `no_host_sync()` read a value or a size off the device."""


def _bool_index(args) -> bool:
    for a in args:
        if isinstance(a, (list, tuple)):
            if _bool_index(a):
                return True
        elif torch.is_tensor(a) and a.dtype == torch.bool:
            return True
    return False


class _Guard(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SYNCING:
            raise HostSync(f"{func} needs a value from the device (a host sync)")
        if func in (aten.index.Tensor, aten.index_put_.default, aten.index_put.default) \
                and _bool_index(args[1:2]):
            raise HostSync(f"{func} with a boolean mask needs the mask's count (a host sync)")
        if func in (aten.index_put_.default, aten.index_put.default) and args[2].dim() == 0:
            # `x[idx] = 1`: on CUDA the scalar is copied up from pageable host memory, which
            # sync debug mode reports (seen on an H200); index_fill_ passes it as an argument
            raise HostSync(f"{func} with a scalar value copies it from the host (a sync on "
                           f"CUDA): use index_fill_")
        return func(*args, **kwargs)


@contextlib.contextmanager
def no_host_sync(device="cpu"):
    """Raise HostSync (CPU) or RuntimeError (CUDA) on any host sync inside the block."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(0)
        return
    real_tolist = torch.Tensor.tolist

    def tolist(self):
        if self.is_floating_point() or self.dtype in (torch.bool, torch.uint8):
            raise HostSync(f"tolist() of a {self.dtype} tensor reads the device")
        return real_tolist(self)

    torch.Tensor.tolist = tolist
    try:
        with _Guard():
            yield
    finally:
        torch.Tensor.tolist = real_tolist
