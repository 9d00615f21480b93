"""SD-PIPE partial reduce at dp 16: per-stage schedules, pairwise groups, staleness bound.

The seed's rules (preduce_sched.py) on their own, then one spawn of 16 gloo ranks that runs
PartialReduceSync on small weights (a Linear(4, 3) per stage) with random per-stage delays:

- "stage" (the default, pairwise by the seed's rule at dp 16): three logical pipeline stages
  per rank with a tied embedding, one thread each with its own dp group: stage 0 follows
  stage 2's groups round by round, stage 1 forms its own; every window's groups are the
  consecutive pairs of its sorted arrivals; every 4th round and the last average all 16;
- "replica_window": two stages following stage 0 (--preduce-scope replica), whole windows
  averaging together (--preduce-groups window);
- "ssp1": --ssp-bound 1 gives exactly the all-reduce mean every round.
Every averaged value is checked against the mean of the members' weights before the round,
over the groups the ranks actually formed.
"""
import random
import threading
import time
import traceback

import pytest
import torch
import torch.distributed as dist

from megatron.cc.data_parallel.preduce_sched import (MAX_WAIT, MIN_WAIT, next_wait,
                                                 pairwise_default, schedule_of, split_window)
from tests.distributed import run_distributed

DP = 16
ALL = list(range(DP))


# ------------------------------------------------------------------------- the seed's rules
@pytest.mark.parametrize("pp,scope,tied,expect", [
    (1, "stage", True, [0]),
    (2, "stage", False, [0, 1]),
    (2, "stage", True, [1, 1]),          # first and last stage: one schedule (tied copies)
    (4, "stage", True, [3, 1, 2, 3]),
    (4, "stage", False, [0, 1, 2, 3]),
    (4, "replica", True, [0, 0, 0, 0]),  # stage 0 decides for the replica
])
def test_schedule_of(pp, scope, tied, expect):
    assert [schedule_of(s, pp, scope, tied) for s in range(pp)] == expect


def test_pairwise_above_8_and_pairs_in_rank_order():
    assert not pairwise_default(8) and pairwise_default(9) and pairwise_default(16)
    arrived = [1, 4, 5, 9, 12]
    assert [split_window(arrived, m, True) for m in arrived] == \
        [[1, 4], [1, 4], [5, 9], [5, 9], [12]]
    assert split_window(arrived, 5, False) == arrived


def test_wait_doubles_when_alone_and_shrinks_otherwise():
    assert next_wait(1e-3, 1) == 2e-3 and next_wait(8e-3, 1) == MAX_WAIT
    assert next_wait(1e-3, 2) == pytest.approx(0.9e-3) and next_wait(MIN_WAIT, 5) == MIN_WAIT


# ----------------------------------------------------------------------------- dp 16 spawn
def _flat(lin):
    return torch.cat([p.detach().reshape(-1) for p in lin.parameters()]).clone()


def _client(tag):
    """A store connection of one stage's own: a blocked get holds its connection, so stages in
    threads of one process must not share one (in a job each stage is its own process)."""
    import os
    from datetime import timedelta
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=timedelta(seconds=120))
    return dist.PrefixStore(f"{tag}/", store)


