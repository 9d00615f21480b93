"""tests/distributed.py's free_port under pytest-xdist: each worker draws from its own window
below the kernel's ephemeral range, so no other worker (and no bind(0)) can take a port between
the draw and the rank's bind."""
import socket

from tests import distributed


def _window(monkeypatch, worker, count):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(count))
    return distributed._port_window()


def test_worker_windows_are_disjoint_and_below_the_ephemeral_range(monkeypatch):
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_lo = int(f.read().split()[0])
    for count in (1, 2, 3, 8):
        windows = [_window(monkeypatch, w, count) for w in range(count)]
        for a, b in zip(windows, windows[1:]):
            assert a.stop <= b.start
        assert windows[0].start >= 1024 and windows[-1].stop <= ephemeral_lo
        assert all(len(w) >= 100 for w in windows)


def test_ports_are_distinct_in_the_window_and_skip_a_bound_one(monkeypatch):
    window = _window(monkeypatch, 1, 2)
    monkeypatch.setattr(distributed, "_next_port", window.start)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", window.start))
        busy.listen()
        ports = [distributed.free_port() for _ in range(5)]
    assert window.start not in ports and len(set(ports)) == 5
    assert all(p in window for p in ports)
    monkeypatch.setattr(distributed, "_next_port", window.stop - 1)   # wraps around
    assert [distributed.free_port(), distributed.free_port()] == [window.stop - 1, window.start]


def test_outside_xdist_the_whole_window_is_one_process(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_lo = int(f.read().split()[0])
    window = distributed._port_window()
    assert (window.start, window.stop) == (10000, ephemeral_lo)
