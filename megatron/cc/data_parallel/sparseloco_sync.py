"""SparseLoCo (Sarfi, Thérien, Lidin, Belilovsky 2025) on the dp channel.

DiLoCo's loop (diloco.py: H inner steps, fragments, sync delay) with, for every fragment f
of every replica i at its sync:

    Delta_i = theta_g - theta_i                    outer pseudo-gradient (fp32)
    e_i    <- beta e_i + Delta_i                   error feedback with decay beta
    s_i     = Q_b(TopK_C,k(e_i))                   k of every chunk of C values, b-bit values
    e_i    <- e_i - s_i                            what was not sent stays in the buffer
    theta_g <- theta_g - alpha mean_i(s_i)         one all-gather of the payloads; plain
                                                   outer SGD: the decayed buffer stands in
                                                   for DiLoCo's outer momentum (the paper's
                                                   observation), so there is no momentum
    theta_i <- theta_g (+ the tau overlapped steps' progress, --diloco-sync-delay)

Defaults (the paper's): beta 0.95, alpha 1, C 4096, k = 64 (density 1/64), b = 2; the paper
runs H = 15 inner steps. Streaming SparseLoCo: --diloco-fragments F sends every fragment
through the same codec, with its own error buffer, one fragment every H/F steps.

Bytes of one sync of a fragment of n values over a dp group of D replicas, with
m = ceil(n / C) chunks, i = ceil(log2 C) index bits (12 for C = 4096):

    P(n)    = ceil(m k i / 8) + ceil(m k b / 8) + 2 m     payload of one replica
              (k = C: ceil(m C b / 8) + 2 m, no indices)
    counted = floor(D P(n) / 2)                          logged ("dp"), as an all-reduce
                                                         message (gather_exchange.py)
    raw     = 4 n H                                      the fp32 gradient all-reduce of
                                                         every inner step since the last sync

The demo model (bench_dp_modes.py: n = 1,334,016 per replica = 326 chunks, D = 4, H = 15):
P = 326 x (96 + 16 + 2) = 37,164 B, counted 74,328 B per sync and replica (the log line sums
the D replicas: 297,312 B), raw / counted = x1077 (x1076.9 logged).

State (checkpoint): diloco.py's (theta_g and the error buffer e_i per fragment; no momentum)
and the codec's stochastic-rounding generator.
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
