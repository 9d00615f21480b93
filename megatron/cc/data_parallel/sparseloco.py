"""--dp-mode sparseloco: DiLoCo's loop with SparseLoCo's exchange (top-k per chunk of the
pseudo-gradient plus a decayed error buffer, low-bit values, all-gathered) and a plain outer
SGD step (megatron/cc/data_parallel/sparseloco_sync.py)."""
import math
from dataclasses import dataclass

from megatron.cc.codecs.chunk_topk import ChunkTopKCodec
from megatron.cc.common.config_fields import ConfigError, flag
from megatron.cc.data_parallel.diloco import DiLoCoLoop, LocalSteps
from megatron.cc.data_parallel.sparseloco_sync import SparseLoCoSync, sync_bytes


@dataclass
class SparseLoCo(LocalSteps):
    name = "sparseloco"
    own_group = quantises = True
    sparseloco_outer_lr: float = flag(
        1.0, "sparseloco: learning rate alpha of the outer SGD (no momentum: the decayed error "
             "buffer takes its place), > 0.")
    sparseloco_outer_momentum: float = flag(
        0.0, "sparseloco: Nesterov momentum of the outer SGD over the decoded sparse mean, in "
             "[0, 1) (0, the paper's: the decayed error buffer takes its place).")
    sparseloco_error_decay: float = flag(
        0.95, "sparseloco: beta in e <- beta e + pseudo-gradient before the top-k, in [0, 1].")
    sparseloco_density: float = flag(
        1 / 64, "sparseloco: share k / C of every chunk sent, in (0, 1] (k = round(density C), "
                "at least 1; 1 sends every value, without indices).")
    sparseloco_chunk_size: int = flag(
        4096, "sparseloco: C, values per top-k chunk of the flat pseudo-gradient; a kept "
              "position costs ceil(log2 C) bits (12 at 4096). Must divide the tied "
              "embedding's size.", low=1)
    sparseloco_bits: int = flag(
        2, "sparseloco: bits per kept value, 1..8 (--quant-scheme), one 16-bit scale per "
           "chunk.", low=1, high=8)

    @staticmethod
    def fragment_bytes(c, shapes, world: int) -> int:
        """sparseloco.sync_bytes (all-gather, D P / 2) of the fragment's flat vector."""
        codec = ChunkTopKCodec(c.sparseloco_density, c.sparseloco_chunk_size, c.sparseloco_bits)
        return sync_bytes(sum(math.prod(s) for s in shapes), world, codec)

    @staticmethod
    def check(c, pp: int, dp: int) -> None:
        DiLoCoLoop.check(c, pp, dp)
        if not 0.0 < c.sparseloco_density <= 1.0:
            raise ConfigError(f"--sparseloco-density must be in (0, 1], got "
                              f"{c.sparseloco_density}")
        if not 0.0 <= c.sparseloco_error_decay <= 1.0:
            raise ConfigError(f"--sparseloco-error-decay must be in [0, 1], got "
                              f"{c.sparseloco_error_decay}")
        if c.sparseloco_outer_lr <= 0:
            raise ConfigError(f"--sparseloco-outer-lr must be > 0, got {c.sparseloco_outer_lr}")
        if not 0.0 <= c.sparseloco_outer_momentum < 1.0:
            raise ConfigError(f"--sparseloco-outer-momentum must be in [0, 1), got "
                              f"{c.sparseloco_outer_momentum}")

    @staticmethod
    def build(c, topo, stats, run):
        # the codec's stochastic rounding draws differently on every replica
        codec = ChunkTopKCodec(c.sparseloco_density, c.sparseloco_chunk_size, c.sparseloco_bits,
                               c.stochastic_rounding, run.seed + topo.dp_rank, c.quant_scheme)
        return SparseLoCoSync(topo.dp_group, stats, codec, c.diloco_inner_steps,
                              c.sparseloco_outer_lr, c.sparseloco_error_decay, c.diloco_fragments,
                              c.diloco_sync_delay, reduce_group=DiLoCoLoop.reduce_group(c, topo),
                              outer_momentum=c.sparseloco_outer_momentum,
                              capture_dir=DiLoCoLoop.capture_dir(c),
                              sync_steps=DiLoCoLoop.sync_steps(c))
