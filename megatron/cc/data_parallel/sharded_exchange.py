"""Compressed all-reduce of a flat vector as a sharded exchange (CocktailSGD's server step).

Replica r owns shard r (ceil(n / D) values). Phase 1: every replica compresses each shard and
sends it to its owner (all_to_all of fixed-size buffers); the owner averages the copies in rank
order, adds its server error and compresses again; phase 2: all_gather of the owners' payloads,
decoded alike everywhere, so the result is bit-identical on every replica. Returns the update
U and dq, what this replica's phase-1 payloads decode to (the caller keeps x - dq as its
error). Bytes count as an all-reduce message: half of what both phases carry.
"""
import math
from typing import List, Tuple

import torch
import torch.distributed as dist


def to_bytes(payload: List[torch.Tensor]) -> torch.Tensor:
    """Concatenate payload tensors into one uint8 buffer (views: no per-dtype messages)."""
    return torch.cat([p.contiguous().reshape(-1).view(torch.uint8) for p in payload])


def from_bytes(buf: torch.Tensor, spec) -> List[torch.Tensor]:
    out, off = [], 0
    for shape, dt in spec:
        n = math.prod(shape) * dt.itemsize
        seg = buf[off:off + n]
        out.append((seg if dt == torch.uint8 else seg.clone()).view(dt).reshape(shape))  # align
        off += n
    return out


class ShardedExchange:
    """One compressed, sharded averaging round per call; owns the server-side error buffers.

    Args:
        group: the dp process group (the replicas of one pipeline stage).
        worker_codec / server_codec: flat codecs of phase 1 and phase 2 (separate instances:
            each keeps its own stochastic-rounding generator).
        error_decay: beta, the weight of the owner's server error when added to the next
            round's mean (1: plain error feedback; 0: none; --diloco-error-decay).
    Server errors are keyed by the caller (one vector may be split into segments).
    """

    def __init__(self, group, worker_codec, server_codec, error_decay: float = 1.0):
        self.group, self.decay = group, error_decay
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.worker_codec, self.server_codec = worker_codec, server_codec
        self.server_error = {}   # key -> (shard,) fp32 on the vector's device

    def shard_size(self, numel: int) -> int:
        return -(-numel // self.world)

    def __call__(self, x: torch.Tensor, step: int, key: str = "",
                 shapes=()) -> Tuple[torch.Tensor, torch.Tensor, int]:
        """(U, dq, bytes counted) for the flat fp32 vector x; collective over the group.
        `shapes` (the tensors x concatenates) is for per-parameter codecs; a flat one ignores
        it."""
        n, D = x.numel(), self.world
        s = self.shard_size(n)
        chunks = torch.nn.functional.pad(x.float(), (0, s * D - n)).view(D, s)
        wspec = self.worker_codec.flat_spec(s)
        payloads = [self.worker_codec.compress(chunks[j], step) for j in range(D)]
        dq = torch.cat([self.worker_codec.decompress(p, s, step) for p in payloads])[:n]
        send = torch.stack([to_bytes(p) for p in payloads])          # (D, P1) uint8
        # gloo (e.g. --dp-backend gloo across a WAN) with CUDA tensors: stage through the host
        host = x.device.type != "cpu" and dist.get_backend(self.group) == "gloo"
        wire = send.cpu() if host else send
        recv = torch.empty_like(wire)
        dist.all_to_all_single(recv, wire, group=self.group)
        recv = recv.to(x.device)
        mine = self.worker_codec.decompress(from_bytes(recv[0], wspec), s, step)
        for j in range(1, D):   # fixed order: the owner's sum does not depend on arrival
            mine += self.worker_codec.decompress(from_bytes(recv[j], wspec), s, step)
        mine /= D
        err = self.server_error.get(key)
        if err is not None and self.decay:   # alpha 1: bit-identical to a plain add
            mine.add_(err.to(mine.device), alpha=self.decay)
        p2 = self.server_codec.compress(mine, step)
        self.server_error[key] = mine - self.server_codec.decompress(p2, s, step)
        mine_bytes = to_bytes(p2)
        wire = mine_bytes.cpu() if host else mine_bytes
        gathered = [torch.empty_like(wire) for _ in range(D)]
        dist.all_gather(gathered, wire, group=self.group)
        gathered = [g.to(x.device) for g in gathered]
        sspec = self.server_codec.flat_spec(s)
        update = torch.cat([self.server_codec.decompress(from_bytes(g, sspec), s, step)
                            for g in gathered])[:n]
        counted = (send.numel() + D * mine_bytes.numel()) // 2
        return update, dq, counted

    def owed(self, numel: int, key: str = ""):
        """Takes this owner's server error for `key` out of the exchange, placed at its shard
        of an n-vector and times D: summed over the replicas and divided by D, as an exact
        all-reduce of the mean does, it adds every owner's error once (an exact final sync
        repays it). None when there is none."""
        err = self.server_error.pop(key, None)
        if err is None:
            return None
        s = self.shard_size(numel)
        out = torch.zeros(s * self.world, dtype=err.dtype, device=err.device)
        out[self.rank * s:(self.rank + 1) * s] = err * self.world
        return out[:numel]

    def to(self, device) -> "ShardedExchange":
        """Server errors onto `device` (loaded from a checkpoint, they sit on the CPU)."""
        self.server_error = {k: v.to(device) for k, v in self.server_error.items()}
        return self

    def state_dict(self) -> dict:
        return {"server_error": dict(self.server_error),
                "worker_codec": self.worker_codec.state_dict(),
                "server_codec": self.server_codec.state_dict()}

    def load_state_dict(self, sd: dict) -> None:
        self.server_error = {k: v.clone() for k, v in sd.get("server_error", {}).items()}
        self.worker_codec.load_state_dict(sd.get("worker_codec", {}))
        self.server_codec.load_state_dict(sd.get("server_codec", {}))
