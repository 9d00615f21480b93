"""SD-PIPE's scheduling rules for partial reduce: which stages share a scheduler, the window
that gathers ready replicas, and how a window's arrivals become groups.

Read from the seed (Miao et al., VLDB'23; `preduce_handler.cc`, `python/hetu/preduce.py`):
one scheduler per stage, the first stage following the last with a tied embedding
(`schedule_of`); a window opened by the first arrival for its own `wait` (`WindowScheduler`,
`next_wait`); above 8 replicas the arrivals pair up by dp rank (`split_window`). The values:
docs/data_parallel.md. The staleness bound and the end of training are in PartialReduceSync.
"""
import time
from typing import List, Optional, Tuple

PAIRWISE_ABOVE = 8        # the seed pairs replicas when a stage has more than this many
START_WAIT, MAX_WAIT, MIN_WAIT = 1e-3, 10e-3, 1e-5   # seconds (the seed's 1, 10, 0.01 ms)
CLOSED = 1 << 40          # added to a window's arrival counter to close it atomically
POLL = 200e-6             # the opener re-reads the arrival count (a store round trip) this often


def schedule_of(stage: int, pp: int, scope: str = "stage", tied: bool = True) -> int:
    """The pipeline stage whose scheduler `stage` follows (it asks, the others read).

    Stages with the same schedule average with the same partners in every round.
    """
    if scope not in ("stage", "replica"):
        raise ValueError(f"preduce scope must be 'stage' or 'replica', got {scope!r}")
    if scope == "replica" or pp == 1:
        return 0
    if tied and stage == 0:
        return pp - 1     # the tied embedding's two copies average with the same partners
    return stage


def pairwise_default(dp: int) -> bool:
    """The seed's rule: pairwise groups when a stage has more than 8 replicas."""
    return dp > PAIRWISE_ABOVE


def split_window(arrived: List[int], me: int, pairwise: bool) -> List[int]:
    """`me`'s group among a window's sorted arrivals: all of them, or `me`'s pair."""
    if not pairwise:
        return list(arrived)
    i = arrived.index(me)
    if i % 2:
        return [arrived[i - 1], me]
    return [me, arrived[i + 1]] if i + 1 < len(arrived) else [me]


def next_wait(wait: float, group_size: int) -> float:
    """The seed's adaptation of a replica's window after a round with `group_size` members."""
    return min(MAX_WAIT, wait * 2) if group_size < 2 else max(MIN_WAIT, wait * 0.9)


class WindowScheduler:
    """Windows of whoever arrives, kept on a store (one prefix per schedule)."""

    def __init__(self, store, dp: int):
        self.store, self.dp = store, dp

    def join(self, me: int, wait: Optional[float] = None) -> Tuple[int, List[int]]:
        """Block until this replica's window closes: (window id, sorted dp ranks in it).

        `wait` (seconds, default 1 ms) is how long the window stays open if `me` opens it.
        """
        s = self.store
        while True:
            k = s.add("cur", 0)
            idx = s.add(f"w{k}/n", 1)
            if idx < CLOSED:
                break          # else the window closed under us: cur has moved on, retry
        s.set(f"w{k}/m{idx}", str(me))
        if idx == 1:           # the opener keeps the window open, then closes it
            deadline = time.perf_counter_ns() + int((START_WAIT if wait is None else wait) * 1e9)
            while time.perf_counter_ns() < deadline and s.add(f"w{k}/n", 0) < self.dp:
                time.sleep(min(POLL, max(0.0, (deadline - time.perf_counter_ns()) / 1e9)))
            s.add("cur", 1)
            size = s.add(f"w{k}/n", CLOSED) - CLOSED
            s.set(f"w{k}/size", str(size))
        size = int(s.get(f"w{k}/size"))
        return k, sorted(int(s.get(f"w{k}/m{i}")) for i in range(1, size + 1))
