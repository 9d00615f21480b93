"""--dp-mode diloco: H inner steps, then an outer Nesterov step on the averaged pseudo-gradient,
exact, through a sharded-exchange codec or low-rank (PowerSGD per matrix); Streaming DiLoCo's
fragments and sync delay (megatron/cc/data_parallel/diloco_sync.py). DiLoCoLoop's flags and
LocalSteps' cost model are SparseLoCo's too."""
import math
import os
from dataclasses import dataclass
from types import SimpleNamespace

from megatron.cc.common.config_fields import ConfigError, flag
from megatron.cc.data_parallel.base import GRAD_BYTES, DpMode, segment_specs
from megatron.cc.data_parallel.cocktail_sgd import flat_codec, sharded_exchange, sharded_exchange_bytes
from megatron.cc.data_parallel.diloco_sync import SAME, DiLoCoSync, split_fragments
from megatron.cc.data_parallel.sync_schedule import parse_rule, shortest_window
from megatron.cc.data_parallel.flat_codecs import parse_fixpoint_bits
from megatron.cc.data_parallel.lowrank_exchange import (PowerSGDExchange, parse_powersgd_rank,
                                                    sync_bytes as lowrank_bytes)


@dataclass
class DiLoCoLoop:
    """The inner loop's flags, one config section that diloco and sparseloco share."""
    diloco_inner_steps: int = flag(100, "diloco, sparseloco: H, local optimizer steps between "
                                        "outer steps (SparseLoCo's paper runs 15).", low=1)
    diloco_fragments: int = flag(
        1, "diloco, sparseloco: Streaming DiLoCo, the stage's layers cut into F fragments "
           "synchronised in turn every H/F steps (--diloco-inner-steps must be divisible by "
           "F); under sparseloco every fragment goes through its codec with its own error "
           "buffer.")
    diloco_sync_delay: int = flag(
        0, "diloco, sparseloco: overlap a fragment's outer exchange with this many following "
           "inner steps (background thread); the update is applied then, keeping the local "
           "progress of those steps. Must be < H/F.")

    diloco_sync_steps: str = flag(
        "", "diloco, sparseloco: sync after these inner steps (comma-separated, increasing, "
            "e.g. 33,54,77,103,140,300), then every --diloco-inner-steps after the last; or "
            "lr<p>:<K>, e.g. lr2:6: K syncs cutting the run into windows of equal sum of lr^p "
            "under its own learning-rate schedule (short windows while the rate is high; "
            "p = 2: equal drift of the replicas, the quadratic synchronisation rule). Needs "
            "--diloco-fragments 1 and --diloco-sync-delay below the shortest window. Empty: "
            "every H steps.")

    diloco_capture_dir: str = flag(
        "", "diloco, sparseloco: write every replica's pseudo-gradient at every sync (fp32, "
            "before error feedback, with its tensors' shapes) to this directory, one file per "
            "sync, fragment and rank, for codec studies (bench/bench_pseudograd_codecs.py). "
            "A host copy per sync; empty: off.")

    @staticmethod
    def check(c, pp: int, dp: int) -> None:
        if c.diloco_capture_dir and os.path.exists(c.diloco_capture_dir) \
                and not os.path.isdir(c.diloco_capture_dir):
            raise ConfigError(f"--diloco-capture-dir {c.diloco_capture_dir} is a file; give a "
                              f"directory (created if missing)")
        if c.diloco_fragments < 1 or c.diloco_inner_steps % c.diloco_fragments:
            raise ConfigError(f"--diloco-fragments {c.diloco_fragments} must be >= 1 and "
                              f"divide --diloco-inner-steps {c.diloco_inner_steps}")
        if not 0 <= c.diloco_sync_delay < c.diloco_inner_steps // c.diloco_fragments:
            raise ConfigError(f"--diloco-sync-delay {c.diloco_sync_delay} must be >= 0 and "
                              f"smaller than --diloco-inner-steps / --diloco-fragments "
                              f"({c.diloco_inner_steps // c.diloco_fragments})")
        # only under these modes: with another, the flag itself is the mistake
        steps = DiLoCoLoop.sync_steps(c) if c.dp_mode in ("diloco", "sparseloco") else ()
        if steps and c.diloco_fragments != 1:
            raise ConfigError(f"--diloco-sync-steps schedules one fragment; drop it or set "
                              f"--diloco-fragments 1 (got {c.diloco_fragments})")
        if steps and c.diloco_sync_delay >= shortest_window(steps):
            raise ConfigError(f"--diloco-sync-delay {c.diloco_sync_delay} must be smaller than "
                              f"the shortest window of --diloco-sync-steps "
                              f"({shortest_window(steps)} steps)")

    @staticmethod
    def sync_steps(c) -> tuple:
        """--diloco-sync-steps as a tuple of increasing ints >= 1 (empty: every H)."""
        text = c.diloco_sync_steps.strip()
        if not text:
            return ()
        if parse_rule(text):   # arguments.resolve_sync_rule turns it into steps first
            raise ConfigError(f"--diloco-sync-steps {text}: a rule needs the run's learning-"
                              f"rate schedule; parse the flags with megatron.training's "
                              f"parse_args, which resolves it")
        try:
            steps = tuple(int(s) for s in text.split(","))
        except ValueError:
            raise ConfigError(f"--diloco-sync-steps {text!r}: give inner steps as integers "
                              f"separated by commas, e.g. 30,55,85, or a rule lr<p>:<K>, "
                              f"e.g. lr2:6") from None
        if steps[0] < 1 or any(b <= a for a, b in zip(steps, steps[1:])):
            raise ConfigError(f"--diloco-sync-steps {text!r}: the steps must be >= 1 and "
                              f"strictly increasing")
        return steps

    @staticmethod
    def schedule(c) -> SimpleNamespace:
        """What DiLoCoSync.due / .window read (F, H, sync_steps), from the flags: the
        planner and parse_args ask when the run syncs without building the channel."""
        return SimpleNamespace(F=c.diloco_fragments, H=c.diloco_inner_steps,
                               sync_steps=DiLoCoLoop.sync_steps(c))

    @staticmethod
    def capture_dir(c):
        """--diloco-capture-dir, created (every rank may race to it), or None."""
        if not c.diloco_capture_dir:
            return None
        os.makedirs(c.diloco_capture_dir, exist_ok=True)
        return c.diloco_capture_dir

    @staticmethod
    def reduce_group(c, topo):
        """A background reduce (sync delay) or another backend needs a group of its own."""
        return topo.channel_group(topo.dp_group, c.dp_backend,
                                  own=bool(c.dp_backend or c.diloco_sync_delay))


