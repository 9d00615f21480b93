"""SD-PIPE partial reduce (Miao et al., VLDB'23) and the AD-PSGD baseline on the dp channel.

Both average *weights* after each replica's local optimizer step, with only some replicas:

preduce   a scheduler on torch.distributed's store forms groups of whoever is ready: the
          first replica to arrive opens a window of `wait` seconds; everyone arriving before
          it closes (or all dp replicas, which closes it at once) forms the group, which
          averages its weights with one all-reduce. `wait` adapts: doubled (up to 10 ms) when
          fewer than 2 joined, else x0.9 (down to 0.01 ms). Staleness bound: every
          `ssp_bound`-th round of a replica (dp x ssp_bound updates of the whole group), and
          the last one, is a connected sync: all replicas average (ssp_bound = 1: every step,
          which with plain SGD is exactly gradient all-reduce).
adpsgd    random pairwise averaging: a permutation drawn from (seed, iteration) pairs the
          replicas (one sits out when dp is odd); each pair swaps and averages its weights.

A pipeline replica is one machine: stage 0, tp rank 0 of each replica talks to the scheduler
and publishes the group under (dp rank, round); every other stage and tp rank of the replica
reads it, so all stages of a replica average with the same partners and end at the same
batch, and the tied embedding's two copies stay equal. Groups (global ranks of this stage's
members) are created on demand, only by their members, over the job's store, and cached.

Replicas are not in lockstep here (`lockstep = False`): the training loop then logs the
replica's own loss instead of all-reducing it over the dp group every iteration.
"""
import time
from typing import Dict, List, Tuple

import torch
import torch.distributed as dist

from megatron.cc.grad_sync.param_sync import copy_flat_, flatten, param_segments
from megatron.cc.stats import ChannelStats

CLOSED = 1 << 40   # added to a window's arrival counter to close it atomically


class WindowScheduler:
    """Groups of whoever arrives within an adaptive window, kept on a (prefix) store."""

    def __init__(self, store, dp: int, start: float = 1e-3, max_wait: float = 10e-3,
                 min_wait: float = 1e-5):
        self.store, self.dp = store, dp
        self.start, self.max_wait, self.min_wait = start, max_wait, min_wait

    def _wait_ns(self) -> int:
        v = self.store.add("wait_ns", 0)   # 0: never set
        return v or int(self.start * 1e9)

    def join(self, me: int) -> Tuple[int, List[int]]:
        """Block until this replica's group is known: (window id, sorted dp ranks)."""
        s = self.store
        while True:
            k = s.add("cur", 0)
            idx = s.add(f"w{k}/n", 1)
            if idx < CLOSED:
                break          # else the window closed under us: cur has moved on, retry
        s.set(f"w{k}/m{idx}", str(me))
        if idx == 1:           # the opener keeps the window open, then closes it
            wait = self._wait_ns()
            deadline = time.perf_counter_ns() + wait
            while time.perf_counter_ns() < deadline and s.add(f"w{k}/n", 0) < self.dp:
                time.sleep(min(50e-6, max(0.0, (deadline - time.perf_counter_ns()) / 1e9)))
            s.add("cur", 1)
            size = s.add(f"w{k}/n", CLOSED) - CLOSED
            new = min(self.max_wait * 1e9, wait * 2) if size < 2 else \
                max(self.min_wait * 1e9, wait * 0.9)
            s.add("wait_ns", int(new) - s.add("wait_ns", 0))
            s.set(f"w{k}/size", str(size))
        size = int(s.get(f"w{k}/size"))
        return k, sorted(int(s.get(f"w{k}/m{i}")) for i in range(1, size + 1))


