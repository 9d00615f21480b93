"""Start-up probes of what --compression auto plans with: every channel's link and the compute rate.

    probes = probe_links(topo)        # collective: every rank calls it, after process groups
    rate = matmul_tflops(device, dtype)

pp: a send/recv ping-pong of a small and a large tensor between each pair of pipeline
neighbours (stage boundaries one after the other; the replicas of a boundary at once, as
training runs them). dp: an all-reduce of a small and a large tensor on every data-parallel
group at once. Each size runs WARMUP + REPS times and the median counts. The probes run on
megatron-core's pipeline and data-parallel groups (not a --pp-backend / --dp-backend clone)
with zero-filled tensors: no random draw, so the run's RNG streams are untouched.
Turning the times into bandwidth and latency is auto_compression.py's (pure functions).
"""
import statistics
import time
from dataclasses import dataclass
from typing import List, Tuple

import torch
import torch.distributed as dist

from megatron.training.runtime.topology import Topology

SMALL_BYTES = 4 * 1024
LARGE_BYTES = 1024 * 1024   # 1 MiB: ~0.4 s one way at 20 Mbit/s, so the probe stays seconds
WARMUP, REPS = 1, 5


@dataclass
class Probe:
    """Median seconds of one probe: a ping-pong round trip (pp) or one all-reduce (dp)."""
    kind: str                  # "pp" | "dp"
    ranks: Tuple[int, ...]     # global ranks: the pair (pp) or the group (dp)
    small_bytes: int
    large_bytes: int
    small_s: float
    large_s: float


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device_for(group, device: torch.device) -> torch.device:
    """NCCL needs the rank's GPU; gloo sends host tensors (as the channels stage them)."""
    return device if dist.get_backend(group) == "nccl" else torch.device("cpu")


def _median_seconds(step, device: torch.device) -> float:
    times = []
    for i in range(WARMUP + REPS):
        _sync(device)
        t0 = time.perf_counter()
        step()
        _sync(device)
        if i >= WARMUP:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _pingpong(peer: int, group, device: torch.device, first: bool, nbytes: int) -> float:
    buf = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)

    def step():
        if first:
            dist.send(buf, peer, group=group)
            dist.recv(buf, peer, group=group)
        else:
            dist.recv(buf, peer, group=group)
            dist.send(buf, peer, group=group)
    return _median_seconds(step, device)


def probe_pipeline(topo: Topology) -> List[Probe]:
    """This rank's ping-pongs with its next stage (measured by the sender side)."""
    pp, group, ranks, stage = topo.pp_size, topo.pp_group, topo.pp_ranks, topo.pp_rank
    if pp < 2:
        return []
    dev = _device_for(group, topo.device)
    out = []
    for s in range(pp - 1):   # in order: stage s + 1 answers s before it pings s + 2
        if stage == s:
            t = [_pingpong(ranks[s + 1], group, dev, True, n) for n in (SMALL_BYTES, LARGE_BYTES)]
            out.append(Probe("pp", (ranks[s], ranks[s + 1]), SMALL_BYTES, LARGE_BYTES, *t))
        elif stage == s + 1:
            for n in (SMALL_BYTES, LARGE_BYTES):
                _pingpong(ranks[s], group, dev, False, n)
    return out


def probe_data_parallel(topo: Topology) -> List[Probe]:
    """All-reduces on this rank's data-parallel group (reported by its first rank)."""
    group = topo.dp_group
    if topo.dp_size < 2:
        return []
    dev = _device_for(group, topo.device)
    t = []
    for n in (SMALL_BYTES, LARGE_BYTES):
        buf = torch.zeros(n // 4, dtype=torch.float32, device=dev)
        t.append(_median_seconds(lambda: dist.all_reduce(buf, group=group), dev))
    if topo.rank != topo.dp_ranks[0]:
        return []
    return [Probe("dp", topo.dp_ranks, SMALL_BYTES, LARGE_BYTES, *t)]


def probe_links(topo: Topology) -> List[Probe]:
    """Every rank's probes, gathered: the same list on every rank (collective)."""
    mine = probe_pipeline(topo) + probe_data_parallel(topo)
    everyone: List[List[Probe]] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return [p for theirs in everyone for p in theirs]


def matmul_tflops(device: torch.device, dtype: torch.dtype) -> float:
    """Dense TFLOP/s of one square matmul on this rank's device, the slowest rank's (all ranks
    plan with one rate). An upper bound of what a small model achieves; see the README."""
    n = 4096 if device.type == "cuda" else 256
    dtype = dtype if device.type == "cuda" else torch.float32
    a = torch.ones(n, n, dtype=dtype, device=device)
    seconds = _median_seconds(lambda: torch.mm(a, a), device)
    rates: List[float] = [None] * dist.get_world_size()
    dist.all_gather_object(rates, 2 * n ** 3 / max(seconds, 1e-9) / 1e12)
    return min(rates)
