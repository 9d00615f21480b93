"""Device-side details of the training loop, checked on the CPU.

- --overlap-p2p-comm posts receives ahead only when the *pipeline transport's* backend allows
  it (not NCCL), whatever the job's default backend is (--pp-backend nccl in a gloo job);
- the padded-vocabulary mask of lm_loss is made on the logits' device (no host tensor copied up
  per micro-batch, no host read), checked under FakeTensorMode with CUDA logits;
- micro-batches go up pinned and non-blocking on CUDA, and stay untouched on the CPU.
"""
import types

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from megatron.training.runtime import topology
from megatron.training.loop import training

NCCL_GROUP, GLOO_GROUP = object(), object()


def _args():
    return types.SimpleNamespace(vp=1, compat=types.SimpleNamespace(pp_mode="1f1b"),
                                 parallel=types.SimpleNamespace(overlap_p2p_comm=True))


@pytest.mark.parametrize("default,transport,prefetch", [
    ("gloo", NCCL_GROUP, False),   # --pp-backend nccl in a gloo job: the deadlock case
    ("nccl", GLOO_GROUP, True),    # --pp-backend gloo in an NCCL job: staging, may prefetch
    ("gloo", None, True),
    ("nccl", None, False),
])
def test_prefetch_follows_the_pipeline_transport_backend(monkeypatch, default, transport,
                                                         prefetch):
    backends = {None: default, NCCL_GROUP: "nccl", GLOO_GROUP: "gloo"}
    monkeypatch.setattr(training.dist, "get_backend", lambda group=None: backends[group])
    link = types.SimpleNamespace(group=transport)
    schedule = training.pipeline_schedule(_args(), link, forward_only=False)
    assert (schedule.exchange == training.PREFETCH) == prefetch


class _HostToDevice(TorchDispatchMode):
    """Ops that take CPU tensors and return a CUDA one: host-to-device copies."""

    def __init__(self):
        super().__init__()
        self.copies = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = torch.utils._pytree.tree_leaves((args, kwargs))
        if isinstance(out, torch.Tensor) and out.device.type == "cuda" and any(
                isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in inputs):
            self.copies.append(str(func))
        return out


def _lm_loss(monkeypatch, logits, vocab, padded, tp_rank):
    from megatron.core import tensor_parallel
    # the masked logits themselves come back (the cross entropy is megatron-core's, as at
    # tp 2: the fused tp-1 loss on CUDA is tests/training/test_cross_entropy.py's)
    monkeypatch.setattr(tensor_parallel, "vocab_parallel_cross_entropy", lambda l, y: l)
    return training.lm_loss(logits, None, vocab_size=vocab, tp_rank=tp_rank, tp_size=2)


@pytest.mark.parametrize("tp_rank", [0, 1])
def test_padded_vocab_mask_values(monkeypatch, tp_rank):
    width, vocab = 64, 100   # padded 128 over tp=2: rank 0 all real, rank 1 36 real columns
    logits = torch.randn(2, 3, width)
    out = _lm_loss(monkeypatch, logits, vocab, 2 * width, tp_rank)
    real = vocab - tp_rank * width
    assert torch.equal(out[..., :real], logits[..., :real])
    assert bool((out[..., real:] == float("-inf")).all())


def test_padded_vocab_mask_is_made_on_the_device(monkeypatch):
    with FakeTensorMode():   # raises on a host read (the old `if padded.any()`)
        logits = torch.empty(2, 3, 64, device="cuda")
        with _HostToDevice() as rec:
            out = _lm_loss(monkeypatch, logits, 100, 128, tp_rank=1)
    assert out.device.type == "cuda"
    assert rec.copies == [], f"host-to-device copies per micro-batch: {rec.copies}"


class _Tensor:
    """Records what to_device asks of a batch tensor (no CUDA here to pin for real)."""

    def __init__(self, log):
        self.log = log

    def pin_memory(self):
        self.log.append("pin")
        return self

    def to(self, device, non_blocking=False):
        self.log.append(("to", str(device), non_blocking))
        return self


def test_micro_batches_go_up_pinned_and_non_blocking():
    log = []
    out = topology.to_device({"tokens": _Tensor(log)}, torch.device("cuda", 0))
    assert log == ["pin", ("to", "cuda:0", True)] and set(out) == {"tokens"}
    batch = {"tokens": torch.zeros(2, 3)}
    assert topology.to_device(batch, torch.device("cpu")) is batch   # CPU: no copy at all
