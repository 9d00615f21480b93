"""DiLoCo's outer pseudo-gradient through PowerSGD (DiLoCoX's low-rank outer exchange):
--diloco-compression powersgd-<r>.

The fragment's flat pseudo-gradient is cut back into its tensors; each one worth compressing at
rank r takes one round of the per-step compressor's PowerSGD (warm-started Q, the replica's own
residual E_i), the rest is averaged exactly in fp32 without a residual. At r >= min(n, m) the
estimate is the exact mean. Bytes of one sync (as all-reduce messages):

    sent = sum over compressed (n x m) of 4 r (n + m)  +  4 x (values sent exactly)

State (checkpoint): per fragment, Q and E of every compressed tensor.
"""
import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from megatron.cc.data_parallel.powersgd import (PowerSGDDataParallelSync, sent_values,
                                             worth_compressing)
from megatron.cc.common.stats import ChannelStats

GRAD_BYTES = 4   # fp32 factors and exact values


def parse_powersgd_rank(name: str) -> Optional[int]:
    """'powersgd-4' -> 4; another codec's name -> None; a malformed powersgd name -> 0."""
    if not name.startswith("powersgd"):
        return None
    head, _, tail = name.partition("-")
    return int(tail) if head == "powersgd" and tail.isdigit() else 0


def sync_bytes(shapes: Sequence[Sequence[int]], rank: int) -> int:
    """The module docstring's `sent` for one sync of a fragment of tensors shaped `shapes`."""
    return GRAD_BYTES * sum(sum(sent_values(shape, rank)) for shape in shapes)


class PowerSGDExchange:
    """DiLoCoSync's exchange for --diloco-compression powersgd-<r>; keeps its own residuals.

    Args:
        group: the dp group of the reduce (DiLoCo's reduce group).
        rank: r, columns of P and Q.
        seed: seeds the first Qs (must be equal on every replica).
        compress: which shapes go through PowerSGD (default `worth_compressing` at `rank`;
            a test forces every matrix through at full rank).
    """

    def __init__(self, group, rank: int, seed: int = 0,
                 compress: Optional[Callable[[Tuple[int, ...]], bool]] = None):
        if rank < 1:
            raise ValueError(f"PowerSGD rank must be >= 1, got {rank}")
        self.group, self.rank, self.seed = group, rank, seed
        self.compress = compress or (lambda shape: worth_compressing(shape, rank))
        self.engines: Dict[str, PowerSGDDataParallelSync] = {}   # fragment key -> its Qs, Es

    def _engine(self, key: str) -> PowerSGDDataParallelSync:
        if key not in self.engines:
            # only its reduce() is used: the stats it would log are never written
            self.engines[key] = PowerSGDDataParallelSync(self.group, ChannelStats(),
                                                         rank=self.rank, seed=self.seed)
        return self.engines[key]

    def __call__(self, x: torch.Tensor, step: int, key: str = "",
                 shapes: Sequence[Sequence[int]] = ()) -> Tuple[torch.Tensor, None, int]:
        """(mean estimate, None, bytes counted) for the flat fp32 vector x of tensors shaped
        `shapes`; x is overwritten with the estimate. Collective over the group."""
        compress: List[Tuple[str, torch.Tensor]] = []
        exact: List[torch.Tensor] = []
        off = 0
        for i, shape in enumerate(shapes):
            n = math.prod(int(s) for s in shape)
            view = x[off:off + n]
            if self.compress(tuple(shape)):
                compress.append((str(i), view.view(int(shape[0]), -1)))
            else:
                exact.append(view)
            off += n
        if off != x.numel():
            raise ValueError(f"shapes cover {off} values, the pseudo-gradient has {x.numel()}")
        sent, _ = self._engine(key).reduce(compress, exact)
        return x, None, sent

    def to(self, device) -> "PowerSGDExchange":
        return self   # loaded state waits in each engine until its first use, then moves there

    def state_dict(self) -> dict:
        return {"engines": {k: e.state_dict() for k, e in self.engines.items()}}

    def load_state_dict(self, sd: dict) -> None:
        for key, state in sd.get("engines", {}).items():
            self._engine(key).load_state_dict(state)
