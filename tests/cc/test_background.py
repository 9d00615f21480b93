"""BackgroundCall: a value comes back, an exception resurfaces once on the collecting thread."""
import threading

import pytest

from megatron.cc.common.background import BackgroundCall


def test_value_and_done():
    gate = threading.Event()
    call = BackgroundCall("job failed", lambda: (gate.wait(), 42)[1])
    assert not call.done
    gate.set()
    assert call.result() == 42
    assert call.done


def test_exception_resurfaces_once_with_its_cause():
    def boom():
        raise OSError("disk full")
    call = BackgroundCall("asynchronous checkpoint write failed", boom, name="writer")
    call.wait()                      # joining alone does not raise
    with pytest.raises(RuntimeError, match="asynchronous checkpoint write failed: disk full") as e:
        call.result()
    assert isinstance(e.value.__cause__, OSError)
    assert call.result() is None     # handed over once


def test_async_writer_reports_a_failed_write(tmp_path):
    from megatron.training.checkpointing.async_save import AsyncWriter
    w = AsyncWriter()
    w.submit([({"x": 1}, str(tmp_path / "missing_dir" / "f.pt"))])
    with pytest.raises(RuntimeError, match="asynchronous checkpoint write failed"):
        w.wait()
    assert not w.busy and w.poll()   # the failed write is not left in flight
