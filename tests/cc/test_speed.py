"""--check-comp-speed's meter (megatron/cc/common/speed.py) on the CPU (CUDA: tests/gpu/).

- A timed codec returns exactly what the codec returns, keeps its state and attributes, and
  adds one "comp" and one "decomp" observation per message, in GB/s of uncompressed bytes;
- a record with several spans counts only their sum (the collectives between them excluded);
- the log line prints the mean speed per channel; with the flag off nothing is recorded.
"""
import time

import pytest
import torch

from megatron.cc.codecs import CodecContext, get_codec
from megatron.cc.common.speed import CompSpeed, SpeedRecord, TimedCodec, record
from megatron.cc.common.stats import ChannelStats


def test_timed_codec_is_the_codec_plus_two_observations():
    stats = ChannelStats()
    plain = get_codec("lowrank", rank=2, error_feedback=True, seed=3)
    timed = TimedCodec(get_codec("lowrank", rank=2, error_feedback=True, seed=3),
                       CompSpeed(stats), "pp-bwd")
    for t in range(3):
        x = torch.randn(8, 2, 16, generator=torch.Generator().manual_seed(t))
        ctx = CodecContext(iteration=t)
        a, b = plain.encode(x, ctx), timed.encode(x, ctx)
        assert all(torch.equal(p, q) for p, q in zip(a, b))
        assert torch.equal(plain.decode(a, x.shape, x.dtype, ctx),
                           timed.decode(b, x.shape, x.dtype, ctx))
    assert torch.equal(plain.error(x.shape), timed.error(x.shape))     # attributes delegate
    assert timed.state_dict().keys() == plain.state_dict().keys()
    assert timed.observe(x, ctx) is None and timed.describe() is None   # the codec's defaults
    snap = stats.snapshot()
    assert snap["pp-bwd comp GB/s"]["count"] == 3 and snap["pp-bwd decomp GB/s"]["count"] == 3
    assert snap["pp-bwd comp GB/s"]["sum"] > 0
    assert "pp-bwd comp GB/s: " in ChannelStats.format(snap, 1)


def test_a_record_counts_its_spans_only():
    stats = ChannelStats()
    rec = CompSpeed(stats).record("dp", "comp", torch.empty(0), nbytes=10**6)
    with rec:
        time.sleep(0.02)
    time.sleep(0.2)          # a collective between two spans: not codec time
    with rec:
        time.sleep(0.02)
    rec.done()
    total, count = stats.diagnostics["dp comp GB/s"]
    seconds = 1e6 / (total * 1e9)
    assert count == 1 and 0.04 <= seconds < 0.2, seconds


def test_flag_off_records_nothing():
    """record(None, ...) (the flag off: no meter) is one shared no-op: its spans and done()
    keep nothing and do not swallow a codec's exception; the same calls with a meter on add
    one observation (the contrast: the calls are the ones that record)."""
    x = torch.ones(3)
    off = record(None, "emb", "comp", x)
    assert not isinstance(off, SpeedRecord) and record(None, "dp", "decomp", x, 8) is off
    with off as entered:
        assert entered is off
    with pytest.raises(RuntimeError, match="codec failed"):
        with off:
            raise RuntimeError("codec failed")
    assert off.done() is None and vars(off) == {}   # no time, no events, no stats kept

    stats = ChannelStats()
    on = record(CompSpeed(stats), "emb", "comp", x)
    with on:
        pass
    on.done()
    assert list(stats.diagnostics) == ["emb comp GB/s"]
    assert stats.diagnostics["emb comp GB/s"][1] == 1


def test_timed_codec_forwards_every_codec_hook():
    """Every hook declared on Codec reaches the wrapped codec: the channel calls them on the
    TimedCodec (observe, close, describe, error, ...) without asking whether they exist."""
    import inspect
    from megatron.cc.codecs.base import Codec
    hooks = sorted(n for n, v in vars(Codec).items() if callable(v) and not n.startswith("_")
                   and n not in ("encode", "decode"))   # timed: the test above
    assert {"observe", "error", "describe", "close", "pass_through"} <= set(hooks)

    def recording(name):
        return lambda self, *args: self.calls.append((name, args)) or name
    recorder = type("Recorder", (Codec,), {n: recording(n) for n in hooks})()
    recorder.calls = []
    timed = TimedCodec(recorder, CompSpeed(ChannelStats()), "pp-fwd")
    for name in hooks:
        n_args = len(inspect.signature(getattr(Codec, name)).parameters) - 1
        args = tuple(f"a{i}" for i in range(n_args))
        assert getattr(timed, name)(*args) == name
        assert recorder.calls[-1][0] == name and len(recorder.calls[-1][1]) == n_args