class LocalSteps(DpMode):
    """What diloco and sparseloco share besides DiLoCoLoop's flags: the cost model per sync."""
    sections = (DiLoCoLoop,)

    @classmethod
    def stage_bytes(cls, c, params, layout, stage, iteration):
        """Per fragment at its sync (`fragment_bytes`): the fragments due at `iteration`
        (counted tau steps after their sync, raw over the sync's window), or the H-period
        average when iteration is None (a --diloco-sync-steps schedule: its mean window);
        fragments from diloco.py's own `split_fragments`."""
        sched, tau = DiLoCoLoop.schedule(c), c.diloco_sync_delay
        H, F, steps = sched.H, sched.F, sched.sync_steps
        # split_fragments asks numel() of a parameter; a ParamSpec has it as a property
        segments = {k: [SimpleNamespace(numel=lambda n=p.numel: n, shape=tuple(p.shape))
                        for p in v] for k, v in segment_specs(params).items()}
        shapes = [[p.shape for p in f] for f in split_fragments(segments, F)]
        sizes = [sum(math.prod(s) for s in f) for f in shapes]
        if iteration is None:   # a schedule: its mean window stands for H
            counted, window = range(F), (steps[-1] / len(steps) if steps else H)
            scale = 1.0 / window
        else:
            step = iteration + 1 - tau   # the sync step whose bytes are counted now
            counted = DiLoCoSync.due(sched, step) if step > 0 else []
            window, scale = (DiLoCoSync.window(sched, step) if counted else H), 1
        sent = sum(cls.fragment_bytes(c, shapes[f], layout.dp) for f in counted) * scale
        raw = sum(GRAD_BYTES * sizes[f] * window for f in counted) * scale
        return {"sent": sent, "raw": raw, "messages": len(counted) * scale}

    @staticmethod
    def fragment_bytes(c, shapes, world: int) -> int:
        """What one sync of a fragment of tensors shaped `shapes` counts."""
        raise NotImplementedError


