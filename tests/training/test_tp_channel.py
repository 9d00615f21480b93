"""The tensor-parallel channel: `tp bytes` counts what megatron-core's tp all-reduces move,
the uncompressed channel computes what megatron-core's own reduces do (tests/training/
test_equivalence.py's (2,1,1) layout against (1,1,1)), and --mp-acti-comp / --mp-grad-comp
shrink the bytes by the PowerSGD factor at a small loss cost and resume bit-exact.

tp = 2, pp = 1, dp = 1 (2 ranks), fp32, dropout 0; every run in one spawn of the two ranks."""
import pytest
import torch.distributed as dist

from tests.conftest import tiny_gpt_argv
from tests.distributed import run_distributed
from tests.training import runner

ITERS = 4
TP2 = {"tensor-model-parallel-size": 2, "train-iters": ITERS}
COMP = {"mp-acti-comp": True, "mp-acti-comp-rank": 4, "mp-grad-comp": True,
        "mp-grad-comp-rank": 4, "mp-grad-comp-warm-up": 0.25}   # backward exact at iteration 0


def _counted(argv, world):
    """(losses, logged tp totals, bytes of every all-reduce on the tp group by this rank)."""
    from megatron.core import parallel_state as ps
    real = dist.all_reduce
    moved = [0]

    def counting(tensor, *args, group=None, **kwargs):
        if ps.model_parallel_is_initialized() and group is ps.get_tensor_model_parallel_group():
            moved[0] += tensor.numel() * tensor.element_size()
        return real(tensor, *args, group=group, **kwargs)

    dist.all_reduce = counting
    try:
        losses, tp = runner.train_with_stats(argv, world, "tp")
    finally:
        dist.all_reduce = real
    return losses, tp, moved[0]


def _worker(rank, world, corpus, ckpt):
    out = {"uncompressed": _counted(tiny_gpt_argv(corpus, **TP2), world),
           "compressed": _counted(tiny_gpt_argv(corpus, **TP2, **COMP), world)}
    half = {"exit-interval": ITERS // 2}
    runner.train(tiny_gpt_argv(corpus, **TP2, **COMP, save=ckpt, **half), world)
    out["resumed"] = runner.train(tiny_gpt_argv(corpus, **TP2, **COMP, load=ckpt), world)
    return out


@pytest.fixture(scope="module")
def runs(tiny_corpus, tmp_path_factory):
    ckpt = str(tmp_path_factory.mktemp("tp_ckpt"))
    out = run_distributed(_worker, 2, (tiny_corpus, ckpt), timeout=600)
    merged = {}
    for name in ("uncompressed", "compressed"):
        merged[name] = (out[1][name][0], out[0][name][1], sum(r[name][2] for r in out))
    merged["resumed"] = out[1]["resumed"]
    return merged


def test_logged_tp_bytes_equal_the_all_reduces(runs):
    losses, tp, moved = runs["uncompressed"]
    assert tp["sent"] == tp["raw"] == moved > 0
    # per micro-batch and rank: 4 layers x 4 sums of (S, B, H) fp32, the embedding lookup, the
    # output layer's input gradient, cross entropy's 3 (B, S) fp32; 8 micro-batches per step
    S, B, H, layers = 32, 1, 32, 4
    per_mb = (layers * 4 + 2) * S * B * H * 4 + 3 * S * B * 4
    assert moved == 2 * ITERS * 8 * per_mb


def test_mp_comp_shrinks_tp_bytes_and_keeps_the_loss(runs):
    losses, tp, moved = runs["compressed"]
    assert tp["sent"] == moved     # P and Q are what crosses the group, and all of it
    assert tp["raw"] == runs["uncompressed"][1]["raw"]
    assert tp["raw"] / tp["sent"] > 1.8   # (S*B + H) r vs S*B*H per layer sum: 4x here
    base = runs["uncompressed"][0]
    assert abs(losses[-1] - base[-1]) <= 0.02 * base[-1]


@pytest.mark.parametrize("name", ["uncompressed", "compressed"])
def test_planner_predicts_the_logged_tp_bytes(tiny_corpus, runs, name):
    """plan_compression.py's byte formulas (channel_bytes), warm-up iteration included."""
    from megatron.cc.plan.channel_bytes import channel_bytes
    from megatron.cc.plan.shapes import ModelShape
    from megatron.training.flags.arguments import parse_args
    from megatron.training.compression.auto_compression import layout_of
    args = parse_args(tiny_gpt_argv(tiny_corpus, **TP2, **(COMP if name == "compressed" else {})),
                      world_size=2)
    shape, layout = ModelShape.from_args(args.model, 1024), layout_of(args)
    per_iter = [channel_bytes(shape, layout, args.compression, i)["tp"] for i in range(ITERS)]
    assert {k: sum(p[k] for p in per_iter) for k in per_iter[0]} == runs[name][1]


def test_resume_with_tp_compression_is_bit_exact(runs):
    """The Q of every site is checkpointed in the rank files; without the channel's
    registration with the checkpoint manager this fails."""
    straight = runs["compressed"][0]
    assert len(straight) == ITERS and runs["resumed"] == straight[ITERS // 2:]


@pytest.mark.parametrize("flags,message", [
    ({"mp-acti-comp": True}, "--tensor-model-parallel-size 1"),
    ({"tensor-model-parallel-size": 2, "mp-grad-comp-rank": 4}, "add --mp-grad-comp"),
    ({"tensor-model-parallel-size": 2, "mp_acti_comp": True, "mp-acti-comp-warm-up": 1.5},
     "[0, 1)"),
])
def test_bad_tp_compression_flags_are_refused(tiny_corpus, flags, message):
    from megatron.training.flags.arguments import parse_args
    from megatron.training.config.config_flags import ConfigError
    with pytest.raises(ConfigError) as err:
        parse_args(tiny_gpt_argv(tiny_corpus, **flags), world_size=2)
    assert message in str(err.value)