def _stages(rank, groups, tag, pp, scope, pairwise, ssp_bound, rounds, tied=True,
            reference=False):
    """Run `pp` logical stages of this replica, one thread each (`groups`: their dp groups):
    per stage, per round, (window, group, weights before, weights after, the all-reduce mean
    of before or None)."""
    from megatron.cc.data_parallel.preduce_sync import PartialReduceSync
    from megatron.cc.common.stats import ChannelStats
    syncs = []
    for s in range(pp):
        sched = schedule_of(s, pp, scope, tied)
        store = _client(tag)
        sync = PartialReduceSync(groups[s], ChannelStats(), store, decider=s == sched,
                                 ssp_bound=ssp_bound, total_iters=rounds, schedule=sched,
                                 pairwise=pairwise)
        # in a job the stages' ranks differ and so do their subgroups' names; here the logical
        # stages share the processes, so each names its subgroups under a prefix of its own
        sync.groups.store = dist.PrefixStore(f"stage{s}/", store)
        syncs.append(sync)
    out, errors = [None] * pp, []

    def run(s):
        try:
            rng = random.Random(1000 * rank + 17 * s)    # each stage its own speed pattern
            gen = torch.Generator().manual_seed(1000 * rank + s)
            lin = torch.nn.Linear(4, 3)
            with torch.no_grad():
                for p in lin.parameters():
                    p.copy_(torch.randn(p.shape, generator=gen))
            rec = []
            for it in range(rounds):
                time.sleep(rng.random() * 0.015)
                with torch.no_grad():                    # the replica's local step
                    for p in lin.parameters():
                        p.add_(0.1 * torch.randn(p.shape, generator=gen))
                before = _flat(lin)
                syncs[s].after_optimizer_step(lin, it)
                window, group = syncs[s].rounds[-1]
                ref = None
                if reference:
                    ref = before.clone()
                    dist.all_reduce(ref, group=groups[s])
                    ref /= DP
                rec.append((window, list(group), before.numpy(), _flat(lin).numpy(),
                            None if ref is None else ref.numpy()))
            out[s] = rec
        except BaseException:
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=run, args=(s,)) for s in range(pp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(errors[0])
    return out


def _worker(rank, world):
    assert world == DP
    groups = [dist.new_group(ALL) for _ in range(3)]   # the logical stages' dp groups
    return {"stage": _stages(rank, groups, "stage", 3, "stage", None, ssp_bound=4, rounds=8),
            "replica_window": _stages(rank, groups, "replica", 2, "replica", False,
                                      ssp_bound=10, rounds=5),
            "ssp1": _stages(rank, groups, "ssp1", 1, "stage", None, ssp_bound=1, rounds=3,
                            reference=True)}


@pytest.fixture(scope="module")
def dp16():
    return run_distributed(_worker, DP, timeout=300)


def _check_averages(res, name, stage):
    """Each rank's weights after a round == the mean of its group's weights before it."""
    before = {}
    for rank, r in enumerate(res):
        for it, (window, group, b, _, _) in enumerate(r[name][stage]):
            before[(window if window >= 0 else ("all", it), rank)] = torch.from_numpy(b).double()
    for rank, r in enumerate(res):
        for it, (window, group, b, after, _) in enumerate(r[name][stage]):
            w = window if window >= 0 else ("all", it)
            mean = torch.stack([before[(w, m)] for m in group]).mean(0)
            assert torch.allclose(torch.from_numpy(after).double(), mean, rtol=0, atol=1e-6), \
                (name, stage, rank, it, group)


def _windows(res, name, stage):
    """{window: {rank: group}} of one stage's partial rounds."""
    out = {}
    for rank, r in enumerate(res):
        for window, group, *_ in r[name][stage]:
            if window >= 0:
                assert rank in group
                assert rank not in out.setdefault(window, {}), "joined one window twice"
                out[window][rank] = group
    return out


def test_per_stage_pairwise_groups_at_dp16(dp16):
    res = dp16
    for rank, r in enumerate(res):
        recs = r["stage"]
        assert [len(x) for x in recs] == [8, 8, 8]      # every stage stops at the same batch
        for it in range(8):
            for s in range(3):
                window, group = recs[s][it][:2]
                if it in (3, 7):                        # every 4th round and the last
                    assert window == -1 and group == ALL, (rank, s, it, group)
                else:
                    assert window >= 0 and 1 <= len(group) <= 2, (rank, s, it, group)
            # the tied first stage follows the last stage's schedule, round by round
            assert recs[0][it][:2] == recs[2][it][:2]
    # groups: the consecutive pairs of each window's sorted arrivals (the seed above dp 8)
    for s in (1, 2):
        for window, members in _windows(res, "stage", s).items():
            arrived = sorted(members)
            for m, group in members.items():
                assert group == split_window(arrived, m, True), (s, window, arrived, group)
    # stage 1 schedules on its own: its partners differ from stage 2's somewhere
    assert any(r["stage"][1][it][1] != r["stage"][2][it][1]
               for r in res for it in (0, 1, 2, 4, 5, 6))
    for s in range(3):
        _check_averages(res, "stage", s)
        last = [torch.from_numpy(r["stage"][s][-1][3]) for r in res]
        assert all(torch.allclose(x, last[0], rtol=0, atol=1e-6) for x in last)


def test_replica_scope_and_whole_windows(dp16):
    res = dp16
    for r in res:
        a, b = r["replica_window"]
        assert [x[:2] for x in a] == [x[:2] for x in b]    # stage 1 follows stage 0
        assert a[-1][:2] == (-1, ALL)
    for window, members in _windows(res, "replica_window", 0).items():
        for group in members.values():
            assert group == sorted(members), (window, members)   # the window averages whole
    for s in range(2):
        _check_averages(res, "replica_window", s)


def test_ssp_bound_1_is_all_reduce(dp16):
    for r in dp16:
        for window, group, before, after, ref in r["ssp1"][0]:
            assert window == -1 and group == ALL
            assert torch.equal(torch.from_numpy(after), torch.from_numpy(ref))
    _check_averages(dp16, "ssp1", 0)
