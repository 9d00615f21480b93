"""--check-comp-ratio: the whole run's bytes per channel, printed once at the end.

The per-interval counters (megatron.cc.common.stats) are reset at every log line; this keeps their
running sum, so the summary covers every training iteration (validation traffic is not counted,
as in the log line).
"""
from typing import Dict

from megatron.cc.common.stats import CHANNELS, human_bytes


def accumulate(total: Dict[str, Dict[str, int]], interval: Dict[str, Dict[str, int]]) -> None:
    for c in CHANNELS:
        if c in interval:
            t = total.setdefault(c, {"sent": 0, "raw": 0, "messages": 0})
            for k in t:
                t[k] += interval[c][k]


def format_summary(total: Dict[str, Dict[str, int]], iterations: int) -> str:
    """One line per channel: bytes on the wire, uncompressed bytes, ratio, messages."""
    lines = [f" compression summary over {iterations} iterations (all ranks):"]
    for c in CHANNELS:
        if c not in total:
            continue
        v = total[c]
        ratio = v["raw"] / v["sent"] if v["sent"] else float("inf")
        lines.append(f"   {c:7s} sent {human_bytes(v['sent']):>9s} | uncompressed "
                     f"{human_bytes(v['raw']):>9s} | ratio x{ratio:.2f} | messages {v['messages']}")
    if len(lines) == 1:
        lines.append("   no channel carried traffic (single process, pp=1 and dp=1)")
    return "\n".join(lines)
