"""--diloco-residual-in-model: each replica keeps what its codec did not send in its weights.

Two gloo ranks run DiLoCo (H = 2, outer lr 1, no momentum, no error feedback in the message)
on a Linear whose weights each replica moves randomly; the replicas send fixpoint-2 and the
owners return the mean exactly (phase 2 lossless, so only the replicas' own residuals are
lost), and the last sync (after step 4) is exact. With the residual kept in the model:
- after the first sync the replicas differ (each holds its own residual) but their mean is
  the exact mean of the first window: nothing was lost, only not yet shared;
- the last sync then carries the residuals in the pseudo-gradients, and the delivered model is
  the start minus the mean of every move, as if no codec had run.
Without it (the control) the first window's residuals are dropped and the model misses it.
With lossy owners (phase 2 fixpoint-2) and error_decay 1, which then weighs only their server
errors, the exact last sync repays those too: the delivered model is again exact.
"""
import torch
import torch.distributed as dist

from tests.cc.grad_sync.inner_steps import moves_then_syncs
from tests.distributed import by_value, run_distributed


def _run(rank, keep: bool, server: bool = False):
    from megatron.cc.data_parallel.diloco_sync import DiLoCoSync
    from megatron.cc.data_parallel.flat_codecs import make_flat_codec
    from megatron.cc.grad_sync.param_sync import flatten
    from megatron.cc.data_parallel.sharded_exchange import ShardedExchange
    from megatron.cc.common.stats import ChannelStats
    gen = torch.Generator().manual_seed(rank)
    torch.manual_seed(0)
    lin = torch.nn.Linear(40, 7)
    start = flatten(list(lin.parameters())).clone()
    beta = 1.0 if server else 0.0   # server: the owners send fixpoint-2 too, error-fed
    ex = ShardedExchange(dist.group.WORLD, make_flat_codec("fixpoint-2"),
                         make_flat_codec("fixpoint-2" if server else "none"), error_decay=beta)
    sync = DiLoCoSync(dist.group.WORLD, ChannelStats(), inner_steps=2, outer_lr=1.0,
                      outer_momentum=0.0, exchange=ex, error_decay=beta, final=None,
                      last_step=4, residual_in_model=keep)
    sync(lin, 0)
    steps, after, _ = moves_then_syncs(sync, lin, gen, 4)
    return {"start": start, "after": after, "steps": steps}


def _worker(rank, world):
    return by_value({"keep": _run(rank, True), "drop": _run(rank, False),
                     "server": _run(rank, True, server=True)})


def test_residual_in_model_loses_nothing():
    res = run_distributed(_worker, 2, timeout=120)
    start = torch.as_tensor(res[0]["keep"]["start"])
    s0, s1 = (torch.as_tensor(r["keep"]["steps"]) for r in res)
    first = start - (s0[:2].sum(0) + s1[:2].sum(0)) / 2
    exact = start - (s0.sum(0) + s1.sum(0)) / 2
    a0, a1 = (torch.as_tensor(r["keep"]["after"]) for r in res)
    assert (a0[1] - a1[1]).abs().max() > 1e-3                   # each keeps its own residual
    torch.testing.assert_close((a0[1] + a1[1]) / 2, first, rtol=0, atol=1e-5)
    assert torch.equal(a0[3], a1[3])                            # the last sync: one model
    torch.testing.assert_close(a0[3], exact, rtol=0, atol=1e-5)
    d0, d1 = (torch.as_tensor(r["drop"]["after"]) for r in res)
    assert torch.equal(d0[1], d1[1])                            # control: one lossy model
    assert (d0[3] - exact).abs().max() > 1e-3                   # ... that missed the residuals
    # lossy owners, their server errors fed back (beta 1, which under residual-in-model weighs
    # only them): the exact last sync repays them, and the residuals ride in the weights
    v0, v1 = (torch.as_tensor(r["server"]["after"]) for r in res)
    assert (v0[1] - v1[1]).abs().max() > 1e-3
    assert ((v0[1] + v1[1]) / 2 - first).abs().max() > 1e-3      # phase 2 missed some of it
    torch.testing.assert_close(v0[3], exact, rtol=0, atol=1e-5)
