"""use_fused_adam (megatron/training/loop/fused_adam.py): which of megatron-core's inner
optimizers it switches, the update against the foreach AdamW it replaces, and a checkpoint's
step counters after a load. Run on CPU tensors (torch has a fused CPU AdamW) by treating every
group as the device's; the trainer switches CUDA groups only."""
import copy
from types import SimpleNamespace

import torch

from megatron.cc.data_parallel.replica_adam import ReplicaAdamW
from megatron.training.loop.fused_adam import use_fused_adam

EVERY = lambda group: True   # noqa: E731


def params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(n, generator=g)) for n in (7, 300, 33)]


def steps(opt, ps, n=5, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()


def test_same_update_as_foreach_adamw_up_to_rounding():
    a, b = params(), params()
    ref = torch.optim.AdamW(a, lr=1e-2, weight_decay=0.1, foreach=True)
    opt = torch.optim.AdamW(b, lr=1e-2, weight_decay=0.1, foreach=True)
    wrapper = SimpleNamespace(optimizer=opt)
    assert use_fused_adam(wrapper, on_device=EVERY) == 1
    assert opt.param_groups[0]["fused"] and not opt.param_groups[0]["foreach"]
    steps(ref, a)
    steps(opt, b)
    for x, y in zip(a, b):
        assert torch.allclose(x, y, rtol=1e-6, atol=1e-7)
        assert not torch.equal(x, torch.zeros_like(x))


def test_only_torch_adam_on_the_device_is_switched():
    chained = SimpleNamespace(chained_optimizers=[
        SimpleNamespace(optimizer=ReplicaAdamW(params(), dp=2)),       # --dp-adam-correction
        SimpleNamespace(optimizer=torch.optim.SGD(params(), lr=0.1)),
        SimpleNamespace(optimizer=torch.optim.Adam(params()))])
    assert use_fused_adam(chained) == 0                 # CPU parameters: left as built
    assert use_fused_adam(chained, on_device=EVERY) == 1
    replica, sgd, adam = (p.optimizer for p in chained.chained_optimizers)
    assert adam.param_groups[0]["fused"]
    assert not replica.param_groups[0].get("fused") and not sgd.param_groups[0].get("fused")


def test_a_foreach_checkpoint_loads_into_the_fused_optimizer():
    a = params()
    saved = torch.optim.AdamW(a, lr=1e-2, foreach=True)
    steps(saved, a, n=3)
    sd = copy.deepcopy(saved.state_dict())             # foreach: host int-valued steps
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    opt = torch.optim.AdamW(b, lr=1e-2)
    wrapper = SimpleNamespace(optimizer=opt)
    use_fused_adam(wrapper, on_device=EVERY)
    opt.load_state_dict(sd)                             # the groups come back foreach
    assert not opt.param_groups[0]["fused"]
    use_fused_adam(wrapper, on_device=EVERY)            # as the trainer does after a load
    assert opt.param_groups[0]["fused"]
    assert all(opt.state[p]["step"].dtype == torch.float32 for p in b)
    steps(saved, a, n=2, seed=7)
    steps(opt, b, n=2, seed=7)
    for x, y in zip(a, b):
        assert torch.allclose(x, y, rtol=1e-6, atol=1e-7)
