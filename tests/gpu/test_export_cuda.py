"""A GPU-trained checkpoint, converted on the CPU: exported to Hugging Face, it loads there and
gives the logits our model gives from the same checkpoint on the CPU. Skipped without CUDA."""
import numpy as np
import pytest
import torch

from tests.conftest import tiny_gpt_argv
from tests.distributed import run_distributed
from tests.gpu.launch import backend_flags, run_ranks
from tests.gpu.test_training_cuda import cpu_only
from tests.training import runner

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _train_and_save(rank, world, corpus, ckpt):
    runner.train(tiny_gpt_argv(corpus, save=ckpt, **{"train-iters": 3}, **backend_flags(1)),
                 world)
    return torch.cuda.is_available()


def _cpu_logits(rank, world, ckpt, tokens):
    from tests.tools.checkpoint.test_export_eval import _our_logits
    assert not torch.cuda.is_available()
    return _our_logits(ckpt, tokens)[0]


def test_gpu_checkpoint_exports_to_hf_with_equal_logits_on_cpu(tiny_corpus, tmp_path):
    from tests.tools.checkpoint.test_export_eval import LOGIT_TOL, _hf_logits, _tokens
    from tools.checkpoint import export_hf
    ckpt, out = str(tmp_path / "ck"), str(tmp_path / "hf")
    assert run_ranks(_train_and_save, 1, (tiny_corpus, ckpt), timeout=600)[0]
    with cpu_only():
        ours = run_distributed(_cpu_logits, 1, (ckpt, _tokens()), timeout=600)[0]
    assert export_hf.main(["--load", ckpt, "--output", out, "--no-progress"]) == 0
    hf = _hf_logits(out, _tokens())
    diff = np.abs(ours[..., :hf.shape[-1]] - hf).max()
    print(f"\nGPU-trained checkpoint: max |logit diff| ours (CPU) vs exported HF = {diff:.3e}")
    assert diff < LOGIT_TOL
