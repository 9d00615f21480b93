"""--torch-compile on the GPU: inductor's Triton kernels for every megatron-core layer train as
the eager layers do (fp32, no dropout: the same losses to float tolerance), with the fused
tp-1 loss and torch's fused AdamW in both runs. Skipped without CUDA."""
import pytest
import torch

from tests.conftest import tiny_gpt_argv
from tests.gpu.launch import backend_flags, run_ranks
from tests.training import runner

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _train(rank, world, argv):
    return runner.train_counting_graphs(argv, world)


def test_torch_compile_trains_like_eager(tiny_corpus):
    argv = tiny_gpt_argv(tiny_corpus, **backend_flags(1))
    eager, none = run_ranks(_train, 1, (argv,), timeout=600)[0]
    compiled, graphs = run_ranks(_train, 1, (argv + ["--torch-compile"],), timeout=600)[0]
    print(f"\nlosses eager    {eager}\n       compiled {compiled} ({graphs} graphs)")
    # the flag compiled the layers (on GPUs megatron-core compiles its own fused bias-GeLU
    # and bias-dropout-add in both runs)
    assert graphs > none
    assert len(compiled) == 5 and all(abs(a - b) <= 1e-4 * abs(b)
                                      for a, b in zip(compiled, eager))
