"""Fake CUDA on a CPU-only machine: every patch the fake-CUDA tier makes lives in this module.

    with FakeGPU(backend="gloo") as gpu:       # torch.cuda "has" one GPU, cuda:0
        x = torch.ones(4).to(gpu.device)       # a FakeTensor on cuda:0 (metadata only)
        with gpu.strict():                     # any host read of a cuda value raises HostSync
            codec.encode(x, ctx)
        assert not gpu.syncs(kind="read")

What is faked, and how (all undone on exit, in reverse order):
- Tensors. CPU tensors stay *real* (host metadata such as sample ids, slots and the data
  pipeline computes with real values); anything placed on "cuda" becomes a FakeTensor of
  torch's FakeTensorMode (shape, dtype, device; no data). An op mixing a cuda tensor with a
  non-scalar CPU tensor raises torch's own device-mismatch error, exactly as on a GPU.
  (`_Hybrid`, a TorchDispatchMode above FakeTensorMode, routes each op to one or the other.)
- Host syncs. A data-dependent read of a cuda value (.item(), bool(), int(), .tolist(),
  nonzero, boolean-mask indexing) and a blocking device-to-host copy (.cpu(), .to("cpu"),
  copy_ into pageable host memory) are recorded with the first frame of this repository
  that caused them (`gpu.events`); inside `gpu.strict()` a read or a blocking copy down
  raises HostSync at once (stream syncs are recorded: gloo's staging needs one).
  Outside strict blocks a read returns 0 (the "no overflow / nothing found" value), so a
  training step can run through megatron-core's legitimate per-step reads (loss, grad norm).
- torch.cuda: is_available/device_count/current_device/set_device/synchronize/streams/
  events/RNG/memory queries answer as one (or `device_count`) GPU would. torch.Generator on
  "cuda" is a CPU generator reporting device cuda:0 (its state is a CPU byte tensor, as a
  CUDA generator's is). Pinned memory is emulated (pin_memory() copies and marks the
  storage, is_pinned() reads the mark).
- The CUDA device guard. A CPU-only torch has none, and autograd aborts the *process* the
  moment a graph is built over a cuda tensor; a 10-line C++ file registering c10's own
  FakeGuardImpl for CUDA is compiled once (g++, ~1 s, cached under the temp dir) and
  installed only while a FakeGPU is active.
- Autograd's backward cannot run: its engine asks for the CPU build's missing accelerator
  ("Cannot access accelerator device when none is available"). `python_backward` walks the
  graph in Python instead, calling each node's backward function (the real derivative
  kernels, on fake cuda tensors) and accumulating leaf gradients; the hooks autograd would
  fire on gradient accumulation are megatron DDP's, called by `python_backward` for the DDP
  models the test names. torch.autograd.backward is routed to it inside FakeGPU.
- torch.compile (megatron-core's jit_fuser, the fused bias-GeLU/SwiGLU, bias-dropout-add)
  runs eagerly (torch._dynamo disabled): no Triton here. The codecs' own compiled path is
  off too (MEGATRON_CC_FUSED=0); its Triton kernels are tested under TRITON_INTERPRET=1.
- torch.distributed: a real one-rank gloo group underneath (megatron-core's
  parallel_state creates its groups on it), every collective emulated above it with each
  backend's restrictions (`_Collectives`): gloo refuses CUDA tensors in send/recv/isend/
  irecv/batch_isend_irecv and in a coalesced all-reduce (`_coalescing_manager`, as
  ProcessGroupGloo::allreduce_coalesced does: "unsupported device type cuda"); NCCL
  refuses CPU tensors and a tensor on another GPU, and `init_process_group("nccl")` refuses
  more local ranks (LOCAL_WORLD_SIZE) than GPUs, as NCCL does. `FakeGroup(size)` is a group
  of `size` ranks whose peers mirror this one (a sum is D x), for per-rank compute of dp
  modes that only act with dp > 1. new_group/get_backend/get_world_size/get_rank answer for
  both kinds.
- megatron-core: the CPU shim (megatron/training/runtime/cpu_shim.py) rewires megatron-core for a
  CPU-only torch; with fake CUDA megatron-core must run *unshimmed*, so the attributes the
  shim patches are set back to their originals (captured when this module was imported,
  before any test could apply the shim) for the duration.
- nn.Module.to(cuda): a real GPU keeps every Parameter object (param.data = moved copy);
  a real tensor cannot take a FakeTensor's data, so the moved Parameter replaces it and
  takes over the original's attributes (tensor_model_parallel, shared, ...).

tests/fake_cuda/test_harness.py checks each emulation against what it stands for and fails
when a torch or megatron-core upgrade moves what is patched here.
"""
from __future__ import annotations

import contextlib
import gc
import ctypes
import hashlib
import importlib
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from megatron.training.runtime import cpu_shim

aten = torch.ops.aten
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class HostSync(AssertionError):
    """A cuda value was read on the host (or copied down blocking) inside `strict()`."""


class GlooRefuses(RuntimeError):
    """What gloo does with a CUDA tensor in an operation it only implements for host memory."""


class NcclRefuses(RuntimeError):
    """What NCCL does with a CPU tensor, a tensor on another GPU, or two ranks on one GPU."""


