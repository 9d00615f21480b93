"""SD-PIPE partial reduce (Miao et al., VLDB'23) and the AD-PSGD baseline on the dp channel.

Both average *weights* after each replica's local optimizer step, with only some replicas:
preduce with whichever replicas a scheduler on the job's store puts in the same window
(preduce_sched.py; every `ssp_bound`-th round and the last are connected syncs of all
replicas), adpsgd in random pairs drawn from (seed, iteration). Replicas are not in lockstep
(`lockstep = False`), so the loop logs each replica's own loss. Scheduling scope and groups:
docs/data_parallel.md.
"""
import time
from collections import deque
from typing import Deque, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from megatron.cc.grad_sync.channel import SyncChannel
from megatron.cc.grad_sync.param_sync import copy_flat_, flatten, param_segments
from megatron.cc.data_parallel.preduce_sched import (START_WAIT, WindowScheduler, next_wait,
                                                 pairwise_default, split_window)
from megatron.cc.common.stats import ChannelStats
from megatron.cc.common.transport import P2PTransport

__all__ = ["PartialReduceSync", "ADPSGDSync", "WindowScheduler"]


class _GroupCache:
    """Subgroups of this stage's dp ranks, created by their members only, cached.

    A backend process group over a store prefix named by the member ranks, used directly, not
    registered with torch.distributed: torch's locally synchronised new_group names a group by
    how many groups the process already has, which differs between replicas.
    """

    def __init__(self, dp_group, store):
        self.dp_group, self.store = dp_group, store
        self.ranks = dist.get_process_group_ranks(dp_group)
        self.backend = dist.get_backend(dp_group)
        self.groups: Dict[tuple, object] = {}

    def get(self, members: List[int]):
        if len(members) == len(self.ranks):
            return self.dp_group
        key = tuple(self.ranks[m] for m in members)
        if key not in self.groups:
            me = key.index(dist.get_rank())
            store = dist.PrefixStore("group/" + "_".join(map(str, key)) + "/", self.store)
            cls = dist.ProcessGroupNCCL if self.backend == "nccl" else dist.ProcessGroupGloo
            self.groups[key] = cls(store, me, len(key))
        return self.groups[key]


def _average(params: List[torch.Tensor], group, size: int) -> int:
    flat = flatten(params)
    if isinstance(group, dist.ProcessGroup):
        dist.all_reduce(flat, group=group)
    else:                      # one of _GroupCache's own backend groups
        group.allreduce([flat]).wait()
    flat /= size
    copy_flat_(params, flat.to(params[0].device))
    return flat.numel() * flat.element_size()


class _Averaging(SyncChannel):
    """Replicas average weights after their optimizer step, each at its own pace (`_sync`)."""
    lockstep = False

    def __call__(self, model, iteration: int) -> None:
        pass   # local gradients: nothing crosses the dp group before the optimizer step

    def after_optimizer_step(self, model, iteration: int) -> None:
        t0 = time.perf_counter()
        self._sync(model, iteration)
        self.stats.observe("dp wait ms", (time.perf_counter() - t0) * 1000)


