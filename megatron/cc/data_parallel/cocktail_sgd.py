"""--dp-mode cocktail_sgd (alias cocktail): CocktailSGD's compressed parameter deltas in the
sharded exchange, one step stale (megatron/cc/data_parallel/cocktail_sync.py)."""
import math
from dataclasses import dataclass

from megatron.cc.common.config_fields import ConfigError, flag
from megatron.cc.data_parallel.base import GRAD_BYTES, DpMode, exact_bytes, segment_specs
from megatron.cc.data_parallel.cocktail_sync import CocktailSGDSync
from megatron.cc.data_parallel.flat_codecs import make_flat_codec
from megatron.cc.data_parallel.sharded_exchange import ShardedExchange


def flat_codec(c, name: str, seed: int = 0):
    """The sharded exchange's codec `name` with the --cocktail-* settings (DiLoCo's codecs and
    the planner's byte counts too)."""
    return make_flat_codec(name, seed=seed, stochastic=c.stochastic_rounding, bits=c.cocktail_bits,
                           random_ratio=c.cocktail_random_ratio,
                           topk_ratio=c.cocktail_topk_ratio, bucket_size=c.cocktail_bucket_size,
                           scheme=c.quant_scheme)


def sharded_exchange(c, group, name: str, seed: int,
                     error_decay: float = 1.0) -> ShardedExchange:
    # the rolling mask depends on the seed: equal on every replica, for both phases
    return ShardedExchange(group, flat_codec(c, name, seed), flat_codec(c, name, seed),
                           error_decay)


def sharded_exchange_bytes(numel: int, world: int, codec) -> int:
    """ShardedExchange's count for one n-value vector: both phases' payloads over all shards,
    halved (an all-reduce message), with shards of ceil(n / D) values."""
    s = -(-numel // world)
    payload = sum(math.prod(shape) * dt.itemsize for shape, dt in codec.flat_spec(s))
    return (world * payload + world * payload) // 2


@dataclass
class CocktailSGD(DpMode):
    name = "cocktail_sgd"
    aliases = ("cocktail",)
    own_group = quantises = True
    shared = ("cocktail_bits", "cocktail_bucket_size")   # DiLoCo's int8 / fixpoint-b read them
    cocktail_random_ratio: float = flag(
        0.1, "cocktail_sgd: share of entries in the random rolling subset, in (0, 1].")
    cocktail_topk_ratio: float = flag(
        0.2, "cocktail_sgd: share of the subset kept by magnitude (top-k), in (0, 1].")
    cocktail_bits: int = flag(4, "cocktail_sgd (and --diloco-compression cocktail): bits per "
                                 "kept value, 1..8.", low=1, high=8)
    cocktail_bucket_size: int = flag(
        128, "cocktail_sgd: kept values per 16-bit scale (also the bucket of int8/fixpoint-b).")
    cocktail_warmup_steps: int = flag(
        0, "cocktail_sgd: iterations that all-reduce gradients exactly before the compressed "
           "exchange starts.")
    cocktail_no_overlap: bool = flag(
        False, "cocktail_sgd: run the exchange inline after the optimizer step instead of on a "
               "background thread overlapping the next forward/backward (one step stale).")

    @staticmethod
    def check(c, pp: int, dp: int) -> None:
        for name in ("cocktail_random_ratio", "cocktail_topk_ratio"):
            if not 0.0 < getattr(c, name) <= 1.0:
                raise ConfigError(f"--{name.replace('_', '-')} must be in (0, 1], got "
                                  f"{getattr(c, name)}")
        if c.cocktail_bucket_size < 1 or c.cocktail_warmup_steps < 0:
            raise ConfigError("--cocktail-bucket-size must be >= 1 and --cocktail-warmup-steps "
                              ">= 0")

    @staticmethod
    def profile(c) -> str:
        return "cocktail"

    @staticmethod
    def stage_bytes(c, params, layout, stage, iteration):
        """Exact during the warm-up; then per segment of n values (the tied embedding apart) a
        ShardedExchange of ceil(n / D)-value shards, counted (D P1 + D P2) / 2, one step late
        when overlapped."""
        if iteration is not None and iteration < c.cocktail_warmup_steps:
            return exact_bytes(params)
        if iteration == c.cocktail_warmup_steps and not c.cocktail_no_overlap:
            return {"sent": 0, "raw": 0, "messages": 0}   # the first exchange is counted next step
        codec = flat_codec(c, "cocktail")
        sizes = [sum(p.numel for p in v) for v in segment_specs(params).values()]
        return {"sent": sum(sharded_exchange_bytes(n, layout.dp, codec) for n in sizes),
                "raw": GRAD_BYTES * sum(sizes), "messages": 1}

    @staticmethod
    def build(c, topo, stats, run):
        overlap = not c.cocktail_no_overlap
        group = topo.channel_group(topo.dp_group, c.dp_backend,
                                   own=bool(overlap or c.dp_backend))
        return CocktailSGDSync(topo.dp_group, stats,
                               sharded_exchange(c, group, "cocktail", run.seed),
                               warmup_steps=c.cocktail_warmup_steps, overlap=overlap)
