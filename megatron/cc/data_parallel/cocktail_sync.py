"""CocktailSGD (Wang et al., ICML'23) on the dp channel: compressed, sharded parameter deltas.

Per optimizer step t (after `warmup_steps` plain all-reduce steps), on every replica i:

    delta_i = theta_i - theta_g              theta_g: the last agreed copy (fp32)
    U, dq_i = ShardedExchange(delta_i, t)    random rolling subset -> top-k -> b-bit, twice
    theta_g <- theta_g + U;   theta_i <- theta_i + U - dq_i

By default the exchange runs on a background thread during step t+1's forward/backward and is
applied just before its optimizer step (one step stale). State: theta_g per segment, the
server errors, codec generators and an exchange in flight. See docs/data_parallel.md.
"""
import time
from typing import Dict, List, Optional

import torch

from megatron.cc.common.background import BackgroundCall
from megatron.cc.grad_sync.channel import SyncChannel
from megatron.cc.grad_sync.param_sync import (add_flat_, clone_state, flatten, param_segments,
                                              to_device)
from megatron.cc.data_parallel.sharded_exchange import ShardedExchange
from megatron.cc.grad_sync.sync import ExactDataParallelSync
from megatron.cc.common.stats import ChannelStats


class CocktailSGDSync(SyncChannel):
    """dp mode `cocktail_sgd`.

    Args:
        group: dp group of this stage (warm-up all-reduce, and the exchange when no
            exchange_group is given).
        stats: "dp" bytes and the "dp wait ms" diagnostic.
        exchange: a ShardedExchange over `exchange_group` (a dedicated clone of the dp group
            when overlapping: a background thread must not share a group with the main one).
        warmup_steps: iterations (0-based) below this all-reduce gradients exactly.
        overlap: run the exchange on a background thread, one step stale.
    """

    def __init__(self, group, stats: ChannelStats, exchange: ShardedExchange,
                 warmup_steps: int = 0, overlap: bool = True):
        self.stats, self.exchange = stats, exchange
        self.warmup_steps, self.overlap = warmup_steps, overlap
        self.exact = ExactDataParallelSync(group, stats)
        self.global_copy: Optional[Dict[str, torch.Tensor]] = None
        self._pending: Optional[dict] = None       # finished result not yet applied
        self._call: Optional[BackgroundCall] = None   # the overlapped exchange in flight
        self._result: Optional[dict] = None            # finished, not yet counted
        self._loaded = False   # state from a checkpoint, not yet on the parameters' device

    # ---------------------------------------------------------------- hooks
    def __call__(self, model, iteration: int) -> None:
        """Before the optimizer step: warm-up all-reduce, or apply the stale exchange."""
        if iteration < self.warmup_steps:
            self.exact(model, iteration)
            return
        if self._loaded:   # resumed: the checkpoint's CPU state joins the parameters
            device = next(iter(param_segments(model).values()))[0].device
            self.global_copy = to_device(self.global_copy, device)
            self._pending, self._loaded = to_device(self._pending, device), False
            self.exchange.to(device)
        self.apply_pending(param_segments(model))
        if self.global_copy is None:  # params agree here: after warm-up, or at init
            self.global_copy = {k: flatten(v) for k, v in param_segments(model).items()}

    def after_optimizer_step(self, model, iteration: int) -> None:
        if iteration < self.warmup_steps:
            return
        segments = param_segments(model)
        deltas = {k: flatten(v) - self.global_copy[k] for k, v in segments.items()}
        if self.overlap:
            self._call = BackgroundCall("CocktailSGD exchange failed", self._exchange, deltas,
                                        iteration)
        else:
            self._result = self._exchange(deltas, iteration)
            self.apply_pending(segments)

    def flush(self, model) -> None:
        """Apply an exchange still in flight (end of training: evaluate agreed params)."""
        self.apply_pending(param_segments(model))

    # ---------------------------------------------------------------- the exchange
    def _exchange(self, deltas: Dict[str, torch.Tensor], step: int) -> dict:
        out = {"update": {}, "sent": {}, "bytes": 0,
               "raw": sum(d.numel() * 4 for d in deltas.values())}
        for key, delta in deltas.items():
            update, dq, counted = self.exchange(delta, step, key)
            out["update"][key], out["sent"][key] = update, dq
            out["bytes"] += counted
        return out

    def _join(self) -> None:
        if self._call is not None:
            t0 = time.perf_counter()
            call, self._call = self._call, None
            call.wait()
            self.stats.observe("dp wait ms", (time.perf_counter() - t0) * 1000)
            self._result = call.result()   # raises what the exchange raised
        if self._result is not None:
            self._pending, self._result = self._result, None
            self.stats.add("dp", self._pending["bytes"], self._pending["raw"])
            self._pending.pop("bytes")

    def apply_pending(self, segments: Dict[str, List[torch.Tensor]]) -> None:
        self._join()
        if self._pending is None:
            return
        for key, params in segments.items():
            u = self._pending["update"][key]
            self.global_copy[key] += u.to(self.global_copy[key].device)
            add_flat_(params, (u - self._pending["sent"][key]).to(params[0].device))
        self._pending = None

    # ---------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict:
        self._join()
        return clone_state({"global_copy": self.global_copy, "pending": self._pending,
                            "exchange": self.exchange.state_dict()})

    def load_state_dict(self, sd: dict) -> None:
        if not sd:
            return
        self.global_copy = clone_state(sd.get("global_copy"))
        self._pending = clone_state(sd.get("pending"))
        self._loaded = True
        self.exchange.load_state_dict(sd.get("exchange", {}))
