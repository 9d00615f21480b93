"""One helper for every multi-process test: spawn N gloo ranks, collect results, never hang.

    results = run_distributed(worker, world_size=4, args=(x,), timeout=120)

`worker(rank, world_size, *args)` runs in a fresh process with torch.distributed already
initialised on gloo (OMP_NUM_THREADS=1); its return value (picklable) comes back in
`results[rank]`. An exception on any rank, or the timeout, kills every rank and raises here
with the failing rank's traceback, so a broken collective fails the test instead of hanging it.

On CPU machines ranks are forked from a forkserver that has imported torch, megatron-core and
the driver once per test session: a spawned rank spends ~4.5 CPU seconds importing them, which
at 4-8 ranks on a 2-core machine was most of a short test's time. As with spawn, a rank holds
none of the test process's state (the server only imported); the parent's environment at call
time is passed along, since a forkserver child would otherwise see the server's.
"""
import functools
import os
import pickle
import socket
import traceback

import torch.multiprocessing as mp


def _port_window() -> range:
    """This process's ports: below the kernel's ephemeral range (which the OS hands to outgoing
    connections and to bind(0), so a port found free there can be taken before the rank binds
    it), split between pytest-xdist workers so that two workers never pick the same one."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_lo = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_lo = 32768
    lo = 10000 if ephemeral_lo > 12000 else 1024
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0) % workers
    span = (ephemeral_lo - lo) // workers
    return range(lo + index * span, lo + (index + 1) * span)


_next_port = None


def free_port() -> int:
    """A port nobody listens on, not handed out before by this process (ranks bind it later)."""
    global _next_port
    window = _port_window()
    if _next_port is None:   # a different start per process: tests in a row reuse no port
        _next_port = window.start + (os.getpid() * 7919) % len(window)
    for _ in range(len(window)):
        port = _next_port
        _next_port = window.start + (_next_port + 1 - window.start) % len(window)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {window.start}-{window.stop - 1}")


PRELOAD = ["torch", "torch.distributed", "megatron.core.parallel_state",
           "megatron.training.loop.training", "tests.training.runner"]


@functools.lru_cache(maxsize=None)
def _context():
    import torch
    if torch.cuda.is_available():   # the preloaded driver initialises CUDA, which a fork cannot keep
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _entry(worker, rank, world_size, port, args, queue, env):
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        out = worker(rank, world_size, *args)
        # by value: a tensor sent as a shared-memory handle is gone once this rank exits
        queue.put((rank, True, pickle.dumps(out)))
    except BaseException:  # report everything, including SystemExit from argument checks
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def by_value(x):
    """Tensors (in tuples, lists, dicts) as numpy arrays: a worker's result leaves the spawned
    rank by value (shared-memory handles die with the rank)."""
    import torch
    if isinstance(x, (tuple, list)):
        return type(x)(by_value(v) for v in x)
    if isinstance(x, dict):
        return {k: by_value(v) for k, v in x.items()}
    return x.numpy() if torch.is_tensor(x) else x


def run_distributed(worker, world_size, args=(), timeout=300):
    ctx = _context()
    queue = ctx.Queue()
    port = free_port()
    env = dict(os.environ)
    procs = [ctx.Process(target=_entry, args=(worker, r, world_size, port, args, queue, env),
                         daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    results, errors = {}, {}
    try:
        import queue as _q
        import time
        deadline = time.monotonic() + timeout
        while len(results) + len(errors) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"distributed test timed out after {timeout}s; "
                                   f"finished ranks: {sorted(results)}; failed: {sorted(errors)}")
            try:
                rank, ok, out = queue.get(timeout=min(remaining, 1.0))
            except _q.Empty:
                dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0)
                        and i not in results and i not in errors]
                if dead:
                    raise RuntimeError(f"rank(s) {dead} died with exit codes "
                                       f"{[procs[i].exitcode for i in dead]}")
                continue
            (results if ok else errors)[rank] = pickle.loads(out) if ok else out
            if errors:  # one failure is enough: the others may be stuck in a collective
                break
    finally:
        for p in procs:
            p.join(timeout=5 if not errors else 0.5)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        rank = min(errors)
        raise RuntimeError(f"rank {rank} failed:\n{errors[rank]}")
    return [results[r] for r in range(world_size)]