# ---------------------------------------------------------------- originals (before the shim)

def _owner(owner):
    return importlib.import_module(owner) if isinstance(owner, str) else owner


def _capture_unshimmed():
    """megatron-core's attributes as shipped; the CPU shim replaces them when it is applied.
    pytest imports this module while collecting, before any test can apply the shim."""
    if cpu_shim._applied:
        raise RuntimeError("megatron/training/runtime/cpu_shim.py was applied before the fake-CUDA "
                           "tier was imported; the unshimmed megatron-core is lost")
    out = {(o, a): getattr(_owner(o), a) for o, a in cpu_shim.PATCHED if isinstance(o, str)}
    for name in cpu_shim.DEVICE_LITERAL_MODULES:
        out[(name, "torch")] = importlib.import_module(name).torch
    return out


UNSHIMMED = _capture_unshimmed()


# ---------------------------------------------------------------- the CUDA device guard

_GUARD_SOURCE = r"""
#include <c10/core/impl/FakeGuardImpl.h>
// c10's test device guard, registered for CUDA on a CPU-only build from the first FakeGPU on
// (for the rest of the process): autograd records a stream per input, and without a guard the
// process aborts.
namespace {
c10::impl::FakeGuardImpl<c10::DeviceType::CUDA> guard;
auto& slot() { return c10::impl::device_guard_impl_registry[static_cast<size_t>(c10::DeviceType::CUDA)]; }
}
extern "C" int fake_cuda_guard_install() {
  auto* previous = slot().load();
  if (previous != nullptr && previous != &guard) return 0;  // a real CUDA build: keep its guard
  slot().store(&guard);
  return 1;
}
"""
_guard_lib = None


def guard_library():
    """The compiled guard (built once per torch version into the temp dir), or an error text."""
    global _guard_lib
    if _guard_lib is not None:
        return _guard_lib
    tdir = os.path.dirname(torch.__file__)
    key = hashlib.sha256((_GUARD_SOURCE + torch.__version__ + tdir).encode()).hexdigest()[:16]
    out_dir = os.path.join(tempfile.gettempdir(), f"megatron_cc_fake_cuda_{os.getuid()}")
    lib = os.path.join(out_dir, f"guard_{key}.so")
    if not os.path.exists(lib):
        os.makedirs(out_dir, exist_ok=True)
        src = os.path.join(out_dir, f"guard_{key}.{os.getpid()}.cpp")   # concurrent builds
        with open(src, "w") as f:
            f.write(_GUARD_SOURCE)
        tmp = f"{lib}.{os.getpid()}.tmp"
        cmd = [os.environ.get("CXX", "g++"), "-O1", "-shared", "-fPIC", "-std=c++17",
               "-I", os.path.join(tdir, "include"), src, "-o", tmp,
               "-L", os.path.join(tdir, "lib"), "-lc10", f"-Wl,-rpath,{os.path.join(tdir, 'lib')}"]
        try:
            subprocess.run(cmd, check=True, capture_output=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as e:
            err = getattr(e, "stderr", b"") or b""
            return f"cannot build the fake CUDA device guard ({' '.join(cmd[:1])}): {e} " \
                   f"{err.decode(errors='replace')[-300:]}"
        os.replace(tmp, lib)
    _guard_lib = ctypes.CDLL(lib)
    return _guard_lib


# ---------------------------------------------------------------- host-sync events

@dataclass
class Event:
    kind: str     # "read" (value of a cuda tensor), "d2h" (blocking copy down), "h2d", "sync"
    op: str
    where: str    # first frame in this repository (or the first megatron-core frame)

    def __str__(self):
        return f"{self.kind} {self.op} at {self.where}"


def _where() -> str:
    """The innermost frame of this repository's code (not this tier), plus the innermost
    megatron-core frame below it if any; frames walked without reading source lines."""
    frames, f = [], sys._getframe(2)
    while f is not None:
        frames.append((f.f_code.co_filename, f.f_lineno, f.f_code.co_name))
        f = f.f_back
    frames.reverse()
    # any venv inside the checkout (.venv, .venv312) is installed code, not this repository's
    mine = [f for f in frames if f[0].startswith(REPO) and "/tests/fake_cuda/" not in f[0]
            and "/site-packages/" not in f[0]]
    core = [f for f in frames if "/megatron/core/" in f[0]]
    tests = [f for f in frames if not f[0].endswith("fake_gpu.py")]
    f = (mine or core or tests or frames)[-1]
    text = _frame(f)
    if mine and core and frames.index(core[-1]) > frames.index(f):   # deeper, in megatron-core
        text += f" in {_frame(core[-1])}"
    return text


def _frame(f) -> str:
    name, lineno, func = f
    if name.startswith(REPO):
        name = os.path.relpath(name, REPO)
    elif "/site-packages/" in name:
        name = name.split("/site-packages/", 1)[1]
    return f"{name}:{lineno} ({func})"


_DYNAMIC = {aten.nonzero.default, aten.masked_select.default, aten._unique2.default,
            aten.unique_consecutive.default, aten.unique_dim.default,
            aten.repeat_interleave.Tensor}
_INDEX = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default}


def _is_cuda_device(d) -> bool:
    if d is None:
        return False
    if isinstance(d, int):
        return True
    return torch.device(d).type == "cuda"


