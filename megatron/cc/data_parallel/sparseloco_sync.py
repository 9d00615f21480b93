"""SparseLoCo (Sarfi, Thérien, Lidin, Belilovsky 2025) on the dp channel.

DiLoCo's loop (H inner steps, fragments, sync delay) where each replica adds its
pseudo-gradient to an error buffer decayed by beta, sends the top k of every chunk of C values
at b bits (all-gathered), keeps the rest, and theta_g takes a plain outer SGD step of the mean.
Bytes of one sync of n values over D replicas, m = ceil(n / C) chunks, i = ceil(log2 C):

    P(n)    = ceil(m k i / 8) + ceil(m k b / 8) + 2 m     one replica's payload (k = C:
                                                          no indices)
    counted = floor(D P(n) / 2)                           logged, as an all-reduce message
    raw     = 4 n H                                       fp32 all-reduce of every inner step

Algorithm, defaults and results: docs/data_parallel.md.
"""
import math

from megatron.cc.codecs.chunk_topk import ChunkTopKCodec
from megatron.cc.data_parallel.diloco_sync import DiLoCoSync
from megatron.cc.data_parallel.gather_exchange import GatherExchange
from megatron.cc.grad_sync.param_sync import param_segments
from megatron.cc.common.stats import ChannelStats


def sync_bytes(numel: int, world: int, codec: ChunkTopKCodec) -> int:
    """The module docstring's `counted` for one sync of a `numel`-value fragment."""
    m, k, C = -(-numel // codec.C), codec.k, codec.C
    if k == C:
        payload = math.ceil(m * C * codec.bits / 8) + 2 * m
    else:
        payload = math.ceil(m * k * codec.ibits / 8) + math.ceil(m * k * codec.bits / 8) + 2 * m
    return world * payload // 2


class SparseLoCoSync(DiLoCoSync):
    """dp mode `sparseloco`.

    Args:
        group, stats, inner_steps, fragments, sync_delay, reduce_group: as DiLoCoSync.
        codec: the ChunkTopKCodec (--sparseloco-density / -chunk-size / -bits).
        outer_lr: alpha (--sparseloco-outer-lr).
        outer_momentum: Nesterov momentum over the decoded mean (--sparseloco-outer-momentum;
            0, the paper's, by default).
        error_decay: beta (--sparseloco-error-decay), in [0, 1].
        capture_dir, sync_steps: as DiLoCoSync's (--diloco-capture-dir, -sync-steps).
    """

    def __init__(self, group, stats: ChannelStats, codec: ChunkTopKCodec, inner_steps: int = 15,
                 outer_lr: float = 1.0, error_decay: float = 0.95, fragments: int = 1,
                 sync_delay: int = 0, reduce_group=None, outer_momentum: float = 0.0,
                 capture_dir=None, sync_steps=()):
        if not 0.0 <= error_decay <= 1.0:
            raise ValueError(f"error_decay must be in [0, 1], got {error_decay}")
        exchange = GatherExchange(reduce_group if reduce_group is not None else group, codec)
        super().__init__(group, stats, inner_steps, outer_lr, outer_momentum, exchange, fragments,
                         sync_delay, reduce_group, error_decay, capture_dir, sync_steps)
        self.codec = codec

    def __call__(self, model, iteration: int) -> None:
        if self.global_copy is None:
            emb = param_segments(model).get("embedding")
            # the tied embedding heads fragment 0 on the first and the last stage: its chunks
            # must not share values with either stage's other parameters, or its copies drift
            if emb and emb[0].numel() % self.codec.C:
                raise ValueError(f"--sparseloco-chunk-size {self.codec.C} must divide the tied "
                                 f"embedding's {emb[0].numel()} values (or untie it with "
                                 f"--untie-embeddings-and-output-weights)")
        super().__call__(model, iteration)