class _GroupCache:
    """Subgroups of this stage's dp ranks, created by their members only, cached.

    torch's new_group(use_local_synchronization=True) names a group after its ranks *and* the
    number of groups the calling process already has, which differs between replicas that have
    met different partners, so members would wait for each other under different names. A
    backend process group over our own store prefix (the member ranks) has one name
    everywhere; it is used directly (group.allreduce), not registered with torch.distributed.
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


class PartialReduceSync:
    """dp mode `preduce`.

    Args:
        dp_group: this stage's dp group. store: a store shared by the job (prefixed per job).
        decider: this rank talks to the scheduler for its replica (stage 0, tp rank 0).
        ssp_bound: rounds between connected syncs. total_iters: the last round is connected.
    """
    lockstep = False

    def __init__(self, dp_group, stats: ChannelStats, store, decider: bool, ssp_bound: int = 10,
                 total_iters: int = 0):
        self.stats, self.store, self.decider = stats, store, decider
        self.dp_rank, self.dp = dist.get_rank(dp_group), dist.get_world_size(dp_group)
        self.groups = _GroupCache(dp_group, store)
        self.scheduler = WindowScheduler(store, self.dp)
        self.ssp_bound, self.total_iters = ssp_bound, total_iters
        self.group_sizes: List[int] = []   # for tests and logs

    def __call__(self, model, iteration: int) -> None:
        pass   # local gradients: nothing crosses the dp group before the optimizer step

    def members(self, iteration: int) -> List[int]:
        if (iteration + 1) % self.ssp_bound == 0 or iteration + 1 == self.total_iters:
            return list(range(self.dp))   # connected sync: everyone
        key = f"dec/{self.dp_rank}/{iteration}"
        if self.decider:
            _, members = self.scheduler.join(self.dp_rank)
            self.store.set(key, ",".join(map(str, members)))
            return members
        return [int(m) for m in self.store.get(key).decode().split(",")]

    def after_optimizer_step(self, model, iteration: int) -> None:
        t0 = time.perf_counter()
        self._sync(model, iteration)
        self.stats.observe("dp wait ms", (time.perf_counter() - t0) * 1000)

    def _sync(self, model, iteration: int) -> None:
        members = self.members(iteration)
        self.group_sizes.append(len(members))
        params = [p for ps_ in param_segments(model).values() for p in ps_]
        raw = sum(p.numel() for p in params) * 4
        sent = 0
        if len(members) > 1:
            sent = _average(params, self.groups.get(members), len(members))
        self.stats.add("dp", sent, raw)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, sd: dict) -> None:
        pass


class ADPSGDSync:
    """dp mode `adpsgd`: pairs from a permutation seeded by (seed, iteration) average weights."""
    lockstep = False

    def __init__(self, dp_group, stats: ChannelStats, seed: int = 0):
        self.stats, self.seed = stats, seed
        self.dp_rank, self.dp = dist.get_rank(dp_group), dist.get_world_size(dp_group)
        self.ranks = dist.get_process_group_ranks(dp_group)
        self.group = dp_group

    def partner(self, iteration: int):
        perm = torch.randperm(self.dp, generator=torch.Generator().manual_seed(
            self.seed * 7919 + iteration)).tolist()
        pos = perm.index(self.dp_rank)
        if pos == self.dp - 1 and self.dp % 2:
            return None
        return perm[pos ^ 1]

    def __call__(self, model, iteration: int) -> None:
        pass

    def after_optimizer_step(self, model, iteration: int) -> None:
        t0 = time.perf_counter()
        self._sync(model, iteration)
        self.stats.observe("dp wait ms", (time.perf_counter() - t0) * 1000)

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
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, peer, self.group),
                                       dist.P2POp(dist.irecv, theirs, peer, self.group)])
        for r in reqs:
            r.wait()
        # lower dp rank first: both ends compute the same float sum
        avg = (mine + theirs if self.dp_rank < other else theirs + mine) / 2
        copy_flat_(params, avg.to(params[0].device))
        self.stats.add("dp", mine.numel() * mine.element_size(), raw)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, sd: dict) -> None:
        pass
