"""Wire-byte accounting per channel.

Every channel adds what it actually puts on the wire (payload numel * element_size) and what
the same message would have cost uncompressed, so the log line can print real ratios. Counters
are plain Python ints on the host: counting never forces a device sync.
"""
from collections import defaultdict
from typing import Dict, Iterable

import torch

CHANNELS = ("pp-fwd", "pp-bwd", "dp", "emb")


def nbytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class ChannelStats:
    """Bytes sent (and their uncompressed equivalent) per channel since the last reset."""

    def __init__(self):
        self.sent: Dict[str, int] = defaultdict(int)
        self.raw: Dict[str, int] = defaultdict(int)
        self.messages: Dict[str, int] = defaultdict(int)
        self.diagnostics: Dict[str, list] = {}   # name -> [sum, count]
        self.wait: Dict[str, float] = defaultdict(float)  # seconds the step blocked on a channel

    def add_wait(self, channel: str, seconds: float) -> None:
        """Host time spent waiting for `channel`'s transfers (a clock; no device sync)."""
        self.wait[channel] += seconds

    def observe(self, name: str, value) -> None:
        """A diagnostic value (float or 0-dim tensor, summed on its device and read only by
        `snapshot`, at log intervals); the log prints its mean over the interval."""
        acc = self.diagnostics.setdefault(name, [0.0, 0])
        acc[0] += value
        acc[1] += 1

    def add(self, channel: str, sent: int, raw: int) -> None:
        self.sent[channel] += sent
        self.raw[channel] += raw
        self.messages[channel] += 1

    def reset(self) -> None:
        self.sent.clear()
        self.raw.clear()
        self.messages.clear()
        self.diagnostics.clear()
        self.wait.clear()

    def snapshot(self) -> Dict[str, Dict[str, int]]:
        snap = {c: {"sent": self.sent[c], "raw": self.raw[c], "messages": self.messages[c]}
                for c in CHANNELS if self.messages[c]}
        for name, (total, count) in self.diagnostics.items():
            snap[name] = {"sum": float(total), "count": count}  # the one sync, at log time
        for c in CHANNELS:
            if self.wait.get(c):
                snap[f"{c} wait"] = {"seconds": self.wait[c], "ranks": 1}
        return snap

    @staticmethod
    def merge(snapshots) -> Dict[str, Dict[str, int]]:
        """Sum snapshots from several ranks (the whole job's traffic)."""
        total: Dict[str, Dict[str, int]] = {}
        for snap in snapshots:
            for c, v in snap.items():
                t = total.setdefault(c, dict.fromkeys(v, 0))
                for k in t:
                    t[k] += v[k]
        return total

    @staticmethod
    def format(totals: Dict[str, Dict[str, int]], iterations: int) -> str:
        """' pp-fwd: 1.2 MB (x7.9) | dp: ...' per iteration."""
        parts = []
        for c in CHANNELS:
            if c not in totals:
                continue
            sent = totals[c]["sent"] / max(iterations, 1)
            raw = totals[c]["raw"] / max(iterations, 1)
            ratio = raw / sent if sent else float("inf")
            parts.append(f"{c} bytes: {human_bytes(sent)} (x{ratio:.1f})")
        for name, v in totals.items():
            if "count" in v and v["count"]:
                parts.append(f"{name}: {v['sum'] / v['count']:.4g}")
        for c in CHANNELS:
            v = totals.get(f"{c} wait")
            if v:  # the mean over the ranks that waited, per iteration
                ms = 1000.0 * v["seconds"] / v["ranks"] / max(iterations, 1)
                parts.append(f"{c} wait ms: {ms:.1f}")
        return " | ".join(parts)


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            # 3 decimals: within 0.1% of the exact count (bench_slow_link compares with the wire)
            return f"{n:.3f}{unit}" if unit != "B" else f"{int(n)}B"
        n /= 1024.0
    return f"{n:.3f}GB"
