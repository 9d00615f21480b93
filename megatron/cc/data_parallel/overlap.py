"""--overlap-grad-reduce: dp gradients synchronised bucket by bucket while backward still runs.

A hook after megatron DDP's own on every gradient accumulator posts a bucket's communication
asynchronously once all its parameters have their last micro-batch's gradient; the optimizer
step waits for all of it. Exact buckets are scaled and all-reduced as megatron DDP does;
PowerSGD buckets post their P all-reduce during backward and finish after it. Arithmetic and
byte counts are the synchronous classes' (bit-identical at 2 replicas; otherwise equal to float
rounding). Buckets become ready in autograd's order, the same on every replica, so every rank
posts the collectives in the same order.
"""
import time
from typing import Callable, List, Optional

import torch
import torch.distributed as dist

from megatron.cc.grad_sync.channel import SyncChannel
from megatron.cc.data_parallel.powersgd import PowerSGDDataParallelSync
from megatron.cc.grad_sync.sync import (ExactDataParallelSync, check_ddp_supported,
                                        shared_embedding_weight)

DEFAULT_BUCKET_SIZE = 40_000_000   # megatron-core's default: max(40M, 1M x dp) elements


def default_bucket_size(dp: int) -> int:
    return max(DEFAULT_BUCKET_SIZE, 1_000_000 * dp)


class ReadyBuckets:
    """Calls start(i) once every parameter of bucket i has had `count` gradients this step."""

    def __init__(self, buckets: List[list], count: int, start: Callable[[int], None]):
        self.bucket_of = {p: i for i, ps in enumerate(buckets) for p in ps}
        self.need = [len(ps) * count for ps in buckets]
        self.start = start
        self.left: List[int] = []
        self.started: List[bool] = []
        self.early = 0   # buckets started by their last gradient (not by flush), ever
        self.reset()

    def reset(self) -> None:
        self.left = list(self.need)
        self.started = [False] * len(self.need)

    def param_ready(self, param) -> None:
        i = self.bucket_of.get(param)
        if i is None or self.started[i]:
            return
        self.left[i] -= 1
        if self.left[i] == 0:
            self.early += 1
            self._start(i)

    def flush(self) -> None:
        """Start what never became ready (a parameter without a gradient this step)."""
        for i in range(len(self.need)):
            if not self.started[i]:
                self._start(i)

    def _start(self, i: int) -> None:
        self.started[i] = True
        self.start(i)


def install_grad_ready_hooks(model, callback: Callable) -> list:
    """callback(param) after each gradient accumulation of param (after megatron DDP's hook).

    Hooks on the same AccumulateGrad node run in registration order and DDP registered its
    own at construction, so `main_grad` already holds the gradient when ours runs. Returns
    the nodes: they must stay referenced for the hooks to live.
    """
    nodes = []
    for p in model.parameters():
        if p.requires_grad:
            node = p.expand_as(p).grad_fn.next_functions[0][0]
            node.register_hook(lambda *_, p=p: callback(p))
            nodes.append(node)
    return nodes


def cut(sizes: List[int], bucket_size: int) -> List[List[int]]:
    """Consecutive indices grouped until each group holds >= bucket_size elements."""
    groups, cur, n = [], [], 0
    for i, s in enumerate(sizes):
        cur.append(i)
        n += s
        if n >= bucket_size:
            groups.append(cur)
            cur, n = [], 0
    if cur:
        groups.append(cur)
    return groups


class _Overlapped(SyncChannel):
    """Shared by both modes: hooks installed once, one ReadyBuckets plan per mode."""

    overlapped = True
    _nodes: Optional[list] = None   # the hooked gradient accumulators, once installed
    _plan: Optional[ReadyBuckets] = None   # the plan armed by `begin` for this step

    def _install(self, model, num_microbatches: int) -> None:
        if self._nodes is None:
            self._nodes = install_grad_ready_hooks(model, self._param_ready)
        self.num_microbatches = num_microbatches

    def _param_ready(self, p) -> None:
        if self._plan is not None:
            self._plan.param_ready(p)

    def _wait(self, works) -> None:
        t0 = time.perf_counter()
        for w in works:
            w.wait()
        if self.world > 1:   # nothing crosses a group of one
            self.stats.add_wait("dp", time.perf_counter() - t0)


