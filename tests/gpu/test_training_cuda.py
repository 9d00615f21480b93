"""Training on a GPU: fp32 equals the CPU run (the learned subspace pipeline at pp 2 too), bf16
tracks fp32, fp16 scales its loss, 8 ranks share one GPU for the (2,2,2) layout and the
bit-exact resume, and a bf16 checkpoint keeps its optimizer state through
tools/checkpoint/reshard.py. Skipped without CUDA.

Backends (tests/gpu/launch.py): a rank per GPU runs NCCL, as users train (world size 1 on the
one-GPU device machine); ranks sharing a GPU run gloo, NCCL refusing that, with gloo's CUDA
restrictions (no send/recv, no coalesced all-reduce of CUDA tensors) enforced in every rank.
The CPU reference runs spawn with CUDA_VISIBLE_DEVICES= and gloo."""
import contextlib
import os

import pytest
import torch

from tests.conftest import tiny_gpt_argv
from tests.distributed import run_distributed
from tests.gpu.launch import backend_flags, run_ranks
from tests.training import runner

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
ONE = backend_flags(1)   # a rank with a GPU of its own: NCCL
EIGHT = backend_flags(8)   # eight ranks on the GPUs there are: NCCL only with 8 GPUs


@contextlib.contextmanager
def cpu_only():
    """Spawned ranks see no GPU: the CPU reference run, in the same test session."""
    old = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        yield
    finally:
        if old is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = old


def _train(rank, world, argv):
    return runner.train(argv, world)


def _train_1(argv):
    return run_ranks(_train, 1, (argv,), timeout=600)[0]


def test_fp32_gpu_losses_equal_cpu(tiny_corpus):
    gpu = _train_1(tiny_gpt_argv(tiny_corpus, **ONE))
    with cpu_only():   # gloo, the CPU's backend
        cpu = run_distributed(_train, 1, (tiny_gpt_argv(tiny_corpus),), timeout=600)[0]
    print(f"\nfp32 losses GPU {gpu}\n           CPU {cpu}")
    assert len(gpu) == 5 and all(abs(a - b) <= 1e-4 * abs(b) for a, b in zip(gpu, cpu))


def test_bf16_tracks_fp32_over_100_iterations(tiny_corpus):
    common = {"train-iters": 100, "lr-decay-style": "cosine", "log-interval": 10, **ONE}
    fp32 = _train_1(tiny_gpt_argv(tiny_corpus, **common))
    bf16 = _train_1(tiny_gpt_argv(tiny_corpus, **common, bf16=True))
    print(f"\nloss after 100 iterations: fp32 {fp32[-1]:.5f} bf16 {bf16[-1]:.5f}")
    assert abs(bf16[-1] - fp32[-1]) <= 0.02 * fp32[-1]
    assert fp32[-1] < fp32[0]


def test_fp16_with_dynamic_loss_scale_trains(tiny_corpus):
    losses = _train_1(tiny_gpt_argv(tiny_corpus, fp16=True, **{"train-iters": 20,
                                                                "initial-loss-scale": 2 ** 20,
                                                                "loss-scale-window": 5}, **ONE))
    finite = [l for l in losses if l == l]
    assert len(losses) == 20 and finite[-1] < finite[0]


# the subspace pipeline at pp 2, its learned encoder and decoder training on both stages;
# unquantised coefficients, so nothing rounds differently on the two devices
SUBSPACE = {"pipeline-model-parallel-size": 2, "forward-compress-method": "subspace",
            "subspace-rank": 4, "subspace-bits": 0, "subspace-constrain": "learned"}


def test_learned_subspace_pp2_gpu_losses_equal_cpu(tiny_corpus):
    gpu = run_ranks(_train, 2, (tiny_gpt_argv(tiny_corpus, **SUBSPACE, **backend_flags(2)),),
                    timeout=600)[-1]
    with cpu_only():
        cpu = run_distributed(_train, 2, (tiny_gpt_argv(tiny_corpus, **SUBSPACE),),
                              timeout=600)[-1]
    print(f"\nlearned subspace pp 2 losses GPU {gpu}\n                            CPU {cpu}")
    assert len(gpu) == 5 and all(abs(a - b) <= 1e-4 * abs(b) for a, b in zip(gpu, cpu))