def _is_fake_cuda(t) -> bool:
    return isinstance(t, FakeTensor) and t.device.type == "cuda"


def _bool_mask(args) -> bool:
    for a in args:
        if isinstance(a, (list, tuple)) and _bool_mask(a):
            return True
        if torch.is_tensor(a) and a.dtype == torch.bool and a.device.type == "cuda":
            return True
    return False


class _FakeMode(FakeTensorMode):
    """FakeTensorMode as on a machine without a GPU (torch.cuda.is_available() is patched to
    True here): torch.tensor(..., device="cuda") is built on the CPU, then moved (lifted)."""

    @property
    def avoid_device_init(self) -> bool:
        return True


class _Hybrid(TorchDispatchMode):
    """Real CPU tensors, fake cuda tensors; records host syncs (see the module docstring)."""

    def __init__(self, gpu: "FakeGPU"):
        super().__init__()
        self.gpu = gpu

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        gpu = self.gpu
        flat, _ = tree_flatten((args, kwargs))
        fakes = [a for a in flat if isinstance(a, FakeTensor)]
        if func is aten._local_scalar_dense.default and fakes:
            return gpu._read(func, args[0])
        if func in _DYNAMIC and any(_is_fake_cuda(a) for a in fakes):
            gpu._record("read", str(func))
        if func in _INDEX and _bool_mask(args[1:2]):
            gpu._record("read", f"{func} with a boolean mask")
        if func is aten._pin_memory.default:
            return gpu._pin(args[0])
        if func is aten.is_pinned.default:
            return gpu._is_pinned(args[0])
        pin = kwargs.pop("pin_memory", None)
        to_cuda = _is_cuda_device(kwargs.get("device"))
        self._transfers(func, args, kwargs, fakes)
        if not fakes and not to_cuda:
            with unset_fake_temporarily():
                out = func(*args, **kwargs)
            if pin:
                gpu._mark_pinned(out)
            return out
        fake = gpu.fake_mode
        args, kwargs = tree_map(
            lambda a: fake.from_tensor(a) if torch.is_tensor(a) and not isinstance(a, FakeTensor)
            else a, (args, kwargs))
        return func(*args, **kwargs)

    def _transfers(self, func, args, kwargs, fakes):
        gpu = self.gpu
        if func is aten._to_copy.default:
            src, dst = args[0], kwargs.get("device")
            if _is_fake_cuda(src) and dst is not None and torch.device(dst).type == "cpu":
                gpu._record("d2h", "to(cpu)")
            elif not _is_fake_cuda(src) and _is_cuda_device(dst):
                gpu._record("h2d", "to(cuda)" + ("" if gpu._pinned(src) else " from pageable"))
        elif func is aten.copy_.default:
            dst, src = args[0], args[1]
            if _is_fake_cuda(src) and not _is_fake_cuda(dst):
                blocking = not kwargs.get("non_blocking", len(args) > 2 and args[2])
                async_ok = not blocking and gpu._pinned(dst)
                gpu._record("d2h-async" if async_ok else "d2h", "copy_ to host")
            elif _is_fake_cuda(dst) and not _is_fake_cuda(src) and src.dim() > 0:
                gpu._record("h2d", "copy_ to cuda" + ("" if gpu._pinned(src) else
                                                      " from pageable"))


# ---------------------------------------------------------------- torch.cuda stand-ins

class _Stream:
    def __init__(self, gpu, device=None, **kw):
        self.gpu, self.device = gpu, torch.device("cuda", gpu.current)

    def synchronize(self):
        self.gpu._record("sync", "stream.synchronize()")

    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        return event or _Event(self.gpu)

    def query(self):
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Event:
    def __init__(self, gpu, *a, **kw):
        self.gpu = gpu

    def record(self, stream=None):
        pass

    def wait(self, stream=None):
        pass

    def query(self):
        return True

    def synchronize(self):
        self.gpu._record("sync", "event.synchronize()")

    def elapsed_time(self, other):
        return 0.0


class _CudaGenerator(torch.Generator):
    """torch.Generator(device="cuda") on a CPU-only torch: a CPU stream reporting cuda:N."""

    def __new__(cls, device=None):
        return super().__new__(cls)

    def __init__(self, device=None):
        super().__init__()
        self._fake_device = torch.device(device) if device is not None else torch.device("cpu")
        if self._fake_device.type == "cuda" and self._fake_device.index is None:
            self._fake_device = torch.device("cuda", torch.cuda.current_device())

    @property
    def device(self):
        return self._fake_device


# ---------------------------------------------------------------- torch.distributed emulation

class _Done:
    """A completed Work handle."""

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True

    def get_future(self):
        fut = torch.futures.Future()
        fut.set_result(None)
        return fut


class FakeGroup:
    """A process group of `size` ranks in which this process is `rank` and every peer holds
    what this rank holds (sums are size x, gathers repeat): per-rank compute with dp > 1."""

    def __init__(self, size: int, rank: int = 0, backend: str = "gloo", ranks=None):
        self.size_, self.rank_, self.backend = size, rank, backend
        self.ranks = list(ranks) if ranks is not None else list(range(size))

    def size(self):
        return self.size_

    def rank(self):
        return self.rank_

    def allreduce(self, tensors, opts=None):   # ProcessGroup API (preduce's own groups)
        for t in tensors:
            self._collectives.all_reduce(t, group=self)
        return _Done()