class OverlappedExactSync(ExactDataParallelSync, _Overlapped):
    """ExactDataParallelSync with each bucket all-reduced as soon as backward produced it."""

    def __init__(self, group, stats, exclude_embedding: bool = False,
                 bucket_size: Optional[int] = None, num_microbatches: int = 1):
        super().__init__(group, stats, exclude_embedding)
        self.bucket_size = bucket_size or default_bucket_size(self.world)
        self.num_microbatches = num_microbatches
        self._segments: List[list] = []   # bucket -> [(ddp bucket, start, end)]
        self._works: list = []
        self._exact_plan: Optional[ReadyBuckets] = None

    def begin(self, model, iteration: int) -> None:
        """Before forward/backward: arm the hooks for this step."""
        self._install(model, self.num_microbatches)
        if self._exact_plan is None:
            self._exact_plan = self._build_plan(model)
        self._exact_plan.reset()
        self._plan, self._works = self._exact_plan, []

    def _build_plan(self, model) -> ReadyBuckets:
        check_ddp_supported(model)
        self._op = dist.ReduceOp.AVG if model.ddp_config.average_in_collective \
            else dist.ReduceOp.SUM
        skip = shared_embedding_weight(model) if self.exclude_embedding else None
        self._has_hole = skip is not None
        params = []
        for buf in model.buffers:
            for bucket in buf.buckets:
                ranges = sorted(((bucket.param_to_index[p], p) for p in bucket.params_list
                                 if p is not skip), key=lambda x: x[0][0])
                groups = cut([b - a for (a, b), _ in ranges], self.bucket_size)
                end_of_bucket = bucket.grad_data.numel()
                hole = bucket.param_to_index[skip] if skip in bucket.params else None
                for gi, g in enumerate(groups):
                    start = 0 if gi == 0 else ranges[g[0]][0][0]
                    stop = end_of_bucket if gi == len(groups) - 1 else \
                        ranges[groups[gi + 1][0]][0][0]
                    segs = [(bucket, start, stop)]
                    if hole is not None and start <= hole[0] < stop:   # leave the embedding out
                        segs = [(bucket, a, b) for a, b in ((start, hole[0]), (hole[1], stop))
                                if b > a]
                    self._segments.append(segs)
                    params.append([ranges[i][1] for i in g])
        self._sent = sum((b - a) * bucket.grad_data.element_size()
                         for segs in self._segments for bucket, a, b in segs)
        return ReadyBuckets(params, self.num_microbatches, self._start_bucket)

    def _start_bucket(self, i: int) -> None:
        for bucket, a, b in self._segments[i]:
            seg = bucket.grad_data[a:b]
            if bucket.gradient_scaling_factor != 1.0:
                seg *= bucket.gradient_scaling_factor   # megatron's order: scale, then sum
            self._works.append(dist.all_reduce(seg, op=self._op, group=self.group, async_op=True))

    def __call__(self, model, iteration: int) -> None:
        if self._exact_plan is None or self._plan is not self._exact_plan:
            return super().__call__(model, iteration)   # begin() not called: synchronous
        self._plan.flush()
        self._plan = None
        self._wait(self._works)
        self._works = []
        if self.world > 1:   # counted as the synchronous path counts them
            n = self._sent if self.exclude_embedding and self._has_hole else \
                sum(b.grad_data.numel() * b.grad_data.element_size() for b in model.buffers)
            self.stats.add("dp", n, n)


