"""--dp-mode sparseloco inside the trainer (dp = 2): the dp bytes the log line counts are the
formula of megatron/cc/grad_sync/sparseloco.py per sync, the raw bytes 4 n H per sync, and
training learns. (Resume bit-exact: tests/training/test_dp_modes.py's "sparseloco" case.)"""
from tests.conftest import tiny_gpt_argv
from tests.distributed import run_distributed
from tests.training import runner

FLAGS = {"dp-mode": "sparseloco", "diloco-inner-steps": 2, "train-iters": 6,
         "sparseloco-chunk-size": 256, "sparseloco-density": 0.125, "sparseloco-bits": 3}


def _worker(rank, world, corpus):
    import torch.distributed as dist
    from megatron.cc.stats import ChannelStats

    def totals(trainer):
        snapshots = [None] * world
        dist.all_gather_object(snapshots, trainer.stats.snapshot())
        n = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        return ChannelStats.merge(snapshots).get("dp"), n
    return runner._run(tiny_gpt_argv(corpus, **FLAGS), world, totals)


def test_logged_dp_bytes_are_the_formula(tiny_corpus):
    from megatron.cc.compress.chunk_topk import ChunkTopKCodec
    from megatron.cc.grad_sync.sparseloco import sync_bytes
    losses, (dp, n) = run_distributed(_worker, 2, (tiny_corpus,), timeout=600)[-1]
    syncs = 6 // 2
    per_sync = sync_bytes(n, 2, ChunkTopKCodec(0.125, 256, 3))
    # m chunks of 256, k = 32: indices 32 x 8 bits, values 32 x 3 bits, one fp16 scale
    assert per_sync == 2 * (-(-n // 256)) * (32 + 12 + 2) // 2
    assert dp == {"sent": 2 * syncs * per_sync, "raw": 2 * syncs * 4 * n * 2,
                  "messages": 2 * syncs}
    assert losses[-1] < losses[0]