class _Collectives:
    """The emulated torch.distributed calls (module docstring): restrictions, then the result
    of a group whose peers mirror this rank."""

    def __init__(self, gpu: "FakeGPU", originals: dict):
        self.gpu, self.o = gpu, originals
        self.backends: Dict[object, str] = {}      # real group -> emulated backend name
        self.coalescing: Dict[object, list] = {}
        self.log: List[tuple] = []                  # (call, backend, devices) for assertions

    # ---- group queries
    def backend(self, group=None) -> str:
        if isinstance(group, FakeGroup):
            return group.backend
        key = group if group is not None else self.o["_get_default_group"]()
        return self.backends.get(key, self.gpu.backend)

    def size(self, group=None) -> int:
        if isinstance(group, FakeGroup):
            return group.size_
        return self.o["get_world_size"](group)

    def get_backend(self, group=None):
        return self.backend(group)

    def get_world_size(self, group=None):
        return self.size(group)

    def get_rank(self, group=None):
        if isinstance(group, FakeGroup):
            return group.rank_
        return self.o["get_rank"](group)

    def get_process_group_ranks(self, group):
        if isinstance(group, FakeGroup):
            return list(group.ranks)
        return self.o["get_process_group_ranks"](group)

    def new_group(self, ranks=None, timeout=None, backend=None, *a, **kw):
        name = str(backend).lower() if backend is not None else self.gpu.backend
        if name == "nccl":
            self.gpu.check_nccl_ranks()
        if ranks is not None and max(ranks, default=0) >= self.o["get_world_size"]():
            # over FakeGroup peers (a dp mode cloning its dp group): this process is rank 0
            if 0 not in ranks:
                return dist.GroupMember.NON_GROUP_MEMBER
            return FakeGroup(len(ranks), sorted(ranks).index(0), name, sorted(ranks))
        group = self.o["new_group"](ranks, timeout, "gloo", *a, **kw)
        if group is not None and group != dist.GroupMember.NON_GROUP_MEMBER:
            self.backends[group] = name
        return group

    def init_process_group(self, backend=None, *a, **kw):
        raise RuntimeError("FakeGPU initialises the default group itself")

    # ---- restrictions
    def _check(self, call, tensors, group, p2p=False, coalesced=False):
        be = self.backend(group)
        devices = {t.device for t in tensors}
        self.log.append((call, be, tuple(sorted(str(d) for d in devices))))
        if len({d.type for d in devices}) > 1:
            raise RuntimeError(f"{call}: tensors on several devices {sorted(map(str, devices))}")
        cuda = any(d.type == "cuda" for d in devices)
        if be == "gloo" and cuda and (p2p or coalesced):
            what = "allreduce_coalesced" if coalesced else call
            raise GlooRefuses(f"ProcessGroupGloo::{what}: unsupported device type cuda "
                              f"(gloo moves host memory only; stage through pinned host "
                              f"buffers or use NCCL)")
        if be == "nccl":
            for d in devices:
                if d.type != "cuda":
                    raise NcclRefuses(f"{call}: No backend type associated with device type "
                                      f"{d.type} (NCCL takes CUDA tensors only)")
                if d.index != self.gpu.current:
                    raise NcclRefuses(f"{call}: tensor on {d}, but this rank's NCCL "
                                      f"communicator is on cuda:{self.gpu.current}")

    # ---- collectives
    def all_reduce(self, tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        if group in self.coalescing:
            self.coalescing[group].append((tensor, op))
            return None
        self._check("all_reduce", [tensor], group)
        self._reduce(tensor, op, group)
        return _Done() if async_op else None

    def _reduce(self, tensor, op, group):
        n = self.size(group)
        if n > 1 and op in (dist.ReduceOp.SUM,):
            tensor.mul_(n)

    @contextlib.contextmanager
    def _coalescing_manager(self, group=None, device=None, async_ops=False):
        if group in self.coalescing:
            raise ValueError("ProcessGroup has non-empty op list at the start of coalescing")
        self.coalescing[group] = []

        class _CM:
            def __init__(self):
                self.works = []

            def append(self, w):
                self.works.append(w)

            def wait(self):
                for w in self.works:
                    w.wait()
        cm = _CM()
        try:
            yield cm
        finally:
            ops = self.coalescing.pop(group)
        if ops:
            self._check("all_reduce (coalesced)", [t for t, _ in ops], group, coalesced=True)
            for t, op in ops:
                self._reduce(t, op, group)
            if async_ops:
                cm.append(_Done())

    def all_gather(self, tensor_list, tensor, group=None, async_op=False):
        self._check("all_gather", [tensor, *tensor_list], group)
        for out in tensor_list:
            out.copy_(tensor)
        return _Done() if async_op else None

    def all_gather_into_tensor(self, output_tensor, input_tensor, group=None, async_op=False):
        self._check("all_gather_into_tensor", [output_tensor, input_tensor], group)
        n = self.size(group)
        output_tensor.view(n, -1).copy_(input_tensor.reshape(1, -1).expand(n, -1))
        return _Done() if async_op else None

    def reduce_scatter_tensor(self, output, input, op=dist.ReduceOp.SUM, group=None,
                              async_op=False):
        self._check("reduce_scatter_tensor", [output, input], group)
        n = self.size(group)
        output.copy_(input.view(n, -1)[self.get_rank(group)].view_as(output))
        self._reduce(output, op, group)
        return _Done() if async_op else None

    # torch 2.13's names for the two above (the old names call them)
    all_gather_single = all_gather_into_tensor
    reduce_scatter_single = reduce_scatter_tensor

    def broadcast(self, tensor, src=None, group=None, async_op=False, group_src=None):
        self._check("broadcast", [tensor], group)
        return _Done() if async_op else None

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None,
                          group=None, async_op=False):
        self._check("all_to_all_single", [output, input], group)
        output.copy_(input)
        return _Done() if async_op else None

    def barrier(self, group=None, async_op=False, device_ids=None, timeout=None):
        return _Done() if async_op else None

    def monitored_barrier(self, group=None, timeout=None, wait_all_ranks=False):
        return None

    def _p2p(self, call, tensor, group):
        self._check(call, [tensor], group, p2p=True)
        return _Done()

    def isend(self, tensor, dst=None, group=None, tag=0, group_dst=None):
        return self._p2p("isend", tensor, group)

    def irecv(self, tensor, src=None, group=None, tag=0, group_src=None):
        return self._p2p("irecv", tensor, group)

    def send(self, tensor, dst=None, group=None, tag=0, group_dst=None):
        self._p2p("send", tensor, group)

    def recv(self, tensor, src=None, group=None, tag=0, group_src=None):
        self._p2p("recv", tensor, group)
        return src

    def batch_isend_irecv(self, p2p_op_list):
        out = []
        for op in p2p_op_list:
            name = "isend" if op.op in (self.isend, self.o["isend"]) else "irecv"
            out.append(self._p2p(f"batch_isend_irecv({name})", op.tensor, op.group))
        return out

    def all_gather_object(self, object_list, obj, group=None):
        for i in range(len(object_list)):
            object_list[i] = obj

    def broadcast_object_list(self, object_list, src=None, group=None, device=None,
                              group_src=None):
        return None

    class P2POp:
        """dist.P2POp without its group-membership checks (a FakeGroup is not registered)."""

        def __init__(self, op, tensor, peer=None, group=None, tag=0, group_peer=None):
            self.op, self.tensor, self.peer, self.group = op, tensor, peer, group
            self.tag, self.group_peer = tag, group_peer

    NAMES = ("P2POp", "all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
             "broadcast", "all_to_all_single", "barrier", "monitored_barrier", "isend",
             "irecv", "send", "recv", "batch_isend_irecv", "all_gather_object",
             "broadcast_object_list", "_coalescing_manager", "get_backend", "get_world_size",
             "get_rank", "get_process_group_ranks", "new_group", "init_process_group") + \
        tuple(n for n in ("all_gather_single", "reduce_scatter_single") if hasattr(dist, n))