class OverlappedPowerSGDSync(PowerSGDDataParallelSync, _Overlapped):
    """PowerSGDDataParallelSync whose buckets start their P all-reduce during backward.

    The warm-up iterations run OverlappedExactSync. State (Q, E) and checkpoints are the
    parent's: a checkpoint written with overlap loads without, and the other way round.
    """

    def __init__(self, group, stats, rank: int = 128, warm_up_iters: int = 0,
                 exclude_embedding: bool = False, seed: int = 0, eps: float = 1e-8,
                 bucket_size: Optional[int] = None, num_microbatches: int = 1):
        super().__init__(group, stats, rank=rank, warm_up_iters=warm_up_iters,
                         exclude_embedding=exclude_embedding, seed=seed, eps=eps)
        self.exact = OverlappedExactSync(group, stats, exclude_embedding, bucket_size,
                                         num_microbatches)
        self.bucket_size = self.exact.bucket_size
        self.num_microbatches = num_microbatches
        self._psgd_plan: Optional[ReadyBuckets] = None
        self._buckets: List[tuple] = []   # ("lowrank", [compress index]) | ("exact", [tensors])

    def begin(self, model, iteration: int) -> None:
        if iteration < self.warm_up_iters:
            self.exact.begin(model, iteration)
            return
        self._install(model, self.num_microbatches)
        if self._psgd_plan is None:
            self._psgd_plan = self._build_plan(model)
        self._psgd_plan.reset()
        self._plan, self._pending_p, self._exact_works = self._psgd_plan, {}, []

    def _build_plan(self, model) -> ReadyBuckets:
        compress, exact, factor = self._layout_of(model)
        if compress:
            self.init_state(compress)
        by_grad = {}
        for buf in model.buffers:
            for p in buf.params:
                by_grad[p.main_grad.data_ptr()] = p
        params_of = lambda t: by_grad[t.data_ptr()]   # noqa: E731  (a view starts where main_grad does)
        params = []
        for g in cut([M.numel() for _, M in compress], self.bucket_size):
            self._buckets.append(("lowrank", g))
            params.append([params_of(compress[i][1]) for i in g])
        for g in cut([t.numel() for t in exact], self.bucket_size):
            self._buckets.append(("exact", [exact[i] for i in g]))
            params.append([params_of(exact[i]) for i in g])
        self._compress, self._factor = compress, factor
        self._ps, self._qs = self._views(compress) if compress else ([], [])
        return ReadyBuckets(params, self.num_microbatches, self._start_bucket)

    def _start_bucket(self, i: int) -> None:
        kind, members = self._buckets[i]
        if kind == "exact":
            flat = torch.cat([t.reshape(-1) for t in members])
            if self._factor != 1.0:
                flat.mul_(self._factor)   # megatron's order: scale, then sum
            work = dist.all_reduce(flat, group=self.group, async_op=True)
            self._exact_works.append((work, flat, members))
            return
        for j in members:   # first half of PowerSGD for this bucket's matrices
            name, M = self._compress[j]
            self._project(name, M, self._ps[j], self._qs[j])
        self._pending_p[i] = dist.all_reduce(self._flat_range(self._p_flat, self._ps, members), group=self.group,
                                             async_op=True)

    @staticmethod
    def _flat_range(flat, views, members):
        """The slice of `flat` holding views[members[0]] .. views[members[-1]] (consecutive)."""
        size = flat.element_size()
        a = (views[members[0]].data_ptr() - flat.data_ptr()) // size
        b = (views[members[-1]].data_ptr() - flat.data_ptr()) // size + views[members[-1]].numel()
        return flat[a:b]

    def __call__(self, model, iteration: int) -> None:
        if iteration < self.warm_up_iters:
            self.exact(model, iteration)
            return
        if self._psgd_plan is None or self._plan is not self._psgd_plan:
            return super().__call__(model, iteration)   # begin() not called: synchronous
        self._plan.flush()
        self._plan = None
        q_works = []
        for i, work in self._pending_p.items():   # second half, bucket by bucket
            self._wait([work])
            members = self._buckets[i][1]
            q_prev = []
            for j in members:
                q_prev.append(self._qs[j].clone())
                self._back_project(self._compress[j][1], self._ps[j], self._qs[j])
            q_works.append((dist.all_reduce(self._flat_range(self._q_flat, self._qs, members),
                                            group=self.group, async_op=True), members, q_prev))
        post = self._factor * self.world
        for work, members, q_prev in q_works:
            self._wait([work])
            for j, Q_prev in zip(members, q_prev):
                name, M = self._compress[j]
                self._qs[j].div_(self.world)
                self._rebuild(name, M, self._ps[j], self._qs[j], Q_prev, post)
        for work, flat, members in self._exact_works:
            self._wait([work])
            offset = 0
            for t in members:
                t.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()
        self._pending_p, self._exact_works = {}, []
        if self.world > 1:
            self.stats.add("dp", *self._bytes())

    def _bytes(self):
        exact = sum(t.numel() * t.element_size() for kind, m in self._buckets if kind == "exact"
                    for t in m)
        lowrank = sum(M.numel() * M.element_size() for _, M in self._compress)
        sent = exact
        if self._compress:
            sent += (self._p_flat.numel() * self._p_flat.element_size()
                     + self._q_flat.numel() * self._q_flat.element_size())
        return sent, exact + lowrank
