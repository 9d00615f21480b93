"""The tensor-parallel channel: `tp bytes` counts what megatron-core's tp all-reduces move, the
uncompressed channel computes exactly what megatron-core's own reduces do, and
--mp-acti-comp / --mp-grad-comp shrink the bytes by the PowerSGD factor at a small loss cost.

tp = 2, pp = 1, dp = 1 (2 ranks), fp32, dropout 0."""
import pytest
import torch.distributed as dist

from tests.conftest import tiny_gpt_argv
from tests.distributed import run_distributed
from tests.training import runner

TP2 = {"tensor-model-parallel-size": 2, "train-iters": 4}
COMP = {"mp-acti-comp": True, "mp-acti-comp-rank": 4, "mp-grad-comp": True,
        "mp-grad-comp-rank": 4}


def _counted_worker(rank, world, corpus, extra):
    """(losses, logged tp totals, bytes of every all-reduce on the tp group, per rank)."""
    from megatron.core import parallel_state as ps
    real = dist.all_reduce
    moved = [0]

    def counting(tensor, *args, group=None, **kwargs):
        if ps.model_parallel_is_initialized() and group is ps.get_tensor_model_parallel_group():
            moved[0] += tensor.numel() * tensor.element_size()
        return real(tensor, *args, group=group, **kwargs)

    dist.all_reduce = counting
    try:
        losses, tp = runner.train_with_stats(tiny_gpt_argv(corpus, **TP2, **extra), world, "tp")
    finally:
        dist.all_reduce = real
    return losses, tp, moved[0]


def _run(corpus, extra):
    out = run_distributed(_counted_worker, 2, (corpus, extra), timeout=300)
    return out[1][0], out[0][1], sum(r[2] for r in out)


@pytest.fixture(scope="module")
def uncompressed(tiny_corpus):
    return _run(tiny_corpus, {})


def test_logged_tp_bytes_equal_the_all_reduces(uncompressed):
    losses, tp, moved = uncompressed
    assert tp["sent"] == tp["raw"] == moved > 0
    # per micro-batch and rank: 4 layers x 4 sums of (S, B, H) fp32, the embedding lookup, the
    # output layer's input gradient, cross entropy's 3 (B, S) fp32: 8 micro-batches x 4 steps
    S, B, H, layers = 32, 1, 32, 4
    per_mb = (layers * 4 + 2) * S * B * H * 4 + 3 * S * B * 4
    assert moved == 2 * 4 * 8 * per_mb


def _single_worker(rank, world, corpus):
    return runner.train(tiny_gpt_argv(corpus, **{"train-iters": 4}), world)


def test_uncompressed_channel_matches_single_process(tiny_corpus, uncompressed):
    ref = run_distributed(_single_worker, 1, (tiny_corpus,), timeout=300)[0]
    assert len(ref) == len(uncompressed[0]) == 4
    for a, b in zip(uncompressed[0], ref):
        assert abs(a - b) <= 1e-5 * abs(b)


@pytest.fixture(scope="module")
def compressed(tiny_corpus):
    return _run(tiny_corpus, COMP)


def test_mp_comp_shrinks_tp_bytes_and_keeps_the_loss(compressed, uncompressed):
    losses, tp, moved = compressed
    assert tp["sent"] == moved     # P and Q are what crosses the group, and all of it
    # (S*B + H) r fp32 instead of S*B*H for the 4 x 4 layer sums and the output layer's input
    # gradient; the embedding lookup and cross entropy stay exact
    S, B, H, layers, r = 32, 1, 32, 4, 4
    exact = S * B * H * 4 + 3 * S * B * 4
    per_mb = (layers * 4 + 1) * (S * B + H) * r * 4 + exact
    assert tp["sent"] == 2 * 4 * 8 * per_mb
    assert tp["raw"] == uncompressed[1]["raw"]
    assert tp["raw"] / tp["sent"] > 1.8
    assert abs(losses[-1] - uncompressed[0][-1]) <= 0.02 * uncompressed[0][-1]


@pytest.mark.parametrize("extra", [{}, COMP])
def test_planner_predicts_the_logged_tp_bytes(tiny_corpus, uncompressed, compressed, extra):
    """tools/plan_compression.py's byte formulas (channel_bytes) against the logged totals."""
    from megatron.cc.plan.channel_bytes import channel_bytes
    from megatron.cc.plan.shapes import ModelShape
    from megatron.training.arguments import parse_args
    from megatron.training.auto_compression import layout_of
    args = parse_args(tiny_gpt_argv(tiny_corpus, **TP2, **extra), world_size=2)
    logged = (compressed if extra else uncompressed)[1]
    one = channel_bytes(ModelShape.from_args(args.model, 1024), layout_of(args),
                        args.compression)["tp"]
    assert {k: 4 * v for k, v in one.items()} == logged


@pytest.mark.parametrize("flags,message", [
    ({"mp-acti-comp": True}, "--tensor-model-parallel-size 1"),
    ({"tensor-model-parallel-size": 2, "mp-grad-comp-rank": 4}, "add --mp-grad-comp"),
    ({"tensor-model-parallel-size": 2, "mp_acti_comp": True, "mp-acti-comp-warm-up": 1.5},
     "[0, 1)"),
])
def test_bad_tp_compression_flags_are_refused(tiny_corpus, flags, message):
    from megatron.training.arguments import parse_args
    from megatron.training.config_flags import ConfigError
    with pytest.raises(ConfigError) as err:
        parse_args(tiny_gpt_argv(tiny_corpus, **flags), world_size=2)
    assert message in str(err.value)


def _resume_worker(rank, world, corpus, ckpt):
    common = {**TP2, **COMP, "train-iters": 6, "mp-grad-comp-warm-up": 0.2}
    straight = runner.train(tiny_gpt_argv(corpus, **common), world)
    runner.train(tiny_gpt_argv(corpus, **common, save=ckpt, **{"exit-interval": 3}), world)
    resumed = runner.train(tiny_gpt_argv(corpus, **common, load=ckpt), world)
    return straight, resumed


def test_resume_with_tp_compression_is_bit_exact(tiny_corpus, tmp_path):
    """Q and the error of every site are checkpointed (rank files); the warm-up ends at 1."""
    straight, resumed = run_distributed(_resume_worker, 2, (tiny_corpus, str(tmp_path)),
                                        timeout=600)[-1]
    assert len(straight) == 6 and resumed == straight[3:], (resumed, straight)
