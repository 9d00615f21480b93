"""DiLoCo (Douillard et al. 2023) and Streaming DiLoCo (2025) on the dp channel.

Each replica runs H inner optimizer steps with no dp traffic; then, per fragment:

    Delta   = mean_i (theta_g - theta_i + e_i)    exact all-reduce, ShardedExchange (flat
                                                  codecs) or PowerSGDExchange (low rank)
    m       = mu m + Delta;   theta_g <- theta_g - lr (Delta + mu m);   theta_i <- theta_g

with e_i the replica's codec residual; the inner optimizer state is kept. The fragment
schedule, sync delay, error feedback and last sync are described in docs/data_parallel.md.
SparseLoCo (sparseloco.py) is this class with its own decay and exchange.
"""
import time
from typing import Dict, List, Optional

import torch
import torch.distributed as dist

from megatron.cc.common.background import BackgroundCall
from megatron.cc.grad_sync.channel import SyncChannel
from megatron.cc.grad_sync.param_sync import (clone_state, copy_flat_, flatten, param_segments,
                                              to_device)
from megatron.cc.data_parallel.pseudo_grad_capture import save_pseudo_gradient
from megatron.cc.data_parallel.sync_schedule import previous_sync, scheduled, shortest_window
from megatron.cc.common.stats import ChannelStats

SAME = object()   # DiLoCoSync(final=...): the last sync goes through the usual exchange


