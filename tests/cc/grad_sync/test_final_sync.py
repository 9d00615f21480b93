"""--diloco-final-compression none: the run's last sync is exact and repays every pending error.

Two gloo ranks run DiLoCo (H = 2, outer lr 1, no momentum) through the sharded fixpoint-2
exchange on a Linear whose weights each replica moves randomly, with the last sync (after
step 4) exact. The first sync is lossy (the model is not the replicas' mean there), but the
last one adds each replica's residual and each owner's server error, so the delivered model is
the start minus the mean of the replicas' moves, as if no codec had run. The bytes: the
fixpoint sync counts the sharded exchange's formula, the exact one 4 n. A lossy last sync (its
own sharded exchange) takes over the owners' pending server errors: with lossless codecs in
it, the delivered model is exact too.
"""
import torch
import torch.distributed as dist

from tests.cc.grad_sync.inner_steps import moves_then_syncs
from tests.distributed import by_value, run_distributed


def _worker(rank, world, lossless_exchange=False, final_average=False):
    from megatron.cc.data_parallel.cocktail_sgd import sharded_exchange_bytes
    from megatron.cc.data_parallel.diloco_sync import DiLoCoSync
    from megatron.cc.data_parallel.flat_codecs import make_flat_codec
    from megatron.cc.grad_sync.param_sync import flatten
    from megatron.cc.data_parallel.sharded_exchange import ShardedExchange
    from megatron.cc.common.stats import ChannelStats
    gen = torch.Generator().manual_seed(rank)
    lin = torch.nn.Linear(40, 7)
    for p in lin.parameters():
        dist.broadcast(p.data, 0)
    start = flatten(list(lin.parameters())).clone()
    ex = ShardedExchange(dist.group.WORLD, make_flat_codec("fixpoint-2"),
                         make_flat_codec("fixpoint-2"))
    last = None   # exact; or a sharded exchange whose codecs happen to be lossless (fp32)
    if lossless_exchange:
        last = ShardedExchange(dist.group.WORLD, make_flat_codec("none"), make_flat_codec("none"))
    outer = (0.7, 0.9) if final_average else (1.0, 0.0)
    sync = DiLoCoSync(dist.group.WORLD, ChannelStats(), inner_steps=2, outer_lr=outer[0],
                      outer_momentum=outer[1], exchange=ex, final=last, last_step=4,
                      final_average=final_average)
    sync(lin, 0)
    steps, after, sent = moves_then_syncs(sync, lin, gen, 4)
    n = start.numel()
    want = [0, sharded_exchange_bytes(n, world, make_flat_codec("fixpoint-2")), 0,
            sharded_exchange_bytes(n, world, make_flat_codec("none")) if last else 4 * n]
    return by_value({"start": start, "after": after, "steps": steps,
                     "sent": sent, "want_sent": want})


def test_exact_final_sync_repays_every_error():
    res = run_distributed(_worker, 2, timeout=120)
    for r in res:
        assert r["sent"] == r["want_sent"]
    start = torch.as_tensor(res[0]["start"])
    a0, a1 = (torch.as_tensor(r["after"]) for r in res)
    s0, s1 = (torch.as_tensor(r["steps"]) for r in res)
    assert torch.equal(a0[1], a1[1]) and torch.equal(a0[3], a1[3])   # replicas agree after syncs
    lossy = start - (s0[:2].sum(0) + s1[:2].sum(0)) / 2   # the mean of the first window
    assert (a0[1] - lossy).abs().max() > 1e-3                # fixpoint-2 missed it
    exact = start - (s0.sum(0) + s1.sum(0)) / 2
    torch.testing.assert_close(a0[3], exact, rtol=0, atol=1e-5)


def test_lossy_final_sync_takes_over_the_server_errors():
    """A last sync through its own sharded exchange (here with lossless fp32 codecs, so only
    the bookkeeping can lose anything) repays the replica's residual and takes over the main
    exchange's pending server errors: again exactly the replicas' mean moves."""
    res = run_distributed(_worker, 2, (True,), timeout=120)
    for r in res:
        assert r["sent"] == r["want_sent"]
    start = torch.as_tensor(res[0]["start"])
    a0 = torch.as_tensor(res[0]["after"])
    s0, s1 = (torch.as_tensor(r["steps"]) for r in res)
    exact = start - (s0.sum(0) + s1.sum(0)) / 2
    torch.testing.assert_close(a0[3], exact, rtol=0, atol=1e-5)


def test_final_average_takes_the_mean():
    """--diloco-final-average: with DiLoCo's Nesterov step (lr 0.7, momentum 0.9) for the
    first sync, the exact last one sets the model to the first sync's model minus the mean of
    the second window's moves and of every error the first sync left (its decoded mean U was
    applied as 0.7 x 1.9 x U): no extrapolation at the end."""
    res = run_distributed(_worker, 2, (False, True), timeout=120)
    start = torch.as_tensor(res[0]["start"])
    a0, a1 = (torch.as_tensor(r["after"]) for r in res)
    s0, s1 = (torch.as_tensor(r["steps"]) for r in res)
    assert torch.equal(a0[3], a1[3])
    first = a0[1]
    decoded = (start - first) / (0.7 * 1.9)
    want = first + decoded - (s0.sum(0) + s1.sum(0)) / 2
    torch.testing.assert_close(a0[3], want, rtol=0, atol=1e-5)
