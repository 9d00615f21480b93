"""The dp channel's registry: one plug-in per --dp-mode, one file each.

A plug-in (base.DpMode) owns its flags as dataclass fields, their checks (`check`) and a
`build(c, topo, stats, run)` that returns the finished SyncChannel; CompressionConfig holds an
instance of each (`dp_sections`). Adding a mode: a file here and a line in DP_MODES.
"""
from dataclasses import dataclass
from typing import Optional

from megatron.cc.common.config_fields import ConfigError, channel_sections, flag
from megatron.cc.data_parallel.adpsgd import ADPSGD
from megatron.cc.data_parallel.allreduce import AllReduce
from megatron.cc.data_parallel.base import DpRun
from megatron.cc.data_parallel.cocktail_sgd import CocktailSGD
from megatron.cc.data_parallel.diloco import DiLoCo
from megatron.cc.data_parallel.preduce import PReduce
from megatron.cc.data_parallel.sparseloco import SparseLoCo
from megatron.cc.data_parallel.hetero import HeteroDelay

DP_MODES = {m.name: m for m in (AllReduce, CocktailSGD, DiLoCo, SparseLoCo, PReduce, ADPSGD)}


class ModeNames:
    """--dp-mode's choices, names and aliases, read from DP_MODES when asked (a mode added to
    the registry is a choice at once)."""

    def __iter__(self):
        yield from DP_MODES
        yield from (a for m in DP_MODES.values() for a in m.aliases)

    def __contains__(self, name) -> bool:
        return name in list(self)

    @staticmethod
    def canonical(name: str) -> str:
        return next((m.name for m in DP_MODES.values() if name in m.aliases), name)


def dp_sections() -> tuple:
    """The dp channel's config dataclasses: its shared flags, then each mode's sections and
    own fields, in registry order."""
    return channel_sections(DpChannel, DP_MODES.values())


@dataclass
class DpChannel:   # the flags of every mode
    dp_mode: str = flag(
        "allreduce", "How data-parallel replicas of a stage synchronise. allreduce: gradients "
                     "(exact, or PowerSGD with --grad-comp). cocktail_sgd (alias cocktail): "
                     "compressed parameter deltas in a sharded exchange (CocktailSGD). preduce: "
                     "weight averaging with whoever is ready (SD-PIPE). adpsgd: random pairwise "
                     "weight averaging. diloco: H local steps, then an outer Nesterov step on "
                     "the averaged pseudo-gradient. sparseloco: DiLoCo's H local steps (the "
                     "--diloco-inner-steps / -fragments / -sync-delay flags), the pseudo-"
                     "gradient plus a decayed error buffer sent as top-k per chunk with "
                     "2-bit values, outer SGD (SparseLoCo).",
        choices=ModeNames())
    dp_backend: Optional[str] = flag(
        None, "Transport of the data-parallel channel: its own process group on this backend "
              "(allreduce/PowerSGD, cocktail_sgd, diloco, sparseloco): gloo (e.g. across a "
              "WAN; CUDA tensors staged through pinned host buffers) or nccl; default "
              "--distributed-backend.",
        choices=["gloo", "nccl"])
    dp_adam_correction: bool = flag(
        False, "Parameter-syncing modes with Adam: each replica's Adam divides by an estimate "
               "of the second moment of the all-reduced gradient instead of its own (from its "
               "own moments, no bytes), so the replicas' averaged steps follow Adam on the "
               "mean gradient instead of a ~sqrt(dp) smaller step (megatron/cc/grad_sync/"
               "replica_adam.py).")
    hetero: float = flag(
        0.0, "preduce/adpsgd/any mode: each replica sleeps a random share (up to this fraction, "
             "in [0, 1)) of its compute time per iteration, to emulate a heterogeneous cluster.")


class DpRules:
    """The dp channel's rules over the whole CompressionConfig (its fields live in
    dp_sections())."""

    def fold_dp_mode(self):
        self.dp_mode = ModeNames.canonical(self.dp_mode)   # one spelling from here on

    @property
    def dp_plugin(self):
        return DP_MODES[self.dp_mode]

    @property
    def syncs_parameters(self) -> bool:
        return self.dp_plugin.syncs_parameters

    def validate_dp_mode(self, pp: int, dp: int) -> None:
        mode = self.dp_mode
        if self.syncs_parameters and dp < 2:
            raise ConfigError(f"--dp-mode {mode} synchronises data-parallel replicas, "
                              f"but the data-parallel size is {dp}; launch more ranks or use "
                              f"--dp-mode allreduce")
        for plugin in DP_MODES.values():   # every mode's values, whichever is chosen
            plugin.check(self, pp, dp)
        if self.dp_adam_correction and not self.syncs_parameters:
            raise ConfigError(f"--dp-adam-correction corrects the local Adam steps of a "
                              f"parameter-syncing --dp-mode ("
                              f"{', '.join(n for n, m in DP_MODES.items() if m.syncs_parameters)}"
                              f"); --dp-mode {mode} already steps on the mean gradient")
        if not 0.0 <= self.hetero < 1.0:
            raise ConfigError(f"--hetero must be in [0, 1), got {self.hetero}")
        borrowed = self.dp_plugin.borrows(self)
        for name in (n for m in DP_MODES.values() for n in m.owned()):
            owners = [n for n, m in DP_MODES.items() if name in m.owned()]
            if mode not in owners and name not in borrowed and \
                    getattr(self, name) != self.default(name):
                raise ConfigError(f"--{name.replace('_', '-')} configures --dp-mode "
                                  f"{' or '.join(owners)}, but --dp-mode is {mode}")
        if self.dp_backend is not None and not self.dp_plugin.own_group:
            *names, last = [n for n, m in DP_MODES.items() if m.own_group]
            raise ConfigError(f"--dp-backend sets the dp channel's process group for "
                              f"{', '.join(names)} and {last}, but --dp-mode is {mode}")


def build_dp_channel(c, topo, stats, run: DpRun):
    """This rank's dp channel of --dp-mode, wrapped by --hetero's delay."""
    dp = DP_MODES[c.dp_mode].build(c, topo, stats, run)
    if c.hetero:   # emulated slow replicas, for comparing the dp modes under --hetero
        dp = HeteroDelay(dp, c.hetero, run.seed, topo.dp_rank)
    return dp