FakeGroup._collectives = None   # set while a FakeGPU is active


# ---------------------------------------------------------------- python backward

def python_backward(tensors, grad_tensors=None, ddp_models=()):
    """torch.autograd.backward without the C++ engine (see the module docstring).

    Each node's backward runs once all its output gradients are in (dependency counts, as
    the engine does); leaf gradients accumulate into .grad; then megatron DDP's
    post-accumulation hook of every DDP-managed parameter that received one.
    """
    tensors = [tensors] if torch.is_tensor(tensors) else list(tensors)
    if grad_tensors is None or torch.is_tensor(grad_tensors):
        grad_tensors = [grad_tensors] * len(tensors)
    roots = []
    for t, g in zip(tensors, grad_tensors):
        if t.grad_fn is None:
            continue
        roots.append((t.grad_fn, t.output_nr,
                      g if g is not None else torch.ones_like(t)))
    deps: Dict[object, int] = {}
    seen, stack = set(), [n for n, _, _ in roots]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        for nxt, _ in node.next_functions:
            if nxt is not None:
                deps[nxt] = deps.get(nxt, 0) + 1
                stack.append(nxt)
    buffers: Dict[object, list] = {}

    def add(node, idx, grad):
        meta = node._input_metadata
        buf = buffers.setdefault(node, [None] * max(1, len(meta)))
        if idx < len(meta):   # the engine's validate_outputs: device, shape, dtype
            m = meta[idx]
            if grad.device != m.device:
                raise RuntimeError(f"invalid gradient for {node.name()}: expected device "
                                   f"{m.device} but got {grad.device}")
            if tuple(grad.shape) != tuple(m.shape):
                grad = grad.sum_to_size(m.shape)
            if grad.dtype != m.dtype:
                grad = grad.to(m.dtype)
        buf[idx] = grad if buf[idx] is None else buf[idx] + grad

    for node, idx, g in roots:
        add(node, idx, g)
    ready = [n for n, _, _ in roots if deps.get(n, 0) == 0]
    touched = []
    with torch.no_grad():
        while ready:
            node = ready.pop()
            grads = buffers.pop(node, [])
            if hasattr(node, "variable"):   # AccumulateGrad
                var, g = node.variable, grads[0]
                if g is not None:
                    var.grad = g.detach() if var.grad is None else var.grad + g
                    touched.append(var)
                continue
            meta = node._input_metadata
            grads = [g if g is not None else torch.zeros(m.shape, dtype=m.dtype,
                                                         device=m.device)
                     for g, m in zip(grads, meta)] if meta else grads
            outs = node(*grads) if callable(node) else node.apply(*grads)   # C++ / custom
            outs = outs if isinstance(outs, tuple) else (outs,)
            for (nxt, idx), g in zip(node.next_functions, outs):
                if nxt is None:
                    continue
                if g is not None:
                    add(nxt, idx, g)
                deps[nxt] -= 1
                if deps[nxt] == 0:
                    ready.append(nxt)
    for model in ddp_models:
        mine = {id(p) for p in model.parameters()}
        for var in touched:
            if id(var) in mine:
                model._make_backward_post_hook(var)()