class PartialReduceSync(_Averaging):
    """dp mode `preduce`.

    Args:
        dp_group: this stage's dp group. store: a store shared by the job (prefixed per job).
        decider: this rank asks the scheduler for its schedule (tp rank 0 of the deciding
            stage); the others read its decision.
        ssp_bound: rounds between connected syncs. total_iters: the last round is connected.
        schedule: which scheduler this stage follows (preduce_sched.schedule_of: the stage
            itself, the last stage for a tied first stage, or 0 for every stage).
        pairwise: window arrivals pair up (True), average together (False), or the seed's
            rule (None: pairwise above dp 8).
    """

    def __init__(self, dp_group, stats: ChannelStats, store, decider: bool, ssp_bound: int = 10,
                 total_iters: int = 0, schedule: int = 0, pairwise: Optional[bool] = None):
        self.stats, self.store, self.decider = stats, store, decider
        self.dp_rank, self.dp = dist.get_rank(dp_group), dist.get_world_size(dp_group)
        self.groups = _GroupCache(dp_group, store)
        self.schedule = schedule
        self.scheduler = WindowScheduler(dist.PrefixStore(f"sched{schedule}/", store), self.dp)
        self.pairwise = pairwise_default(self.dp) if pairwise is None else pairwise
        self.wait = START_WAIT             # this replica's window, if it opens one
        self.ssp_bound, self.total_iters = ssp_bound, total_iters
        # the latest rounds' (window id or -1, group), for tests and inspection
        self.rounds: Deque[Tuple[int, List[int]]] = deque(maxlen=4096)

    def connected(self, iteration: int) -> bool:
        """The staleness bound: every ssp_bound-th round, and the last, averages everyone."""
        return (iteration + 1) % self.ssp_bound == 0 or iteration + 1 == self.total_iters

    def members(self, iteration: int) -> Tuple[int, List[int]]:
        """(window id, this replica's group as sorted dp ranks); window -1: connected sync."""
        if self.connected(iteration):
            return -1, list(range(self.dp))
        key = f"dec/{self.schedule}/{self.dp_rank}/{iteration}"
        if self.decider:
            k, arrived = self.scheduler.join(self.dp_rank, self.wait)
            group = split_window(arrived, self.dp_rank, self.pairwise)
            self.wait = next_wait(self.wait, len(group))
            self.store.set(key, f"{k}:" + ",".join(map(str, group)))
            return k, group
        k, group = self.store.get(key).decode().split(":")
        return int(k), [int(m) for m in group.split(",")]

    def _sync(self, model, iteration: int) -> None:
        window, members = self.members(iteration)
        self.rounds.append((window, members))
        self.stats.observe("dp group", len(members))   # the seed's mean partner count
        params = [p for ps_ in param_segments(model).values() for p in ps_]
        raw = sum(p.numel() for p in params) * 4
        sent = 0
        if len(members) > 1:
            sent = _average(params, self.groups.get(members), len(members))
        self.stats.add("dp", sent, raw)


class ADPSGDSync(_Averaging):
    """dp mode `adpsgd`: pairs from a permutation seeded by (seed, iteration) average weights."""

    def __init__(self, dp_group, stats: ChannelStats, seed: int = 0):
        self.stats, self.seed = stats, seed
        self.dp_rank, self.dp = dist.get_rank(dp_group), dist.get_world_size(dp_group)
        self.ranks = dist.get_process_group_ranks(dp_group)
        self.group = dp_group
        self.transport = P2PTransport(dp_group)

    def partner(self, iteration: int):
        perm = torch.randperm(self.dp, generator=torch.Generator().manual_seed(
            self.seed * 7919 + iteration)).tolist()
        pos = perm.index(self.dp_rank)
        if pos == self.dp - 1 and self.dp % 2:
            return None
        return perm[pos ^ 1]

    def _sync(self, model, iteration: int) -> None:
        params = [p for ps_ in param_segments(model).values() for p in ps_]
        mine = flatten(params)
        raw = mine.numel() * 4
        other = self.partner(iteration)
        if other is None:
            self.stats.add("dp", 0, raw)
            return
        theirs = torch.empty_like(mine)
        peer = self.ranks[other]
        # one batch of isend + irecv; gloo moves host memory only, so the transport stages
        # CUDA weights through pinned host buffers there (NCCL takes them as they are)
        self.transport.exchange([(mine, peer)], [(theirs, peer)])
        # lower dp rank first: both ends compute the same float sum
        avg = (mine + theirs if self.dp_rank < other else theirs + mine) / 2
        copy_flat_(params, avg.to(params[0].device))
        self.stats.add("dp", mine.numel() * mine.element_size(), raw)
