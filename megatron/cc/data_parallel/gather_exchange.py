"""Compressed averaging of a flat vector by one all-gather of fixed-size payloads (SparseLoCo).

Every replica compresses its whole vector once (a sum of sparse payloads is not sparse, so
there is no server-side step as in the sharded exchange); all D payloads are all-gathered and
decoded in rank order on every replica, so the mean is bit-identical everywhere. Bytes, as an
all-reduce message of the same per-link ring traffic, for a payload of P bytes:

    counted = D * P / 2          (D = 2: exactly P, what crosses each link per direction)
"""
from typing import Tuple

import torch
import torch.distributed as dist

from megatron.cc.data_parallel.sharded_exchange import from_bytes, to_bytes


class GatherExchange:
    """Same call contract as ShardedExchange: (mean, what this replica sent, bytes counted).

    Args:
        group: the dp process group (or a clone of it for a background reduce).
        codec: a flat codec (compress / decompress / flat_spec); its own state only.
    """

    def __init__(self, group, codec):
        self.group, self.codec = group, codec
        self.world = dist.get_world_size(group)

    def __call__(self, x: torch.Tensor, step: int, key: str = "",
                 shapes=()) -> Tuple[torch.Tensor, torch.Tensor, int]:
        # shapes: for per-parameter codecs (DiLoCoSync passes them); a flat codec ignores them
        n, D = x.numel(), self.world
        payload = self.codec.compress(x.reshape(-1), step)
        dq = self.codec.decompress(payload, n, step)
        mine = to_bytes(payload)                                    # (P,) uint8
        gathered = [torch.empty_like(mine) for _ in range(D)]
        dist.all_gather(gathered, mine, group=self.group)
        spec = self.codec.flat_spec(n)
        mean = self.codec.decompress(from_bytes(gathered[0], spec), n, step)
        for j in range(1, D):   # fixed order: the sum does not depend on arrival
            mean += self.codec.decompress(from_bytes(gathered[j], spec), n, step)
        mean /= D
        return mean, dq, D * mine.numel() // 2

    def to(self, device) -> "GatherExchange":
        return self   # no tensors of its own (the codec's generator follows its input)

    def state_dict(self) -> dict:
        return {"codec": self.codec.state_dict()}

    def load_state_dict(self, sd: dict) -> None:
        self.codec.load_state_dict(sd.get("codec", {}))