def _layout(rank, world, corpus):
    return runner.train(tiny_gpt_argv(corpus, **{"tensor-model-parallel-size": 2,
                                                 "pipeline-model-parallel-size": 2}, **EIGHT),
                        world)


def test_222_on_one_gpu_over_gloo_matches_111(tiny_corpus):
    ref = _train_1(tiny_gpt_argv(tiny_corpus, **ONE))
    out = run_ranks(_layout, 8, (tiny_corpus,), timeout=600)[-1]
    assert all(abs(a - b) <= 1e-4 * abs(b) for a, b in zip(out, ref)), (out, ref)


def _resume(rank, world, corpus, ckpt):
    common = {"tensor-model-parallel-size": 2, "pipeline-model-parallel-size": 2,
              "train-iters": 10, "hidden-dropout": 0.1, "attention-dropout": 0.1, **EIGHT}
    straight = runner.train(tiny_gpt_argv(corpus, **common), world)
    first = runner.train(tiny_gpt_argv(corpus, **common, save=ckpt, **{"exit-interval": 5}),
                         world)
    resumed = runner.train(tiny_gpt_argv(corpus, **common, load=ckpt), world)
    return straight, first, resumed


def test_resume_bit_exact_8_ranks_on_one_gpu(tiny_corpus, tmp_path):
    straight, first, resumed = run_ranks(
        _resume, 8, (tiny_corpus, str(tmp_path / "ck")), timeout=600)[-1]
    assert first == straight[:5] and resumed == straight[5:], (straight, resumed)


def _bf16_resume(rank, world, corpus, ckpt, extra=None):
    """6 bf16 iterations straight, then 3 + save + load + 3: (straight, resumed)."""
    common = {"train-iters": 6, "bf16": True, **(extra or {}), **ONE}
    straight = runner.train(tiny_gpt_argv(corpus, **common), world)
    runner.train(tiny_gpt_argv(corpus, **common, save=ckpt, **{"exit-interval": 3}), world)
    resumed = runner.train(tiny_gpt_argv(corpus, **common, load=ckpt), world)
    return straight, resumed


def main_weights_by_name(ckpt: str) -> dict:
    """The iteration-3 checkpoint's optimizer entry of the word embedding: Adam's moments and
    the fp32 main weight, by name."""
    sd = torch.load(os.path.join(ckpt, "iter_0000003", "mp_rank_00", "model_optim_rng.pt"),
                    map_location="cpu", weights_only=False)
    entry = sd["optimizer_by_name"]["embedding.word_embeddings.weight"]
    assert {"exp_avg", "exp_avg_sq", "main_param"} <= set(entry)
    assert entry["main_param"].dtype == torch.float32
    return entry


def test_bf16_resume_is_exact_and_reshard_keeps_optimizer_state(tiny_corpus, tmp_path):
    ckpt = str(tmp_path / "bf16")
    straight, resumed = run_ranks(_bf16_resume, 1, (tiny_corpus, ckpt), timeout=600)[0]
    assert resumed == straight[3:], (resumed, straight)
    entry = main_weights_by_name(ckpt)
    from tools.checkpoint import reshard
    out = str(tmp_path / "bf16_tp2")
    assert reshard.main(["--load", ckpt, "--save", out, "--target-tensor-parallel-size", "2",
                         "--target-pipeline-model-parallel-size", "1", "--no-progress"]) == 0
    half = torch.load(os.path.join(out, "iter_0000003", "mp_rank_01", "model_optim_rng.pt"),
                      map_location="cpu", weights_only=False)
    moved = half["optimizer_by_name"]["embedding.word_embeddings.weight"]
    rows = moved["main_param"].shape[0]
    assert torch.equal(moved["main_param"], entry["main_param"][rows:2 * rows])
