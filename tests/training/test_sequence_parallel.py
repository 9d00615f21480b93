"""--sequence-parallel: megatron-core's sequence parallelism, composed with the channels.

One spawn of 4 ranks runs every multi-rank configuration (fp32, dropout 0), one spawn of 1
rank the (1,1,1) reference:
- layout equivalence within 1e-5 relative over 5 iterations: (tp, pp, dp) = (2,1,2) and
  (2,2,1) (the pipeline carrying (S/2, B, H) shards) with sequence parallelism, the latter with
  fused embedding sync; a Llama-style model (rope, RMSNorm, SwiGLU, untied) at (2,1,2), 3
  iterations;
- `tp bytes` equal a count of every collective on the tp group (all-gathers and
  reduce-scatters at half their full tensor, tp_reduce.gathered_bytes);
- compressed pipeline channels (delta + CB with LEP, TAH + fixpoint) log exactly the codecs'
  payloads of the shard, against the shard as raw;
- resume bit-exact with delta caches, LEP, --mp-acti-comp and fused embedding sync;
- SC (PowerSGD on the dp gradients) gives the same losses with and without sequence
  parallelism.
"""

import pytest
import torch
import torch.distributed as dist

from tests.conftest import tiny_gpt_argv
from tests.distributed import run_distributed
from tests.training import runner

REL_TOL = 1e-5
S, B, H, M = 32, 1, 32, 8          # tiny_gpt_argv: seq 32, micro-batch 1, hidden 32, global 8
TP2 = {"tensor-model-parallel-size": 2, "sequence-parallel": True}
PP2 = {**TP2, "pipeline-model-parallel-size": 2}
RICH = {**PP2, "forward-compress-method": "delta", "inter-grad-comp": True,
        "inter-grad-comp-rank": 4, "use-error-feedback": True, "mp-acti-comp": True,
        "mp-acti-comp-rank": 4, "emb-comm-opt": True, "train-iters": 4}
CODECS = {
    "rich": RICH,
    "tah": {**PP2, "forward-compress-method": "tah", "tile-size": 8,
            "backward-compress-method": "fixpoint", "backward-bits": 6, "train-iters": 2},
}
# rope: megatron-core reduce-scatters the lookup itself and the rotary table spans the whole
# sequence on every rank's shard
LLAMA = {"position-embedding-type": "rope", "normalization": "RMSNorm", "swiglu": True,
         "disable-bias-linear": True, "untie-embeddings-and-output-weights": True,
         "ffn-hidden-size": 64, "train-iters": 3}
SC = {"tensor-model-parallel-size": 2, "grad-comp": True, "grad-comp-rank": 2,
      "train-iters": 2}


def _all_stats(argv, world):
    """(last rank's losses, whole-job {channel: {sent, raw, messages}})."""
    from megatron.cc.common.stats import ChannelStats

    def totals(trainer):
        snapshots = [None] * dist.get_world_size()
        dist.all_gather_object(snapshots, trainer.stats.snapshot())
        return ChannelStats.merge(snapshots)

    return runner._run(argv, world, after_train=totals)


