"""--overlap-p2p-comm / --overlap-grad-reduce change timing only: losses and bytes are identical.

Each world size runs its flag sets (one per codec family) twice in the same spawned ranks,
synchronous and overlapped, and compares every iteration's loss exactly (fp32, CPU, dropout
off: the same messages, codec states and reductions in the same order give the same bits) and
every channel's byte count.
"""
import pytest

from tests.conftest import tiny_gpt_argv
from tests.distributed import run_distributed
from tests.training import runner

OVERLAP = {"overlap-p2p-comm": True, "overlap-grad-reduce": True,
           "ddp-bucket-size": 3000}   # several buckets even in the tiny model

# name -> flags; every codec family: activation quantisation (fixpoint), activation deltas
# with per-sample caches (delta), TAH-Quant, fixpoint gradients, CB with LEP, SC PowerSGD.
FAMILIES = {
    "plain": {},
    "fixpoint+cb": {"forward-compress-method": "fixpoint", "inter-grad-comp": True,
                    "inter-grad-comp-rank": 2, "use-error-feedback": True},
    "delta+fixpoint-bwd": {"forward-compress-method": "delta", "backward-compress-method":
                           "fixpoint", "compress-warmup-iters": 1},
    "tah+sc": {"forward-compress-method": "tah", "grad-comp": True, "grad-comp-rank": 2,
               "grad-comp-warm-up": 0.25},
}

LAYOUTS = {  # world -> (tp, pp, families)
    2: (1, 2, ["plain", "fixpoint+cb", "delta+fixpoint-bwd", "tah+sc"]),
    4: (1, 2, ["plain", "fixpoint+cb", "tah+sc"]),
    8: (2, 2, ["fixpoint+cb", "tah+sc"]),
}


def _channels(trainer):
    """Whole-job bytes per channel, and how many dp buckets started during backward."""
    import torch.distributed as dist
    from megatron.cc.common.stats import ChannelStats
    snaps = [None] * dist.get_world_size()
    dist.all_gather_object(snaps, trainer.stats.snapshot())
    dp = trainer.grad_sync.dp
    plans = [getattr(o, n, None) for o in (dp, getattr(dp, "exact", None))
             for n in ("_exact_plan", "_psgd_plan")]
    early = [(p.early, len(p.need)) for p in plans if p is not None]
    totals = ChannelStats.merge(snaps)
    waits = sorted(c for c, v in totals.items() if "seconds" in v)
    return {c: v for c, v in totals.items() if "sent" in v}, early, waits


def _worker(rank, world, corpus, tp, pp, families):
    out = {}
    for name in families:
        for overlap in (False, True):
            flags = {"tensor-model-parallel-size": tp, "pipeline-model-parallel-size": pp,
                     "train-iters": 4, **FAMILIES[name], **(OVERLAP if overlap else {})}
            out[name, overlap] = runner._run(tiny_gpt_argv(corpus, **flags), world,
                                             after_train=_channels)
    return out


@pytest.mark.parametrize("world", sorted(LAYOUTS))
def test_overlap_gives_identical_losses_and_bytes(tiny_corpus, world):
    tp, pp, families = LAYOUTS[world]
    out = run_distributed(_worker, world, (tiny_corpus, tp, pp, families), timeout=900)[-1]
    for name in families:
        (sync_losses, (sync_bytes, none, sync_waits)), (ovl_losses, (ovl_bytes, early,
                                                                     ovl_waits)) = \
            out[name, False], out[name, True]
        # both paths time every channel that crosses between ranks (emb: tied, pp > 1)
        expected = ["emb wait", "pp-bwd wait", "pp-fwd wait"] + (["dp wait"] if world > 2 else [])
        assert sync_waits == ovl_waits == sorted(expected), (name, sync_waits, ovl_waits)
        assert none == []                               # synchronous: no overlap machinery
        assert len(sync_losses) == 4 and all(l == l for l in sync_losses), name
        assert ovl_losses == sync_losses, (name, sync_losses, ovl_losses)
        assert ovl_bytes == sync_bytes, name
        assert set(sync_bytes) >= {"pp-fwd", "pp-bwd"}, name
        if world > 2:
            assert "dp" in sync_bytes, name
            # several buckets, every one started by backward itself, none left to the
            # flush after it: the plans that ran (exact warm-up, PowerSGD) cover 4 steps
            assert early and all(n > 1 and e % n == 0 for e, n in early), (name, early)
            assert sum(e // n for e, n in early) == 4, (name, early)


def test_wait_times_reach_the_log_line():
    from megatron.cc.common.stats import ChannelStats
    a, b = ChannelStats(), ChannelStats()
    a.add("pp-fwd", 100, 400)
    a.add_wait("pp-fwd", 0.030)
    b.add_wait("pp-fwd", 0.010)
    b.add_wait("dp", 0.004)
    line = ChannelStats.format(ChannelStats.merge([a.snapshot(), b.snapshot()]), iterations=2)
    # mean over the ranks that waited, per iteration: (30 + 10) / 2 / 2 ms; dp: 4 / 1 / 2 ms
    assert "pp-fwd bytes: 50B (x4.0)" in line
    assert "pp-fwd wait ms: 10.0" in line and "dp wait ms: 2.0" in line
    a.reset()
    assert a.snapshot() == {}
