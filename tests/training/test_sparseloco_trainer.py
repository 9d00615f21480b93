"""--dp-mode sparseloco, and diloco with --diloco-compression powersgd-<r>, inside the trainer
(dp = 2): the dp bytes the log line counts are the formula of megatron/cc/grad_sync/
sparseloco.py (lowrank_exchange.py) per sync, the raw bytes 4 n H per sync, and training
learns. (Resume bit-exact: tests/training/test_dp_modes.py's "sparseloco" and
"diloco-powersgd" cases.)"""
import math

from tests.conftest import tiny_gpt_argv
from tests.distributed import run_distributed
from tests.training import runner

FLAGS = {"dp-mode": "sparseloco", "diloco-inner-steps": 2, "train-iters": 6,
         "sparseloco-chunk-size": 256, "sparseloco-density": 0.125, "sparseloco-bits": 3}
LOWRANK = {"dp-mode": "diloco", "diloco-inner-steps": 2, "train-iters": 6,
           "diloco-compression": "powersgd-4"}


def _worker(rank, world, corpus, flags=FLAGS):
    import torch.distributed as dist
    from megatron.cc.common.stats import ChannelStats

    def totals(trainer):
        snapshots = [None] * world
        dist.all_gather_object(snapshots, trainer.stats.snapshot())
        shapes = [tuple(p.shape) for p in trainer.model.parameters() if p.requires_grad]
        return ChannelStats.merge(snapshots).get("dp"), shapes
    return runner._run(tiny_gpt_argv(corpus, **flags), world, totals)


def test_logged_dp_bytes_are_the_formula(tiny_corpus):
    from megatron.cc.codecs.chunk_topk import ChunkTopKCodec
    from megatron.cc.data_parallel.sparseloco_sync import sync_bytes
    losses, (dp, shapes) = run_distributed(_worker, 2, (tiny_corpus,), timeout=600)[-1]
    n, syncs = sum(math.prod(s) for s in shapes), 6 // 2
    per_sync = sync_bytes(n, 2, ChunkTopKCodec(0.125, 256, 3))
    # m chunks of 256, k = 32: indices 32 x 8 bits, values 32 x 3 bits, one fp16 scale
    assert per_sync == 2 * (-(-n // 256)) * (32 + 12 + 2) // 2
    assert dp == {"sent": 2 * syncs * per_sync, "raw": 2 * syncs * 4 * n * 2,
                  "messages": 2 * syncs}
    assert losses[-1] < losses[0]


def test_logged_dp_bytes_are_the_lowrank_formula(tiny_corpus):
    from megatron.cc.data_parallel.lowrank_exchange import sync_bytes
    losses, (dp, shapes) = run_distributed(_worker, 2, (tiny_corpus, LOWRANK), timeout=600)[-1]
    n, syncs = sum(math.prod(s) for s in shapes), 6 // 2
    # by hand: 4 r (n + m) per matrix worth rank 4, 4 per other value (vectors, small matrices)
    per_sync = sum(16 * (s[0] + math.prod(s[1:])) if len(s) == 2 and 4 * (s[0] + s[1]) < s[0] * s[1]
                   else 4 * math.prod(s) for s in shapes)
    assert per_sync == sync_bytes(shapes, 4) < 4 * n / 4
    assert dp == {"sent": 2 * syncs * per_sync, "raw": 2 * syncs * 4 * n * 2,
                  "messages": 2 * syncs}
    assert losses[-1] < losses[0]
