"""Resuming across devices: a checkpoint written on a GPU loads on the CPU (and the reverse).

The tensor-parallel RNG tracker's states are CUDA Philox states (16 bytes) on GPUs and CPU
generator states (5056 bytes, cpu_shim) on the CPU, so neither restores on the other device.
What applies (Python, numpy, the CPU generator) is restored exactly; what does not (the CUDA
generator, the tracker) keeps its --seed initialisation, with one warning line. The GPU
checkpoint is built as a GPU run writes it: rng_state() with CUDA-sized generator states, with
the device tag and without it (checkpoints written before the tag).
"""
import contextlib
import io
import os
import random

import numpy as np
import pytest
import torch

from tests.conftest import tiny_gpt_argv
from tests.distributed import run_distributed
from tests.training import runner

PHILOX_BYTES = 16   # torch.cuda.get_rng_state(): seed and offset of the Philox generator


def _as_gpu_wrote_it(s: dict, tagged: bool) -> dict:
    g = torch.Generator().manual_seed(7)
    philox = lambda: torch.randint(0, 256, (PHILOX_BYTES,), generator=g, dtype=torch.uint8)
    s = dict(s, cuda=philox(), tracker={name: philox() for name in s["tracker"]})
    if tagged:
        s["tracker_device"] = "cuda"
    else:
        s.pop("tracker_device", None)
    return s


def _draws():
    return (random.random(), float(np.random.rand()), torch.rand(3).tolist())


def _tracker_dropout():
    from megatron.core import tensor_parallel
    with tensor_parallel.get_cuda_rng_tracker().fork():
        return torch.nn.functional.dropout(torch.ones(64), 0.5).tolist()


def _unit(rank, world):
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel
    from megatron.training.checkpointing import save_load as checkpointing
    from megatron.training.runtime import cpu_shim
    cpu_shim.apply()
    ps.initialize_model_parallel(1, 1)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    saved = checkpointing.rng_state()
    expected, expected_tracker = _draws(), _tracker_dropout()
    out = {"cpu_tag": saved["tracker_device"]}
    # the same device: everything restores, the tracker included
    out["same"] = (checkpointing.set_rng_state(saved), _draws() == expected,
                   _tracker_dropout() == expected_tracker)
    for tagged in (True, False):
        _draws(), _tracker_dropout()   # move every generator on
        skipped = checkpointing.set_rng_state(_as_gpu_wrote_it(saved, tagged))
        restored = _draws() == expected
        _tracker_dropout()   # the tracker still works: its states are CPU ones
        out[f"gpu_tagged={tagged}"] = (skipped, restored)
    ps.destroy_model_parallel()
    return out


def _both(rank, world, corpus, ckpt):
    return _unit(rank, world), _resume(rank, world, corpus, ckpt)


@pytest.fixture(scope="module")
def spawned(tiny_corpus, tmp_path_factory):
    """One spawned rank for every test here (a spawn costs more than the tests)."""
    ckpt = str(tmp_path_factory.mktemp("rng_cross_device") / "ck")
    return run_distributed(_both, 1, (tiny_corpus, ckpt), timeout=300)[0]


@pytest.fixture
def unit(spawned):
    return spawned[0]


def test_same_device_restores_every_generator(unit):
    assert unit["cpu_tag"] == "cpu"
    assert unit["same"] == ([], True, True)


@pytest.mark.parametrize("tagged", [True, False])
def test_gpu_checkpoint_rng_loads_on_cpu(unit, tagged):
    skipped, restored = unit[f"gpu_tagged={tagged}"]
    assert restored   # Python, numpy and the CPU generator come back exactly
    assert len(skipped) == 2
    assert "CUDA generator" in skipped[0] and "no CUDA here" in skipped[0]
    assert "tracker (cuda generator states, running on cpu)" in skipped[1]


def _resume(rank, world, corpus, ckpt):
    """Train 2 iterations and save on the CPU; make the rank file a GPU run's; resume."""
    from megatron.training.checkpointing.checkpoint_io import safe_load, write_file
    from megatron.training.checkpointing.save_load import rank_file
    common = {"train-iters": 4, "hidden-dropout": 0.1, "attention-dropout": 0.1}
    runner.train(tiny_gpt_argv(corpus, **common, save=ckpt, **{"exit-interval": 2}), world)
    path = rank_file(ckpt, 2, 0)
    state = safe_load(path)
    state["rng"] = _as_gpu_wrote_it(state["rng"], tagged=False)
    write_file(state, path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        resumed = runner.train(tiny_gpt_argv(corpus, **common, load=ckpt), world)
    return resumed, [l for l in out.getvalue().splitlines() if "RNG state" in l]


def test_gpu_checkpoint_resumes_training_on_cpu_with_one_warning(spawned):
    resumed, warnings = spawned[1]
    assert len(resumed) == 2 and all(np.isfinite(resumed))
    assert len(warnings) == 1, warnings
    assert "CUDA generator" in warnings[0] and "tensor-parallel RNG tracker" in warnings[0]