@dataclass
class DiLoCo(LocalSteps):
    name = "diloco"
    own_group = quantises = True
    diloco_outer_lr: float = flag(0.7, "diloco: learning rate of the outer SGD.")
    diloco_outer_momentum: float = flag(
        0.9, "diloco: Nesterov momentum of the outer SGD, in [0, 1) (0: plain SGD).")
    diloco_compression: str = flag(
        "none", "diloco: codec of the pseudo-gradient exchange: none (exact fp32 all-reduce), "
                "fp16, int8, fixpoint-<bits> (e.g. fixpoint-4), cocktail (--cocktail-* "
                "settings), powersgd-<rank> (e.g. powersgd-4: one warm-started PowerSGD "
                "round per matrix, DiLoCoX's low-rank exchange; vectors exact in fp32). "
                "Lossy codecs keep each replica's residual (error feedback).")
    diloco_final_compression: str = flag(
        "", "diloco: codec of the run's last sync (after --train-iters), whose error no later "
            "sync repays and which the delivered model keeps: none (exact), fp16, int8, "
            "fixpoint-<bits> or cocktail, with a flat --diloco-compression (none, fp16, int8, "
            "fixpoint-<bits>, cocktail). Empty: --diloco-compression.")
    diloco_error_decay: float = flag(
        1.0, "diloco: beta, the weight of the codec's residuals (each replica's and each "
             "shard owner's) when added to the next sync, in [0, 1] (1: plain error feedback; "
             "0: none, every sync stands alone). fp16, int8, fixpoint-<bits> and cocktail "
             "only.")
    diloco_residual_in_model: bool = flag(
        False, "diloco: each replica restarts from the new global model minus its own codec "
               "residual (what it did not send), so error feedback is held in the replica's "
               "weights instead of its next message; the next pseudo-gradient carries it. "
               "--diloco-error-decay then weighs only the shard owners' server errors. Needs "
               "--diloco-compression int8, fixpoint-<bits> or cocktail; the sync after "
               "--train-iters leaves every replica on the global model.")
    diloco_final_average: bool = flag(
        False, "diloco: the sync after --train-iters sets the model to the replicas' decoded "
               "mean (outer lr 1, no momentum) instead of an outer Nesterov step: at the end "
               "of a decayed schedule, their average rather than an extrapolation of it.")

    @staticmethod
    def borrows(c):
        return ("cocktail_random_ratio", "cocktail_topk_ratio") \
            if c.diloco_compression == "cocktail" else ()

    @staticmethod
    def profile(c) -> str:
        name = c.diloco_compression
        if parse_powersgd_rank(name):
            return "powersgd"
        return name if name in ("none", "fp16", "int8", "cocktail") else "fixpoint-b"

    @staticmethod
    def fragment_bytes(c, shapes, world: int) -> int:
        """4 n exact, lowrank_exchange.sync_bytes for powersgd-r, else the ShardedExchange's
        count."""
        name, numel = c.diloco_compression, sum(math.prod(s) for s in shapes)
        if name == "none":
            return GRAD_BYTES * numel
        rank = parse_powersgd_rank(name)
        if rank:
            return lowrank_bytes(shapes, rank)
        return sharded_exchange_bytes(numel, world, flat_codec(c, name))

    @staticmethod
    def check(c, pp: int, dp: int) -> None:
        DiLoCoLoop.check(c, pp, dp)
        if c.diloco_outer_lr <= 0 or not 0.0 <= c.diloco_outer_momentum < 1.0:
            raise ConfigError(f"--diloco-outer-lr must be > 0 and --diloco-outer-momentum in "
                              f"[0, 1), got {c.diloco_outer_lr}, {c.diloco_outer_momentum}")
        name, bits = c.diloco_compression, parse_fixpoint_bits(c.diloco_compression)
        rank = parse_powersgd_rank(name)
        if rank == 0:
            raise ConfigError(f"--diloco-compression {name!r}: expected powersgd-<rank>, the "
                              f"rank an integer >= 1 (e.g. powersgd-4)")
        if name not in ("none", "fp16", "cocktail") and rank is None \
                and (bits is None or not 1 <= bits <= 8):
            raise ConfigError(f"--diloco-compression {name!r}: expected none, fp16, int8, "
                              f"fixpoint-<bits 1..8>, cocktail or powersgd-<rank>")
        final = c.diloco_final_compression
        known = final in ("none", "fp16", "int8", "cocktail") \
            or 1 <= (parse_fixpoint_bits(final) or 0) <= 8
        if c.dp_mode == "diloco" and final and (not known or rank):
            raise ConfigError(f"--diloco-final-compression {final!r}: expected none, fp16, int8, "
                              f"fixpoint-<bits 1..8> or cocktail, with a flat "
                              f"--diloco-compression (got {name})")
        if not 0.0 <= c.diloco_error_decay <= 1.0:
            raise ConfigError(f"--diloco-error-decay must be in [0, 1], got "
                              f"{c.diloco_error_decay}")
        # only under this mode: with another, the flag itself is the mistake (validate_dp_mode)
        if c.dp_mode == "diloco" and c.diloco_error_decay != 1.0 and (name == "none" or rank):
            raise ConfigError(f"--diloco-error-decay {c.diloco_error_decay} weighs the residuals "
                              f"of a flat codec (fp16, int8, fixpoint-<bits>, cocktail); "
                              f"--diloco-compression {name} keeps none of its own: drop the flag")
        if c.dp_mode == "diloco" and c.diloco_residual_in_model and (
                name in ("none", "fp16") or rank):
            raise ConfigError(f"--diloco-residual-in-model keeps a lossy flat codec's residual "
                              f"in the replica's weights: it needs --diloco-compression int8, "
                              f"fixpoint-<bits> or cocktail (got {name})")

    @staticmethod
    def build(c, topo, stats, run):
        group = DiLoCoLoop.reduce_group(c, topo)
        rank = parse_powersgd_rank(c.diloco_compression)
        if rank:   # the first Qs drawn alike on every replica, as --grad-comp's (--comp-seed)
            exchange = PowerSGDExchange(group, rank, seed=run.comp_seed)
        elif c.diloco_compression == "none":
            exchange = None
        else:
            exchange = sharded_exchange(c, group, c.diloco_compression, run.seed,
                                        c.diloco_error_decay)
        final = SAME
        if c.diloco_final_compression:   # its own exchange: its own server errors and rng
            final = None if c.diloco_final_compression == "none" else \
                sharded_exchange(c, group, c.diloco_final_compression, run.seed,
                                 c.diloco_error_decay)
        return DiLoCoSync(topo.dp_group, stats, c.diloco_inner_steps, c.diloco_outer_lr,
                          c.diloco_outer_momentum, exchange, c.diloco_fragments,
                          c.diloco_sync_delay, reduce_group=group,
                          error_decay=c.diloco_error_decay,
                          capture_dir=DiLoCoLoop.capture_dir(c),
                          sync_steps=DiLoCoLoop.sync_steps(c), last_step=run.train_iters,
                          residual_in_model=c.diloco_residual_in_model,
                          final=final, final_average=c.diloco_final_average)
