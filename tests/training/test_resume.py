"""Resume is exact: 10 straight iterations == 5 + save + load + 5, bit for bit, at (2,2,2).

Dropout is on, so the RNG states must round-trip too; the loaded run is a fresh Trainer
(fresh optimizer, scheduler, channels), so whatever is not in the checkpoint shows up here.
"""
import os

from tests.conftest import tiny_gpt_argv
from tests.distributed import run_distributed
from tests.training import runner


def _worker(rank, world, corpus, ckpt):
    common = {"tensor-model-parallel-size": 2, "pipeline-model-parallel-size": 2,
              "train-iters": 10, "hidden-dropout": 0.1, "attention-dropout": 0.1,
              "lr-decay-style": "cosine", "lr-warmup-iters": 2}
    straight = runner.train(tiny_gpt_argv(corpus, **common), world)
    first = runner.train(tiny_gpt_argv(corpus, **common, save=ckpt, **{"exit-interval": 5}), world)
    if rank == 0:  # a save killed half-way leaves only a .tmp directory: must be ignored
        os.makedirs(os.path.join(ckpt, "iter_0000007.tmp", "rank_state"))
    import torch.distributed as dist
    dist.barrier()
    resumed = runner.train(tiny_gpt_argv(corpus, **common, load=ckpt), world)
    return straight, first, resumed


def test_resume_is_bit_exact(tiny_corpus, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    straight, first, resumed = run_distributed(_worker, 8, (tiny_corpus, ckpt), timeout=600)[-1]
    assert len(straight) == 10 and len(first) == 5 and len(resumed) == 5
    assert first == straight[:5]
    assert resumed == straight[5:], (resumed, straight[5:])
    assert open(os.path.join(ckpt, "latest_checkpointed_iteration.txt")).read().strip() == "5"
    assert sorted(os.listdir(os.path.join(ckpt, "iter_0000005"))) == [
        "mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001", "rank_state"]
