"""Megatron's scaling features on a GPU: the distributed optimizer's bf16 checkpoint (fp32 main
weights and Adam moments by name, resume bit-exact on NCCL) and the sequence-parallel and
interleaved layouts with compressed pipelines on one GPU (4 ranks over gloo) against (1,1,1).
Skipped without CUDA; the CPU tiers test the same paths on gloo (tests/training)."""
import pytest
import torch

from tests.conftest import tiny_gpt_argv
from tests.gpu.launch import backend_flags, run_ranks
from tests.gpu.test_training_cuda import _bf16_resume, main_weights_by_name
from tests.training import runner

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
ONE = backend_flags(1)


def test_bf16_distributed_optimizer_resume_is_exact(tiny_corpus, tmp_path):
    ckpt = str(tmp_path / "distopt")
    straight, resumed = run_ranks(_bf16_resume, 1, (tiny_corpus, ckpt,
                                                    {"use-distributed-optimizer": True}),
                                  timeout=600)[0]
    print(f"\nbf16 distributed optimizer: straight {straight[3:]} resumed {resumed}")
    assert resumed == straight[3:], (resumed, straight)
    main_weights_by_name(ckpt)


def _layouts(rank, world, corpus, flag_sets):
    """Train each flag set in turn in one spawn of `world` ranks."""
    return [runner.train(tiny_gpt_argv(corpus, **flags, **backend_flags(world)), world)
            for flags in flag_sets]


PP2 = {"tensor-model-parallel-size": 2, "pipeline-model-parallel-size": 2}
VP = {**PP2, "virtual-pipeline-model-parallel-size": 2}
SP = {**PP2, "sequence-parallel": True}
COMPRESSED = {"forward-compress-method": "fixpoint", "forward-bits": 8,
              "backward-compress-method": "fixpoint", "backward-bits": 8}


@pytest.fixture(scope="module")
def reference(tiny_corpus):
    return run_ranks(_layouts, 1, (tiny_corpus, [{}]), timeout=600)[0][0]


def _close(a, b, rtol):
    return len(a) == len(b) and all(abs(x - y) <= rtol * abs(y) for x, y in zip(a, b))


def test_interleaved_on_one_gpu_matches_111(tiny_corpus, reference):
    """(2,2,1) x 2 chunks, 4 ranks on gloo (the pipeline staged through pinned host memory)."""
    vp, vp_compressed = run_ranks(_layouts, 4, (tiny_corpus, [VP, {**VP, **COMPRESSED}]),
                                  timeout=600)[-1]
    print(f"\n(1,1,1) {reference}\n(2,2,1)x2 {vp}\n(2,2,1)x2 fixpoint-8 {vp_compressed}")
    assert _close(vp, reference, 1e-4), (vp, reference)
    assert _close(vp_compressed, reference, 1e-2)


def test_sequence_parallel_on_one_gpu_matches_111(tiny_corpus, reference):
    """(2,2,1) with --sequence-parallel: megatron-core's reduce-scatter and all-gather of CUDA
    tensors on a gloo group (4 ranks share the GPU; users run it on NCCL)."""
    sp, = run_ranks(_layouts, 4, (tiny_corpus, [{**SP, **COMPRESSED}]), timeout=600)[-1]
    print(f"\n(1,1,1) {reference}\n(2,2,1) SP fixpoint-8 {sp}")
    assert _close(sp, reference, 1e-2), (sp, reference)
