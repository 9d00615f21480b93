"""BackgroundCall on a GPU, checked on the CPU against a recording stand-in for torch.cuda.

The job must run on its creator's CUDA device (a new thread starts on device 0), on a stream of
its own that first waits for what the creator's stream had queued at construction (the job's
inputs), and be synchronised before it reports done; on a failure too. Without CUDA in use none
of that happens (CPU runs, and the checkpoint writer before CUDA is initialised).
"""
import contextlib
import threading

import pytest
import torch

from megatron.cc.common import background


class _Recorder:
    def __init__(self):
        self.log = []
        self.lock = threading.Lock()
        self.current = {}   # thread -> device

    def add(self, *event):
        with self.lock:
            self.log.append((threading.current_thread().name, *event))


class _Stream:
    def __init__(self, rec, name):
        self.rec, self.name = rec, name

    def wait_event(self, event):
        self.rec.add("wait_event", self.name, event.recorded_on)

    def synchronize(self):
        self.rec.add("synchronize", self.name)


class _Event:
    def __init__(self, rec):
        self.rec, self.recorded_on = rec, None

    def record(self, stream):
        self.recorded_on = stream.name
        self.rec.add("record", stream.name)


@pytest.fixture
def fake_cuda(monkeypatch):
    rec = _Recorder()
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(cuda, "current_device",
                        lambda: rec.current.get(threading.current_thread().name, 0))
    monkeypatch.setattr(cuda, "set_device",
                        lambda d: (rec.current.__setitem__(threading.current_thread().name, d),
                                   rec.add("set_device", d)))
    monkeypatch.setattr(cuda, "current_stream", lambda device=None: _Stream(rec, "creator"))
    monkeypatch.setattr(cuda, "Stream", lambda device=None: _Stream(rec, f"job@{device}"))
    monkeypatch.setattr(cuda, "Event", lambda: _Event(rec))

    @contextlib.contextmanager
    def stream(s):
        rec.add("enter", s.name)
        yield
        rec.add("exit", s.name)
    monkeypatch.setattr(cuda, "stream", stream)
    rec.current["MainThread"] = 3   # this rank's GPU
    return rec


def test_job_runs_on_the_creators_device_and_its_own_stream(fake_cuda):
    rec = fake_cuda

    def job(x):
        rec.add("job on device", torch.cuda.current_device())
        return x + 1
    call = background.BackgroundCall("job failed", job, torch.ones(2), name="bg")
    assert torch.equal(call.result(), torch.full((2,), 2.0))
    assert [e for e in rec.log if e[0] == "MainThread"] == [("MainThread", "record", "creator")]
    assert [e[1:] for e in rec.log if e[0] == "bg"] == [
        ("set_device", 3), ("wait_event", "job@3", "creator"), ("enter", "job@3"),
        ("job on device", 3), ("exit", "job@3"), ("synchronize", "job@3")]


def test_a_failing_job_is_synchronised_too(fake_cuda):
    def boom():
        raise ValueError("bad shard")
    call = background.BackgroundCall("exchange failed", boom, name="bg")
    with pytest.raises(RuntimeError, match="exchange failed: bad shard"):
        call.result()
    assert ("bg", "synchronize", "job@3") in fake_cuda.log


def test_without_cuda_in_use_nothing_device_related_happens(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    touched = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: touched.append(d))
    assert background.BackgroundCall("job failed", lambda: 7).result() == 7
    assert touched == []
