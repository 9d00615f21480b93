"""--check-comp-speed: compression / decompression speed per channel, on the normal log line.

A record times one message's codec work, possibly in several spans (only the codec's compute
counts, not the collectives between):

    rec = record(speed, "pp-bwd", "comp", x)    # x: the uncompressed tensor (bytes, device)
    with rec: payload = codec.encode(x, ctx)
    rec.done()

The log line prints uncompressed bytes / codec seconds ("pp-bwd comp GB/s"). CPU spans use the
wall clock; CUDA spans a pair of events, observed once complete (Event.query()): no host sync.
"""
import math
import time
from collections import deque
from typing import Optional

import torch

from megatron.cc.common.stats import ChannelStats


class CompSpeed:
    """Collects codec timings of one rank into `stats` as "<channel> <phase> GB/s"."""

    def __init__(self, stats: ChannelStats):
        self.stats = stats
        self._queue = deque()   # finished CUDA records, oldest first

    def record(self, channel: str, phase: str, like: torch.Tensor,
               nbytes: Optional[int] = None) -> "SpeedRecord":
        """A record for one message; `nbytes` (default like's bytes): the uncompressed size."""
        nbytes = like.numel() * like.element_size() if nbytes is None else nbytes
        return SpeedRecord(self, f"{channel} {phase} GB/s", nbytes, like.device)

    def _finish(self, rec: "SpeedRecord") -> None:
        if rec.events:
            self._queue.append(rec)
        else:
            self._observe(rec, rec.seconds)
        self.drain()

    def drain(self) -> None:
        """Observe every queued record whose events have completed (in order; no sync)."""
        while self._queue and self._queue[0].events[-1][1].query():
            rec = self._queue.popleft()
            seconds = sum(a.elapsed_time(b) for a, b in rec.events) / 1000.0
            self._observe(rec, seconds)

    def _observe(self, rec: "SpeedRecord", seconds: float) -> None:
        self.stats.observe(rec.name, rec.nbytes / max(seconds, 1e-9) / 1e9)


class SpeedRecord:
    """One message: enter/exit once per span of codec work, then done()."""

    def __init__(self, owner: CompSpeed, name: str, nbytes: int, device: torch.device):
        self.owner, self.name, self.nbytes = owner, name, nbytes
        self.cuda = device.type == "cuda"
        self.seconds, self.events, self._t0 = 0.0, [], None

    def __enter__(self):
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            self.events.append((start, None))
        else:
            self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.events[-1] = (self.events[-1][0], end)
        else:
            self.seconds += time.perf_counter() - self._t0
        return False

    def done(self) -> None:
        self.owner._finish(self)


class _NullRecord:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def done(self) -> None:
        pass


_NULL = _NullRecord()


def record(speed, channel: str, phase: str, like: torch.Tensor, nbytes: Optional[int] = None):
    """speed.record(...), or a record that does nothing when speed is None (flag off)."""
    return _NULL if speed is None else speed.record(channel, phase, like, nbytes)


class TimedCodec:
    """A pipeline codec with its encode ("comp") and decode ("decomp") timed; everything else
    (payload_spec, state, pass_through, observe, ...) is the wrapped codec's own."""

    def __init__(self, codec, speed: CompSpeed, channel: str):
        self.codec, self.speed, self.channel = codec, speed, channel

    def encode(self, x, ctx=None):
        rec = self.speed.record(self.channel, "comp", x)
        with rec:
            payload = self.codec.encode(x, ctx)
        rec.done()
        return payload

    def decode(self, payload, shape, dtype, ctx=None):
        nbytes = math.prod(map(int, shape)) * torch.empty((), dtype=dtype).element_size()
        rec = self.speed.record(self.channel, "decomp", payload[0], nbytes)
        with rec:
            out = self.codec.decode(payload, shape, dtype, ctx)
        rec.done()
        return out

    def __getattr__(self, name):
        if name == "codec":   # not yet set (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.codec, name)

    def __repr__(self) -> str:
        return f"TimedCodec({self.codec!r})"
