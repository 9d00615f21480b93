"""Wire-byte accounting per channel.

Every channel adds what it actually puts on the wire (payload numel * element_size) and what
the same message would have cost uncompressed, so the log line can print real ratios. Counters
are plain Python ints on the host: counting never forces a device sync.

Traffic that leaves the node is also counted apart (`<channel> inter-node` entries, only on
jobs that span nodes, so a one-node log line is unchanged): a point-to-point message when its
peer is on another node, a collective when its group spans nodes (`leaves_node`, set when the
channel is built).
"""
from collections import defaultdict
from typing import Dict, Iterable, Optional

import torch

CHANNELS = ("pp-fwd", "pp-bwd", "dp", "emb", "tp")


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
        self.sent_inter: Dict[str, int] = defaultdict(int)      # of `sent`, what left the node
        self.wait_inter: Dict[str, float] = defaultdict(float)  # of `wait`, on such transfers
        self.leaves_node: Dict[str, bool] = {}   # collective channels whose group spans nodes

    def _inter(self, channel: str, inter: Optional[bool]) -> bool:
        return self.leaves_node.get(channel, False) if inter is None else inter

    def add_wait(self, channel: str, seconds: float, inter: Optional[bool] = None) -> None:
        """Host time spent waiting for `channel`'s transfers (a clock; no device sync).
        `inter`: the transfer left the node (None: the channel's `leaves_node`)."""
        self.wait[channel] += seconds
        if self._inter(channel, inter):
            self.wait_inter[channel] += seconds

    def observe(self, name: str, value) -> None:
        """A diagnostic value (float or 0-dim tensor, summed on its device and read only by
        `snapshot`, at log intervals); the log prints its mean over the interval."""
        acc = self.diagnostics.setdefault(name, [0.0, 0])
        acc[0] += value
        acc[1] += 1

    def add(self, channel: str, sent: int, raw: int, inter: Optional[bool] = None) -> None:
        self.sent[channel] += sent
        self.raw[channel] += raw
        self.messages[channel] += 1
        if self._inter(channel, inter):
            self.sent_inter[channel] += sent

    def reset(self) -> None:
        self.sent.clear()
        self.raw.clear()
        self.messages.clear()
        self.diagnostics.clear()
        self.wait.clear()
        self.sent_inter.clear()
        self.wait_inter.clear()

    def snapshot(self) -> Dict[str, Dict[str, int]]:
        snap = {c: {"sent": self.sent[c], "raw": self.raw[c], "messages": self.messages[c]}
                for c in CHANNELS if self.messages[c]}
        for name, (total, count) in self.diagnostics.items():
            snap[name] = {"sum": float(total), "count": count}  # the one sync, at log time
        for c in CHANNELS:
            if self.wait.get(c):
                snap[f"{c} wait"] = {"seconds": self.wait[c], "ranks": 1}
            if self.sent_inter.get(c):
                snap[f"{c} inter-node"] = {"bytes": self.sent_inter[c]}
            if self.wait_inter.get(c):
                snap[f"{c} inter-node wait"] = {"seconds": self.wait_inter[c], "ranks": 1}
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
    def wait_ms(v: Dict[str, float], iterations: int) -> float:
        """A merged `<channel> wait` entry as ms per iteration, the mean over the ranks that
        waited."""
        return 1000.0 * v["seconds"] / v["ranks"] / max(iterations, 1)

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
            if v:
                parts.append(f"{c} wait ms: {ChannelStats.wait_ms(v, iterations):.1f}")
        for c in CHANNELS:   # jobs that span nodes: the share that left the node
            v = totals.get(f"{c} inter-node")
            if v:
                parts.append(f"{c} inter-node bytes: "
                             f"{human_bytes(v['bytes'] / max(iterations, 1))}")
            v = totals.get(f"{c} inter-node wait")
            if v:
                parts.append(f"{c} inter-node wait ms: {ChannelStats.wait_ms(v, iterations):.1f}")
        return " | ".join(parts)


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            # 3 decimals: within 0.1% of the exact count (bench_slow_link compares with the wire)
            return f"{n:.3f}{unit}" if unit != "B" else f"{int(n)}B"
        n /= 1024.0
    return f"{n:.3f}GB"
