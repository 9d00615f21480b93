"""When DiLoCo's replicas sync (--diloco-sync-steps): every H inner steps, or after listed
steps and every H after the last; and the rule that lists them from the learning rate.

Why a schedule: the replicas drift apart between syncs by about lr^2 per step (their
independent noise), so fixed windows of H steps drift most while the learning rate is high and
little once it has decayed. Windows of equal sum of lr^p over the run's own schedule (p = 2:
equal drift, the quadratic synchronisation rule of Gu et al., ICLR 2024, which grows H as
(alpha / lr)^2) sync often early and rarely late for the same number of syncs, and end closer
to all-reduce than fixed windows at the same bytes (docs/data_parallel.md).
"""
import re
from typing import Sequence, Tuple

RULE = re.compile(r"lr(\d+(?:\.\d+)?):(\d+)$")


def shortest_window(sync_steps) -> int:
    """The fewest inner steps between two syncs of a schedule (from step 0)."""
    return min(b - a for a, b in zip((0,) + tuple(sync_steps), sync_steps))


def scheduled(step: int, H: int, sync_steps=()) -> bool:
    """Whether an unfragmented run syncs after inner step `step` (1-based): every H steps, or
    at each of `sync_steps` (increasing) and every H steps after the last of them."""
    if sync_steps and step <= sync_steps[-1]:
        return step in sync_steps
    return (step - (sync_steps[-1] if sync_steps else 0)) % H == 0


def previous_sync(step: int, H: int, sync_steps=()) -> int:
    """The last sync step before `step` under `scheduled` (0: the start)."""
    if sync_steps and step <= sync_steps[-1]:
        return max((s for s in sync_steps if s < step), default=0)
    last = sync_steps[-1] if sync_steps else 0
    return last + (step - 1 - last) // H * H


def equal_lr_windows(lrs: Sequence[float], power: float, syncs: int) -> Tuple[int, ...]:
    """`syncs` sync steps (1-based, the last = len(lrs)) cutting iterations 0 .. len(lrs) - 1
    into windows of about equal sum of lr^power; each sync after the first step at which the
    running sum reaches its share, windows of at least one step."""
    if not 1 <= syncs <= len(lrs):
        raise ValueError(f"need 1 <= syncs <= {len(lrs)} iterations, got {syncs}")
    total, run, out = sum(lr ** power for lr in lrs), 0.0, []
    for i, lr in enumerate(lrs):
        run += lr ** power
        k = len(out) + 1
        left = len(lrs) - (i + 1)   # steps after this one, one per sync still to place
        # (1 - 1e-9): a constant rate's sums reach their shares despite float rounding
        if k < syncs and (run >= total * k / syncs * (1 - 1e-9) or left == syncs - k):
            out.append(i + 1)
    return tuple(out) + (len(lrs),)


def parse_rule(text: str):
    """'lr2:6' -> (2.0, 6); anything else -> None."""
    m = RULE.match(text.strip())
    return (float(m.group(1)), int(m.group(2))) if m else None
