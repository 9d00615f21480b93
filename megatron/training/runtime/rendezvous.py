"""A fresh key namespace in torchrun's store for every attempt, so restarted workers never hang.

torchrun's agent store outlives the workers, so a restarted worker's process groups would read
a failed attempt's keys. The ranks of one attempt agree on a random token and use
`PrefixStore(token)` for everything (docs/fault_tolerance.md), with no shared counter:

    rank 0:  token = random; set(LEADER, token); for each rank r: read hello/r, write ack/r/<nonce>
    rank r:  nonce = random; poll { t = get(LEADER); on a new t: set(t/hello/r, nonce);
                                    ack/r/<nonce> under t exists -> agreed on t }

Keys under a fresh token cannot be stale, and an ack names the reader's own nonce, so a worker
that first read a dead attempt's token keeps polling until this attempt's rank 0 writes its own.
"""
import datetime
import os
import time
import uuid
from typing import Optional

import torch.distributed as dist

LEADER_KEY = "megatron-cc/attempt-token"
_POLL_S = 0.05   # a worker re-reads the token this often until rank 0 acknowledges it


def uses_agent_store() -> bool:
    """True when launched by torchrun's elastic agent, whose store outlives the workers."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)


def attempt_store(rank: int, world_size: int, timeout: datetime.timedelta):
    """The agent's store under this attempt's fresh prefix, or None when not under torchrun."""
    if not uses_agent_store():
        return None
    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                         is_master=False, timeout=timeout)
    token = agree_on_token(base, rank, world_size, timeout)
    return dist.PrefixStore(f"megatron-cc/attempt/{token}/", base)


def agree_on_token(store, rank: int, world_size: int, timeout: datetime.timedelta) -> str:
    """Run the handshake of the module docstring; every rank returns rank 0's token."""
    if rank == 0:
        return _lead(store, world_size, timeout)
    return _follow(store, rank, timeout)


def _lead(store, world_size: int, timeout: datetime.timedelta) -> str:
    token = uuid.uuid4().hex
    store.set(LEADER_KEY, token)
    hellos = [f"{token}/hello/{r}" for r in range(1, world_size)]
    if not hellos:
        return token
    try:
        store.wait(hellos, timeout)
    except Exception:
        missing = [r for r, k in enumerate(hellos, 1) if not store.check([k])]
        raise TimeoutError(
            f"start-up: rank 0 waited {_minutes(timeout)} (--distributed-timeout-minutes) for "
            f"rank(s) {missing[:16]} to join the process-group handshake") from None
    nonces = store.multi_get(hellos)
    store.multi_set([f"{token}/ack/{r}/{n.decode()}" for r, n in enumerate(nonces, 1)],
                    ["1"] * len(nonces))
    return token


def _follow(store, rank: int, timeout: datetime.timedelta) -> str:
    nonce, announced = uuid.uuid4().hex, None
    deadline = time.monotonic() + timeout.total_seconds()
    while True:
        # polled with check(): a blocking wait() that times out logs a C++ warning each time
        if store.check([LEADER_KEY]):
            token = store.get(LEADER_KEY).decode()
            if token != announced:
                store.set(f"{token}/hello/{rank}", nonce)
                announced = token
            if store.check([f"{token}/ack/{rank}/{nonce}"]):
                return token
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"start-up: rank {rank} waited {_minutes(timeout)} "
                f"(--distributed-timeout-minutes) for rank 0 to open the process-group "
                f"handshake; is rank 0 alive?")
        time.sleep(_POLL_S)


def _minutes(timeout: datetime.timedelta) -> str:
    return f"{timeout.total_seconds() / 60:g} min"


def init_process_group(backend: str, timeout: datetime.timedelta,
                       store: Optional[object] = None) -> None:
    """dist.init_process_group, through this attempt's namespace when under torchrun."""
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    store = store or attempt_store(rank, world, timeout)
    if store is None:
        dist.init_process_group(backend=backend, timeout=timeout)
    else:
        dist.init_process_group(backend=backend, timeout=timeout, store=store, rank=rank,
                                world_size=world)