def split_fragments(segments: Dict[str, List[torch.Tensor]], fragments: int) -> List[List]:
    """F lists of parameters of about equal size, in model order; the embedding in the first."""
    emb = segments.get("embedding", [])
    rest = segments.get("params", [])
    total = sum(p.numel() for p in emb + rest)
    out: List[List[torch.Tensor]] = [list(emb)] + [[] for _ in range(fragments - 1)]
    filled = sum(p.numel() for p in emb)
    for p in rest:
        f = min(fragments - 1, filled * fragments // max(total, 1))
        out[f].append(p)
        filled += p.numel()
    return out


class DiLoCoSync(SyncChannel):
    """dp mode `diloco`.

    Args:
        group, stats: dp group of this stage; where "dp" bytes are counted.
        inner_steps: H. outer_lr, outer_momentum: the outer Nesterov SGD.
        exchange: None (exact fp32 all-reduce), a ShardedExchange (the replica keeps its
            residual for its next pseudo-gradient) or a PowerSGDExchange (keeps its own).
        fragments: F, 1 <= F, H % F == 0. sync_delay: tau, inner steps a reduce overlaps.
        error_decay: beta, the residual's weight in the next pseudo-gradient (1: plain
            error feedback).
        capture_dir: write each pseudo-gradient there at its sync, or None.
        sync_steps: increasing inner steps to sync after, then every H (F = 1); () syncs
            every H.
        last_step: the run's last inner step (0: unknown), whose sync the next three treat
            apart.
        final: the exchange of that last sync: None is exact and repays every pending error;
            a lossy one repays the owners' server errors through its codec; SAME: `exchange`.
        residual_in_model: after every sync but the last, restart from theta_g minus the
            replica's own residual (error_decay then weighs only the owners' server errors).
        final_average: the last sync sets theta_g to the decoded mean (lr 1, no momentum).
    """

    def __init__(self, group, stats: ChannelStats, inner_steps: int = 100,
                 outer_lr: float = 0.7, outer_momentum: float = 0.9, exchange=None,
                 fragments: int = 1, sync_delay: int = 0, reduce_group=None,
                 error_decay: float = 1.0, capture_dir=None, sync_steps=(), final=SAME,
                 last_step: int = 0, residual_in_model: bool = False,
                 final_average: bool = False):
        if inner_steps < 1 or fragments < 1 or inner_steps % fragments:
            raise ValueError(f"need inner_steps >= 1 divisible by fragments >= 1, got "
                             f"{inner_steps}, {fragments}")
        if not 0 <= sync_delay < inner_steps // fragments:
            raise ValueError(f"sync_delay must be in [0, H/F), got {sync_delay}")
        self.sync_steps = tuple(sync_steps)
        if self.sync_steps and (fragments > 1 or sync_delay >= shortest_window(self.sync_steps)
                                or list(self.sync_steps) != sorted(set(self.sync_steps))
                                or self.sync_steps[0] < 1):
            raise ValueError(f"sync_steps must increase from >= 1, with one fragment and "
                             f"sync_delay below the shortest window, got {self.sync_steps}, "
                             f"F {fragments}, delay {sync_delay}")
        self.group, self.stats, self.H, self.F = group, stats, inner_steps, fragments
        # the background reduce needs a group no other thread uses (see groups.clone_groups)
        self.reduce_group = reduce_group if reduce_group is not None else group
        self.world = dist.get_world_size(group)
        self.lr, self.mu, self.exchange = outer_lr, outer_momentum, exchange
        self.tau, self.capture_dir = sync_delay, capture_dir
        # the replica's residual goes into its next message (decay) or stays in its weights
        # (residual_in_model); the owners' server errors are weighed by error_decay either way
        self.last_step, self.residual_in_model = last_step, residual_in_model
        self.final_average = final_average
        self.decay, self.server_decay = (0.0 if residual_in_model else error_decay), error_decay
        self.final = final
        self.global_copy: Optional[List[torch.Tensor]] = None   # theta_g per fragment
        self.momentum: List[Optional[torch.Tensor]] = [None] * fragments
        self.residual: List[Optional[torch.Tensor]] = [None] * fragments
        self._inflight: Optional[dict] = None    # one fragment's overlapped reduce
        self._call: Optional[BackgroundCall] = None   # its reduce on a background thread
        self._loaded = False   # state from a checkpoint, not yet on the parameters' device

    def __call__(self, model, iteration: int) -> None:
        """Gradient phase: nothing crosses the dp group (inner steps are local)."""
        if self._loaded:   # resumed: the checkpoint's CPU state joins the parameters
            device = next(iter(param_segments(model).values()))[0].device
            self.global_copy, self.momentum, self.residual, self._inflight = to_device(
                [self.global_copy, self.momentum, self.residual, self._inflight], device)
            self._loaded = False
            if self.exchange is not None:
                self.exchange.to(device)
        if self.global_copy is None:   # params agree here (initialisation or a resumed sync)
            self.global_copy = [flatten(f) for f in self._fragments(model)]

    def _fragments(self, model):
        return split_fragments(param_segments(model), self.F)

    def due(self, step: int) -> List[int]:
        """Fragments that sync after inner step `step` (1-based)."""
        if self.sync_steps:
            return [0] if scheduled(step, self.H, self.sync_steps) else []
        out = []
        for f in range(self.F):
            s = step - f * self.H // self.F
            if s > 0 and s % self.H == 0:
                out.append(f)
        return out

    def after_optimizer_step(self, model, iteration: int) -> None:
        step = iteration + 1
        t0 = time.perf_counter()
        frags = None
        if self._inflight is not None and step >= self._inflight["apply_at"]:
            frags = self._fragments(model)
            self._finish(frags)
        due = self.due(step)
        if not due and frags is None:
            return
        frags = frags or self._fragments(model)
        for f in due:
            snapshot = flatten(frags[f])
            job = {"f": f, "snapshot": snapshot, "apply_at": step + self.tau,
                   "delta": self.global_copy[f] - snapshot.to(self.global_copy[f].device),
                   "iteration": iteration, "shapes": [tuple(p.shape) for p in frags[f]],
                   "window": self.window(step), "step": step}
            if self.tau == 0:
                self._reduce(job)
                self._apply(job, frags[job["f"]])
            else:
                self._inflight = job
                self._call = BackgroundCall("DiLoCo outer reduce failed", self._reduce, job)
        self.stats.observe("dp wait ms", (time.perf_counter() - t0) * 1000)

    def window(self, step: int) -> int:
        """Inner steps since the previous sync of a fragment due at `step`: H, or what the
        schedule leaves."""
        if self.sync_steps:
            return step - previous_sync(step, self.H, self.sync_steps)
        return self.H

    def flush(self, model) -> None:
        if self._inflight is not None:
            self._finish(self._fragments(model))

    # ---------------------------------------------------------------- outer step parts
    def _reduce(self, job: dict) -> None:
        """Mean pseudo-gradient of job's fragment (may run on a background thread)."""
        f, delta = job["f"], job.pop("delta")
        if self.capture_dir:
            save_pseudo_gradient(self.capture_dir, delta, job["shapes"], job["iteration"] + 1, f,
                                 dist.get_rank(), dist.get_rank(self.group), self.world)
        exchange = self.exchange
        if self.final is not SAME and self._last(job):
            exchange = self.final
            if exchange is None:   # exact: every pending error repaid now
                if self.residual[f] is not None and self.decay:
                    delta.add_(self.residual[f], alpha=self.decay)
                    self.residual[f] = None
                owed = getattr(self.exchange, "owed", None) if self.server_decay else None
                server = owed(delta.numel(), str(f)) if owed else None   # the sharded exchange's
                if server is not None:
                    delta.add_(server.to(delta.device), alpha=self.server_decay)
            elif self.server_decay and hasattr(self.exchange, "server_error"):
                # a lossy last sync: its owners repay the pending server errors through it
                pending = self.exchange.server_error.pop(str(f), None)
                if pending is not None:
                    exchange.server_error[str(f)] = pending
        if exchange is None:
            dist.all_reduce(delta, group=self.reduce_group)
            delta /= self.world
            job["sent"] = delta.numel() * delta.element_size()
        else:
            if self.residual[f] is not None and self.decay:   # alpha 1: as a plain add
                delta.add_(self.residual[f], alpha=self.decay)
            # the fragment's shapes: a per-parameter codec (low rank) cuts the vector up by them
            mean, dq, job["sent"] = exchange(delta, job["iteration"], key=str(f),
                                             shapes=job["shapes"])
            if dq is not None:   # None: the codec keeps its residuals itself (PowerSGD's E)
                self.residual[f] = delta - dq
            delta = mean
        job["mean"] = delta

    def _finish(self, frags) -> None:
        if self._call is not None:
            call, self._call = self._call, None
            call.result()   # raises what the reduce raised
        job, self._inflight = self._inflight, None
        self._apply(job, frags[job["f"]])

    def _last(self, job: dict) -> bool:
        """Is `job` the run's last sync (after --train-iters)?"""
        return bool(self.last_step) and job.get("step") == self.last_step

    def _apply(self, job: dict, params: List[torch.Tensor]) -> None:
        """Outer Nesterov step on theta_g; the replica restarts from it, keeping whatever it
        learned since the snapshot (the tau overlapped steps; nothing when tau = 0)."""
        f, delta = job["f"], job["mean"]
        g = self.global_copy[f]
        last = self._last(job)
        if last and self.final_average:   # the replicas' mean, no extrapolation
            g.sub_(delta)
        elif self.mu:
            m = self.momentum[f]
            m = delta.clone() if m is None else m.mul_(self.mu).add_(delta)
            self.momentum[f] = m
            g.sub_(delta + self.mu * m, alpha=self.lr)   # Nesterov
        else:
            g.sub_(delta, alpha=self.lr)
        target = g
        if self.residual_in_model and not last \
                and self.residual[f] is not None:   # keep what this replica did not send
            target = g - self.residual[f]
        if self.tau:
            local = flatten(params)
            copy_flat_(params, (target + (local - job["snapshot"]).to(g.device))
                       .to(params[0].device))
        else:
            copy_flat_(params, target.to(params[0].device))
        # raw: an fp32 gradient all-reduce for every inner step since this fragment's last sync
        self.stats.add("dp", job["sent"], g.numel() * 4 * job.get("window", self.H))

    # ---------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict:
        if self._call is not None:     # keep the finished reduce, applied after resume
            self._call.wait()
        return clone_state({"global_copy": self.global_copy, "momentum": self.momentum,
                            "residual": self.residual, "inflight": self._inflight,
                            "exchange": None if self.exchange is None
                            else self.exchange.state_dict()})

    def load_state_dict(self, sd: dict) -> None:
        if not sd:
            return
        self.global_copy = clone_state(sd.get("global_copy"))
        self.momentum = clone_state(sd.get("momentum", [None] * self.F))
        self.residual = clone_state(sd.get("residual", [None] * self.F))
        self._inflight = clone_state(sd.get("inflight"))
        self._loaded = True
        if self.exchange is not None and sd.get("exchange"):
            self.exchange.load_state_dict(sd["exchange"])