def real_copy(obj):
    """`obj` with every fake tensor replaced by a real CPU tensor of its shape and dtype (zeros):
    what torch.save of a GPU state and torch.load(map_location="cpu") give, minus the values."""
    if isinstance(obj, FakeTensor):
        with unset_fake_temporarily():
            return torch.zeros(obj.shape, dtype=obj.dtype)
    if isinstance(obj, dict):
        return type(obj)((k, real_copy(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(real_copy(v) for v in obj)
    return obj


# ---------------------------------------------------------------- the fake machine

class FakeGPU:
    """One process, `device_count` fake GPUs, this rank on cuda:`local_rank % device_count`,
    torch.distributed on `backend` (emulated over a one-rank gloo group)."""

    def __init__(self, backend: str = "gloo", device_count: int = 1, local_rank: int = 0,
                 local_world_size: int = 1, init_dist: bool = True):
        self.backend, self.device_count = backend, device_count
        self.local_rank, self.local_world_size = local_rank, local_world_size
        self.current = local_rank % device_count
        self.init_dist = init_dist
        self.events: List[Event] = []
        self.ddp_models: list = []
        self._strict = 0
        self._pinned_ptrs: set = set()
        self._stack: Optional[contextlib.ExitStack] = None

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self.current)

    # ---- events
    def _record(self, kind: str, op: str) -> None:
        ev = Event(kind, op, _where())
        self.events.append(ev)
        if self._strict and kind in ("read", "d2h"):
            raise HostSync(f"host sync inside a strict block: {ev}")

    def _read(self, func, t):
        if t.device.type == "cuda":
            self._record("read", f"{func} (.item()/bool()/tolist() of a cuda tensor)")
        else:   # a fake CPU tensor: a value copied down from the device earlier
            self._record("read", f"{func} of a host copy of a cuda tensor")
        if t.dtype == torch.bool:
            return False
        return 0.0 if t.is_floating_point() else 0

    def syncs(self, kind: Optional[str] = None, under: Optional[str] = None,
              since: int = 0) -> List[Event]:
        """Events of `kind` (every host-blocking kind by default) recorded since event number
        `since`, from code under `under` (a path prefix)."""
        kinds = (kind,) if kind else ("read", "d2h", "sync")
        return [e for e in self.events[since:] if e.kind in kinds and
                (under is None or e.where.startswith(under))]

    @contextlib.contextmanager
    def strict(self):
        """Any host read of a cuda value or blocking copy down raises at once. Stream syncs
        are only recorded: gloo's staging needs one, by design (tests assert where)."""
        self._strict += 1
        try:
            yield
        finally:
            self._strict -= 1

    @contextlib.contextmanager
    def lenient(self):
        """Suspend strict(): code under test whose host reads are the point (logging)."""
        saved, self._strict = self._strict, 0
        try:
            yield
        finally:
            self._strict = saved

    # ---- pinned memory
    def _ptr(self, t):
        try:
            return t.untyped_storage().data_ptr()
        except Exception:
            return None

    def _mark_pinned(self, t):
        if torch.is_tensor(t) and not isinstance(t, FakeTensor):
            self._pinned_ptrs.add(self._ptr(t))

    def _pinned(self, t) -> bool:
        return torch.is_tensor(t) and not isinstance(t, FakeTensor) and \
            self._ptr(t) in self._pinned_ptrs

    def _pin(self, t):
        if isinstance(t, FakeTensor):
            if t.device.type == "cuda":
                raise RuntimeError("cannot pin a cuda tensor: only dense CPU tensors can be pinned")
            return t
        with unset_fake_temporarily():
            out = t.clone()
        self._mark_pinned(out)
        return out

    def _is_pinned(self, t):
        return self._pinned(t)

    # ---- NCCL's rule
    def check_nccl_ranks(self) -> None:
        if self.local_world_size > self.device_count:
            raise NcclRefuses(f"NCCL error: invalid usage: Duplicate GPU detected: "
                              f"{self.local_world_size} ranks on this node share "
                              f"{self.device_count} GPU(s)")

    # ---- enter / exit
    def __enter__(self) -> "FakeGPU":
        lib = guard_library()
        if isinstance(lib, str):
            raise RuntimeError(lib)
        self._stack = stack = contextlib.ExitStack()
        try:
            # The guard stays installed once used: fake tensors freed later (cycles collected
            # after the test, or in a forked child of a later test, which segfaulted) still
            # release through it. A CPU-only torch has no other CUDA guard to restore.
            lib.fake_cuda_guard_install()
            stack.callback(gc.collect)   # free this GPU's fake tensors while it is active
            self._patch_torch_cuda(stack)
            self._patch_megatron(stack)
            self._patch_dist(stack)
            self._env(stack)
            self.fake_mode = _FakeMode(allow_non_fake_inputs=True)
            stack.enter_context(self.fake_mode)
            stack.enter_context(_Hybrid(self))
            self._threads_too(stack)
        except BaseException:
            stack.close()
            raise
        return self

    def __exit__(self, *exc):
        self._stack.close()
        return False

    def _threads_too(self, stack):
        """megatron.cc.common.background's threads run inline, at start(): dispatch modes are per
        thread and one FakeTensorMode cannot serve two threads at once (its in-kernel flag is
        shared, the dispatch keys are not). The job's CUDA handling (device, own stream,
        record_stream) runs as written; only the concurrency is gone."""
        from megatron.cc.common import background
        self._set(stack, background, "threading", _InlineThreading)

    def _set(self, stack, obj, name, value):
        old = getattr(obj, name)
        setattr(obj, name, value)
        stack.callback(setattr, obj, name, old)

    def _patch_torch_cuda(self, stack):
        c, gpu = torch.cuda, self

        def set_device(d):
            gpu.current = d if isinstance(d, int) else (torch.device(d).index or 0)

        def synchronize(device=None):
            gpu._record("sync", "torch.cuda.synchronize()")

        rng = {"state": torch.Generator().get_state()}

        def get_rng_state(device="cuda"):
            return rng["state"].clone()

        def set_rng_state(state, device="cuda"):
            rng["state"] = state.clone()

        for name, value in {
            "is_available": lambda: True, "device_count": lambda: gpu.device_count,
            "current_device": lambda: gpu.current, "set_device": set_device,
            "is_initialized": lambda: True, "synchronize": synchronize,
            "current_stream": lambda device=None: _Stream(gpu),
            "default_stream": lambda device=None: _Stream(gpu),
            "Stream": lambda *a, **k: _Stream(gpu), "Event": lambda *a, **k: _Event(gpu),
            "stream": lambda s=None: contextlib.nullcontext(),
            "get_rng_state": get_rng_state, "set_rng_state": set_rng_state,
            "manual_seed": lambda seed: None, "manual_seed_all": lambda seed: None,
            "mem_get_info": lambda device=None: (64 << 30, 80 << 30),
            "max_memory_allocated": lambda device=None: 0,
            "memory_allocated": lambda device=None: 0,
            "reset_peak_memory_stats": lambda device=None: None,
            "empty_cache": lambda: None, "is_bf16_supported": lambda *a, **k: True,
            "get_device_capability": lambda device=None: (9, 0),
            "get_device_name": lambda device=None: "FakeGPU",
            "set_sync_debug_mode": lambda mode: None,
        }.items():
            self._set(stack, c, name, value)
        self._set(stack, torch.cuda.random, "get_rng_state", get_rng_state)
        self._set(stack, torch.cuda.random, "set_rng_state", set_rng_state)
        self._set(stack, torch, "Generator", _CudaGenerator)
        # Tensor.cuda() of a real tensor: "cuda" without an index resolves through the
        # missing CUDA runtime; an explicit index does not
        self._set(stack, torch.Tensor, "record_stream", lambda t, stream: None)
        self._set(stack, torch.Tensor, "cuda", lambda t, device=None, non_blocking=False, **k:
                  t.to(torch.device("cuda", gpu.current if device is None else
                                    (device if isinstance(device, int)
                                     else torch.device(device).index or 0)),
                       non_blocking=non_blocking))
        # device=<int> means "the current accelerator", which a CPU-only torch resolves (and
        # refuses) while parsing arguments, before any dispatch: name the GPU instead
        for name in _FACTORIES:
            fn = _int_device_is_cuda(getattr(torch, name))
            self._set(stack, torch, name, _reads_elements(fn, gpu) if name in ("tensor", "as_tensor")
                      else fn)
        for name in ("to", "new_zeros", "new_empty", "new_ones", "new_full", "new_tensor"):
            self._set(stack, torch.Tensor, name, _int_device_is_cuda(getattr(torch.Tensor, name),
                                                                     first_arg=name == "to"))
        self._set(stack, torch._dynamo.config, "disable", True)
        # reading a file is host work: real CPU tensors (under a fake mode torch.load would
        # hand out meta tensors), moved to the GPU by the code under test as on a real one
        self._set(stack, torch, "load", _host_only(torch.load))
        self._set(stack, torch.autograd, "backward",
                  lambda tensors, grad_tensors=None, *a, **k:
                  python_backward(tensors, grad_tensors, gpu.ddp_models))
        self._set(stack, torch.nn.Module, "_apply", _keep_param_attributes(torch.nn.Module._apply))

    def _patch_megatron(self, stack):
        """Undo the CPU shim (if applied) for megatron-core: real CUDA code paths run."""
        from megatron.core.fusions import fused_softmax
        from megatron.core.transformer import utils as tutils
        for (owner, attr), value in UNSHIMMED.items():
            if owner == "megatron.core.tensor_parallel.random":
                continue
            self._set(stack, _owner(owner), attr, value)
        # a fresh GPU process: initialize_distributed applies what the shim applies on GPUs
        self._set(stack, cpu_shim, "_applied", False)
        from megatron.core.tensor_parallel import random as tp_random
        # the tracker's "CUDA" states: a CPU generator's bytes stand in for Philox states
        self._set(stack, tp_random, "_get_cuda_rng_state",
                  lambda device="cuda", clone=False, graph_safe=False: torch.cuda.get_rng_state())
        self._set(stack, tp_random, "_set_cuda_rng_state",
                  lambda new_state, device=-1, graph_safe=False: torch.cuda.set_rng_state(new_state))
        # lru-cached causal masks would outlive this fake mode
        for fn in (fused_softmax.get_default_causal_mask, tutils.get_default_causal_mask):
            if hasattr(fn, "cache_clear"):
                fn.cache_clear()
                stack.callback(fn.cache_clear)
        os_env = os.environ.get("MEGATRON_CC_FUSED")
        os.environ["MEGATRON_CC_FUSED"] = "0"
        stack.callback(lambda: os.environ.__setitem__("MEGATRON_CC_FUSED", os_env)
                       if os_env is not None else os.environ.pop("MEGATRON_CC_FUSED", None))

    def _patch_dist(self, stack):
        import torch.distributed.distributed_c10d as c10d
        names = _Collectives.NAMES + ("_get_default_group",)
        originals = {n: getattr(c10d, n) for n in names}
        self.dist = coll = _Collectives(self, originals)
        FakeGroup._collectives = coll
        stack.callback(setattr, FakeGroup, "_collectives", None)
        replaced = {originals[n]: getattr(coll, n) for n in _Collectives.NAMES}
        targets = [dist, c10d] + [m for n, m in list(sys.modules.items())
                                  if m is not None and (n.startswith("megatron.")
                                                        or n.startswith("tests."))]
        for mod in targets:
            for attr, value in list(vars(mod).items()):
                try:
                    new = replaced.get(value)
                except TypeError:   # unhashable attribute
                    continue
                if new is not None:
                    self._set(stack, mod, attr, new)
        if self.init_dist:
            if self.backend == "nccl":
                self.check_nccl_ranks()
            if dist.is_initialized():
                raise RuntimeError("FakeGPU needs torch.distributed uninitialised")
            originals["init_process_group"]("gloo", store=dist.HashStore(), rank=0,
                                            world_size=1)

            def destroy():
                from megatron.core import parallel_state as ps
                if ps.model_parallel_is_initialized():
                    ps.destroy_model_parallel()
                if dist.is_initialized():
                    dist.destroy_process_group()
            stack.callback(destroy)

    def _env(self, stack):
        env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": str(self.local_rank),
               "LOCAL_WORLD_SIZE": str(self.local_world_size), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": "29999"}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)

        def restore():
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        stack.callback(restore)


_FACTORIES = ("tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "rand", "randn",
              "randint", "randperm", "linspace", "eye", "empty_strided", "zeros_like",
              "ones_like", "empty_like", "full_like", "rand_like", "randn_like")


def _as_device(d):
    return torch.device("cuda", d) if isinstance(d, int) and not isinstance(d, bool) else d


def _int_device_is_cuda(fn, first_arg=False):
    def wrapper(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = _as_device(kwargs["device"])
        if first_arg and len(args) > 1:
            args = (args[0], _as_device(args[1])) + tuple(args[2:])
        return fn(*args, **kwargs)
    return wrapper


def _reads_elements(fn, gpu):
    """torch.tensor([t0, t1, ...]) of cuda tensors reads each element to the host first."""
    def wrapper(data, *args, **kwargs):
        if isinstance(data, (list, tuple)) and any(_is_fake_cuda(d) for d in data):
            for d in data:
                gpu._record("read", "torch.tensor() of a list of cuda tensors (one read each)")
            device = kwargs.get("device")
            out = torch.stack([d.detach().reshape(()) for d in data]).to("cpu")
            return out.to(device=device, dtype=kwargs.get("dtype") or out.dtype)
        return fn(data, *args, **kwargs)
    return wrapper


class _InlineThread:
    def __init__(self, target=None, args=(), kwargs=None, daemon=None, name=None):
        self._target, self._args, self._kwargs = target, args, kwargs or {}

    def start(self):
        self._target(*self._args, **self._kwargs)

    def join(self, timeout=None):
        pass

    def is_alive(self):
        return False


class _InlineThreading:
    Thread = _InlineThread


def _host_only(fn):
    def wrapper(*args, **kwargs):
        with unset_fake_temporarily():
            return fn(*args, **kwargs)
    return wrapper


def _keep_param_attributes(apply):
    def _apply(self, fn, recurse=True):
        before = {(id(m), k): p for m in self.modules() for k, p in m._parameters.items()
                  if p is not None}
        out = apply(self, fn, recurse)
        for m in self.modules():
            for k, p in m._parameters.items():
                old = before.get((id(m), k))
                if old is not None and p is not old:
                    for a, v in old.__dict__.items():
                        p.__dict__.setdefault(a, v)
        return out
    return _apply