def _counting_collectives():
    """Patch every entry point of the tp group's collectives (ours call torch.distributed,
    megatron-core's its import-time aliases); return (moved bytes box, undo)."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import layers, mappings
    moved = [0]

    def on_tp(group):
        return ps.model_parallel_is_initialized() and \
            group is ps.get_tensor_model_parallel_group()

    def wrap(real, nbytes):
        def counting(*args, group=None, **kwargs):
            if on_tp(group):
                moved[0] += nbytes(*args)
            return real(*args, group=group, **kwargs)
        return counting

    size = lambda t: t.numel() * t.element_size()   # noqa: E731
    patches = [(dist, "all_reduce", lambda t, *a: size(t)),
               (dist, "all_gather_into_tensor", lambda out, inp, *a: size(out) // 2),
               (dist, "reduce_scatter_tensor", lambda out, inp, *a: size(inp) // 2),
               (dist, "all_gather_single", lambda out, inp, *a: size(out) // 2),
               (dist, "reduce_scatter_single", lambda out, inp, *a: size(inp) // 2)]
    for mod in (layers, mappings):
        patches += [(mod, "dist_all_gather_func", lambda out, inp, *a: size(out) // 2),
                    (mod, "dist_reduce_scatter_func", lambda out, inp, *a: size(inp) // 2)]
    saved = [(mod, name, getattr(mod, name)) for mod, name, _ in patches if hasattr(mod, name)]
    for (mod, name, real), (_, _, nbytes) in zip(saved, patches):
        setattr(mod, name, wrap(real, nbytes))

    def undo():
        for mod, name, real in saved:
            setattr(mod, name, real)
    return moved, undo


def _worker(rank, world, corpus, ckpt):
    out = {}
    for name, flags in (("sp_dp2", TP2), ("llama", {**TP2, **LLAMA})):
        moved, undo = _counting_collectives()
        try:
            out[name] = _all_stats(tiny_gpt_argv(corpus, **flags), world) + (moved[0],)
        finally:
            undo()
    out["sp_pp2_fe"] = _all_stats(tiny_gpt_argv(corpus, **PP2, **{"emb-comm-opt": True}),
                                  world)
    out["tah"] = _all_stats(tiny_gpt_argv(corpus, **CODECS["tah"]), world)
    # the straight run saves at iterations 2 and 4; pointing Megatron's tracker file back at 2
    # resumes from there (one run fewer than a separate 2-iteration run)
    out["rich"] = _all_stats(tiny_gpt_argv(corpus, **RICH, save=ckpt,
                                           **{"save-interval": 2}), world)
    runner.rewind(ckpt, 2)
    out["resumed"] = runner.train(tiny_gpt_argv(corpus, **RICH, load=ckpt), world)
    out["sc_sp"] = runner.train(tiny_gpt_argv(corpus, **SC, **{"sequence-parallel": True}),
                                world)
    out["sc_tp"] = runner.train(tiny_gpt_argv(corpus, **SC), world)
    return out


def _reference_worker(rank, world, corpus):
    return runner.train(tiny_gpt_argv(corpus), world), \
        runner.train(tiny_gpt_argv(corpus, **LLAMA), world)


@pytest.fixture(scope="module")
def runs(tiny_corpus, tmp_path_factory):
    ckpt = str(tmp_path_factory.mktemp("sp_ckpt"))
    out = run_distributed(_worker, 4, (tiny_corpus, ckpt), timeout=600)
    merged = dict(out[-1])
    for name in ("sp_dp2", "llama"):
        merged[name] = out[-1][name][:2] + (sum(r[name][2] for r in out),)
    merged["reference"], merged["llama_reference"] = run_distributed(
        _reference_worker, 1, (tiny_corpus,), timeout=300)[0]
    return merged


def _close(losses, ref, tol=REL_TOL):
    assert len(losses) == len(ref) and all(x == x for x in ref)
    for i, (a, b) in enumerate(zip(losses, ref)):
        assert abs(a - b) <= tol * abs(b), (i, a, b)


@pytest.mark.parametrize("name", ["sp_dp2", "sp_pp2_fe", "llama"])
def test_sequence_parallel_layouts_match_single_process(runs, name):
    _close(runs[name][0], runs["llama_reference" if name == "llama" else "reference"])


def test_rope_tp_bytes_equal_the_collectives(runs):
    """The rope lookup is a reduce-scatter (counted R/2) whose gradient is all-gathered."""
    losses, totals, moved = runs["llama"]
    assert totals["tp"]["sent"] == totals["tp"]["raw"] == moved > 0


def test_tp_bytes_equal_the_collectives(runs):
    """Per micro-batch and rank, R = S B H fp32 bytes, gathers and scatters at R/2: 4 layers x
    (2 row-parallel: reduce-scatter + gradient all-gather; 2 column-parallel: input all-gather,
    its re-gather and the gradient reduce-scatter), the output layer (a column-parallel one),
    the lookup's all-reduce and its gradient's all-gather, cross entropy's 3 (B, S) fp32; per
    step the norms' and row-parallel biases' gradients (4 layers x 6 H + the final norm's 2 H)."""
    losses, totals, moved = runs["sp_dp2"]
    tp = totals["tp"]
    assert tp["sent"] == tp["raw"] == moved > 0
    R = S * B * H * 4
    per_mb = 4 * (2 * R + 2 * 3 * R // 2) + 3 * R // 2 + R + R // 2 + 3 * S * B * 4
    per_step = (4 * 6 * H + 2 * H) * 4
    ranks, iters, mbs = 4, 5, M // 2   # dp 2: 4 micro-batches per replica
    assert moved == ranks * iters * (mbs * per_mb + per_step)


def test_pipeline_carries_the_shard(runs):
    """Uncompressed, each tp rank sends its (S/2, B, H) shard: half the whole message."""
    totals = runs["sp_pp2_fe"][1]
    shard = S // 2 * B * H * 4
    for channel in ("pp-fwd", "pp-bwd"):
        n = 5 * M * 2   # iterations x micro-batches x tp ranks
        assert totals[channel] == {"sent": n * shard, "raw": n * shard, "messages": n}


@pytest.mark.parametrize("name", list(CODECS))
def test_compressed_pp_bytes_are_the_shard_payloads(tiny_corpus, runs, name):
    from megatron.cc.pipeline.registry import pp_codec
    from megatron.training.flags.arguments import parse_args
    args = parse_args(tiny_gpt_argv(tiny_corpus, **CODECS[name]), world_size=4)
    shard = (S // 2, B, H)
    n = args.training.train_iters * M * 2
    totals = runs[name][1]
    raw = n * S // 2 * B * H * 4
    for channel in ("pp-fwd", "pp-bwd"):
        codec = pp_codec(args.compression, channel)
        one = codec.payload_nbytes(shard, torch.float32)
        assert totals[channel] == {"sent": n * one, "raw": raw, "messages": n}, channel
        assert one < shard[0] * B * H * 4
    losses = runs[name][0]
    _close(losses[:1], runs["reference"][:1], tol=1e-2)   # compressed: near, not equal


def test_mp_acti_comp_compresses_the_reduce_scatters(runs):
    """Each row-parallel reduce-scatter (R/2) becomes P (S B x r) and Q (H x r) fp32: 2 layers
    x 2 sites per rank, every micro-batch; nothing else changes."""
    tp = runs["rich"][1]["tp"]
    r = RICH["mp-acti-comp-rank"]
    saved = S * B * H * 4 // 2 - 4 * (S * B + H) * r
    assert saved > 0 and tp["raw"] - tp["sent"] == 4 * M * RICH["train-iters"] * 4 * saved


def test_resume_with_sequence_parallel_and_compression_is_bit_exact(runs):
    straight = runs["rich"][0]
    assert len(straight) == 4 and runs["resumed"] == straight[2:]


def test_selective_compression_is_unchanged_by_sequence_parallelism(runs):
    _close(runs["sc_sp"], runs["sc_tp"])


@pytest.mark.parametrize("flags,message", [
    ({**TP2, "seq-length": 31, "max-position-embeddings": 32}, "--seq-length 31"),
    ({**PP2, "no-scatter-gather-tensors-in-pipeline": True}, "drop one of the two flags"),
    ({**TP2, "mp-grad-comp": True}, "Drop --mp-grad-comp"),
    ({**TP2, "recompute-granularity": "full", "recompute-method": "uniform",
      "distribute-checkpointed-activations": True}, "--distribute-checkpointed-activations"),
])
def test_combinations_that_cannot_work_are_refused(tiny_corpus, flags, message):
    from megatron.training.flags.arguments import parse_args
    from megatron.training.config.config_flags import ConfigError
    with pytest.raises(ConfigError) as err:
        parse_args(tiny_gpt_argv(tiny_corpus, **flags), world_size=4)
    assert message in str(err.value) and "--sequence-parallel" in str(err.value)


def test_tp1_turns_it_off_with_a_note(tiny_corpus):
    """As Megatron-LM: no tensor-parallel group, no sequence parallelism; said at start-up."""
    from megatron.training.flags.arguments import parse_args
    from megatron.training.flags.seed_flags import seed_notes
    args = parse_args(tiny_gpt_argv(tiny_corpus, **{"sequence-parallel": True}), world_size=1)
    assert not args.sequence_parallel
    assert any("--sequence-parallel" in n and "off" in n for n in seed_notes(args))
    assert parse_args(tiny_gpt_argv(tiny_corpus, **TP2), world_size=2).sequence_parallel


@pytest.mark.parametrize("name", ["sp_dp2", "llama", "rich", "tah"])
def test_planner_predicts_the_logged_bytes(tiny_corpus, runs, name):
    """plan_compression.py's formulas (channel_bytes) with --sequence-parallel, channel by
    channel, warm-up iterations included."""
    from megatron.cc.plan.channel_bytes import channel_bytes
    from megatron.cc.plan.shapes import ModelShape
    from megatron.training.flags.arguments import parse_args
    from megatron.training.compression.auto_compression import layout_of
    flags = {"sp_dp2": TP2, "llama": {**TP2, **LLAMA}}.get(name) or CODECS[name]
    args = parse_args(tiny_gpt_argv(tiny_corpus, **flags), world_size=4)
    shape, layout = ModelShape.from_args(args.model, 1024), layout_of(args)
    per_iter = [channel_bytes(shape, layout, args.compression, i)
                for i in range(args.training.train_iters)]
    logged = runs[name][1]
    for channel in per_iter[0]:
        predicted = {k: sum(p[channel][k] for p in per_iter) for k in per_iter[0][channel]}
        assert predicted == logged[channel], channel
