"""--dp-mode diloco: H inner steps, then an outer Nesterov step on the averaged pseudo-gradient,
exact or through a sharded-exchange codec; Streaming DiLoCo's fragments and sync delay
(megatron/cc/grad_sync/diloco.py). DiLoCoLoop's flags are SparseLoCo's too."""
from dataclasses import dataclass
from types import SimpleNamespace

from megatron.cc.config_fields import ConfigError, flag
from megatron.cc.dp_modes.base import GRAD_BYTES, DpMode, segment_sizes
from megatron.cc.dp_modes.cocktail_sgd import flat_codec, sharded_exchange, sharded_exchange_bytes
from megatron.cc.grad_sync.diloco import DiLoCoSync, split_fragments
from megatron.cc.grad_sync.flat_codecs import parse_fixpoint_bits


@dataclass
class DiLoCoLoop(DpMode):
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

    @staticmethod
    def check(c, pp: int, dp: int) -> None:
        if c.diloco_fragments < 1 or c.diloco_inner_steps % c.diloco_fragments:
            raise ConfigError(f"--diloco-fragments {c.diloco_fragments} must be >= 1 and "
                              f"divide --diloco-inner-steps {c.diloco_inner_steps}")
        if not 0 <= c.diloco_sync_delay < c.diloco_inner_steps // c.diloco_fragments:
            raise ConfigError(f"--diloco-sync-delay {c.diloco_sync_delay} must be >= 0 and "
                              f"smaller than --diloco-inner-steps / --diloco-fragments "
                              f"({c.diloco_inner_steps // c.diloco_fragments})")

    @classmethod
    def stage_bytes(cls, c, params, layout, stage, iteration):
        """Per fragment at its sync (`fragment_bytes`): the fragments due at `iteration`
        (counted tau steps after their sync), or the H-period average when iteration is None;
        fragments from diloco.py's own `split_fragments`."""
        H, F, tau = c.diloco_inner_steps, c.diloco_fragments, c.diloco_sync_delay
        segments = {k: [SimpleNamespace(numel=lambda n=n: n) for n in v]
                    for k, v in segment_sizes(params).items()}
        sizes = [sum(p.numel() for p in f) for f in split_fragments(segments, F)]
        if iteration is None:
            counted, scale = range(F), 1.0 / H
        else:
            step = iteration + 1 - tau   # the sync step whose bytes are counted now
            counted = DiLoCoSync.due(SimpleNamespace(F=F, H=H), step) if step > 0 else []
            scale = 1
        sent = sum(cls.fragment_bytes(c, sizes[f], layout.dp) for f in counted) * scale
        raw = sum(GRAD_BYTES * sizes[f] * H for f in counted) * scale
        return {"sent": sent, "raw": raw, "messages": len(counted) * scale}

    @staticmethod
    def fragment_bytes(c, numel: int, world: int) -> int:
        """What one sync of a `numel`-value fragment counts."""
        raise NotImplementedError

    @staticmethod
    def reduce_group(c, topo):
        """A background reduce (sync delay) or another backend needs a group of its own."""
        return topo.channel_group(topo.dp_group, c.dp_backend,
                                  own=bool(c.dp_backend or c.diloco_sync_delay))


@dataclass
class DiLoCo(DiLoCoLoop):
    name = "diloco"
    own_group = quantises = True
    diloco_outer_lr: float = flag(0.7, "diloco: learning rate of the outer SGD.")
    diloco_outer_momentum: float = flag(
        0.9, "diloco: Nesterov momentum of the outer SGD, in [0, 1) (0: plain SGD).")
    diloco_compression: str = flag(
        "none", "diloco: codec of the pseudo-gradient exchange: none (exact fp32 all-reduce), "
                "fp16, int8, fixpoint-<bits> (e.g. fixpoint-4), cocktail (--cocktail-* "
                "settings). Lossy codecs keep each replica's residual (error feedback).")

    @staticmethod
    def borrows(c):
        return ("cocktail_random_ratio", "cocktail_topk_ratio") \
            if c.diloco_compression == "cocktail" else ()

    @staticmethod
    def profile(c) -> str:
        name = c.diloco_compression
        return name if name in ("none", "fp16", "int8", "cocktail") else "fixpoint-b"

    @staticmethod
    def fragment_bytes(c, numel: int, world: int) -> int:
        """4 n exact, else the ShardedExchange's count."""
        if c.diloco_compression == "none":
            return GRAD_BYTES * numel
        return sharded_exchange_bytes(numel, world, flat_codec(c, c.diloco_compression))

    @staticmethod
    def check(c, pp: int, dp: int) -> None:
        DiLoCoLoop.check(c, pp, dp)
        if c.diloco_outer_lr <= 0 or not 0.0 <= c.diloco_outer_momentum < 1.0:
            raise ConfigError(f"--diloco-outer-lr must be > 0 and --diloco-outer-momentum in "
                              f"[0, 1), got {c.diloco_outer_lr}, {c.diloco_outer_momentum}")
        name, bits = c.diloco_compression, parse_fixpoint_bits(c.diloco_compression)
        if name not in ("none", "fp16", "cocktail") and (bits is None or not 1 <= bits <= 8):
            raise ConfigError(f"--diloco-compression {name!r}: expected none, fp16, int8, "
                              f"fixpoint-<bits 1..8> or cocktail")

    @staticmethod
    def build(c, topo, stats, run):
        group = DiLoCoLoop.reduce_group(c, topo)
        exchange = None if c.diloco_compression == "none" else \
            sharded_exchange(c, group, c.diloco_compression, run.seed)
        return DiLoCoSync(topo.dp_group, stats, c.diloco_inner_steps, c.diloco_outer_lr,
                          c.diloco_outer_momentum, exchange, c.diloco_fragments,
                          c.diloco_sync_delay, reduce_group=group)
