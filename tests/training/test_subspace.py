"""Subspace Networks (megatron/training/model/subspace.py): the constrained model and its wire.

- the backward message is exact: one iteration's gradients at pp 2 with k coefficients on the
  wire (--subspace-bits 0) equal the same constrained model's at pp 1, every parameter, within
  GRAD_TOL relative (float rounding: x = x0 + U U^T (x - x0) is rebuilt, sums reassociate);
- layout equivalence: (2,2,2) against (1,1,1), 5 iterations, losses within 1e-5 relative;
- resume bit-exact with 4-bit coefficients at (1,2,1);
- the log line's pp-fwd / pp-bwd bytes equal the formula, k b-bit codes per token + k scales;
- the refusals name the flag and the fix;
- the write scale a (W_eff = a U U^T W): sqrt(k / H) by default, applied to every write, and
  a checkpoint saved before it existed loads with a = 1;
- --subspace-constrain boundary: the layers write at full width (their gradients are not
  confined to k dimensions), only the stage boundary projects, on the same wire;
- --subspace-constrain learned: each boundary's encoder and decoder start at U (the first
  iteration's loss and every other gradient are the fixed boundary's), get gradients, are
  named after their boundary, and resume bit-exact.
"""
import os

import pytest
import torch

from tests.conftest import tiny_gpt_argv
from tests.distributed import run_distributed
from tests.training import runner

K = 4
GRAD_TOL = 1e-5   # max |a - b| / max |b| per parameter; measured ~1e-7
REL_TOL = 1e-5
CONSTRAINED = {"subspace-rank": K}
# the paper's model on the wire (the method's default constrains only the boundary)
WIRE = {"forward-compress-method": "subspace", "subspace-rank": K, "subspace-bits": 0,
        "subspace-constrain": "writes"}


def _grads_after(trainer):
    """{global name: [main_grad of every copy, numpy]} over the whole job (tp 1; numpy: a
    tensor's shared memory would not outlive the rank that returns it)."""
    import torch.distributed as dist
    from megatron.training.model.model import global_param_names, unwrap
    mine = [(g, p.main_grad.detach().cpu().numpy().copy()) for _, g, p in
            global_param_names(unwrap(trainer.model))]
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    out = {}
    for part in every:
        for g, t in part:
            out.setdefault(g, []).append(t)
    return out


def _pp1_worker(rank, world, corpus, extra):
    """The constrained model's gradients at pp 1 (dp = world), and the ordinary model's loss."""
    common = {"train-iters": 1, "clip-grad": 0.0, "global-batch-size": 4, **extra}
    plain = runner.train(tiny_gpt_argv(corpus, **common), world)
    return runner._run(tiny_gpt_argv(corpus, **common, **CONSTRAINED), world,
                       after_train=_grads_after), plain


def _pp_worker(rank, world, corpus, extra, pp):
    argv = tiny_gpt_argv(corpus, **{"pipeline-model-parallel-size": pp, "train-iters": 1,
                                    "clip-grad": 0.0, "global-batch-size": 4, **WIRE, **extra})
    return runner._run(argv, world, after_train=_grads_after)


UNTIED = {"untie-embeddings-and-output-weights": True}


@pytest.mark.parametrize("pp,dp,extra", [
    (2, 1, {}),            # tied: Megatron's sum carries it
    (4, 1, {}),            # tied, middle stages' copies
    (2, 1, UNTIED),        # untied: the copies' own sum, of the looked-up rows only
    (2, 2, UNTIED),        # ... the rows of both replicas' tokens
])
def test_backward_message_is_exact(tiny_corpus, pp, dp, extra):
    (ref_loss, ref), plain = run_distributed(_pp1_worker, dp, (tiny_corpus, extra),
                                             timeout=300)[-1]
    assert ref_loss[0] != plain[0]
    # the constraint is on: an output projection's gradient U U^T G has rank <= k
    import numpy as np
    for name in ("decoder.layers.0.self_attention.linear_proj.weight",
                 "decoder.layers.3.mlp.linear_fc2.weight"):
        sv = np.linalg.svd(ref[name][0].astype(np.float64), compute_uv=False)
        assert sv[K] < 1e-5 * sv[0], (name, sv[:K + 1])
    loss, got = run_distributed(_pp_worker, pp * dp, (tiny_corpus, extra, pp),
                                timeout=300)[-1]
    assert abs(loss[0] - ref_loss[0]) <= REL_TOL * abs(ref_loss[0])
    assert set(got) == set(ref)
    worst = 0.0
    for name, copies in got.items():
        want = ref[name][0]
        for g in copies:   # the embedding: stage 0's, the x0 copies, the tied output weight
            err = abs(g - want).max() / max(abs(want).max(), 1e-30)
            worst = max(worst, err)
            assert err <= GRAD_TOL, (name, err)
    print(f"pp {pp} dp {dp} {extra}: worst relative gradient difference {worst:.2e}")


def _layout_worker(rank, world, corpus, layouts):
    out = {}
    for tp, pp, extra in layouts:
        argv = tiny_gpt_argv(corpus, **{"tensor-model-parallel-size": tp,
                                        "pipeline-model-parallel-size": pp, **extra})
        out[(tp, pp)] = runner.train(argv, world)
    return out


def test_layout_222_matches_111(tiny_corpus):
    ref = run_distributed(_layout_worker, 1, (tiny_corpus, [(1, 1, CONSTRAINED)]),
                          timeout=300)[0][(1, 1)]
    got = run_distributed(_layout_worker, 8, (tiny_corpus, [(2, 2, WIRE)]),
                          timeout=600)[-1][(2, 2)]
    assert len(ref) == len(got) == 5 and ref[-1] < ref[0]
    for i, (a, b) in enumerate(zip(got, ref)):
        assert abs(a - b) <= REL_TOL * abs(b), (i, a, b)


def _resume_worker(rank, world, corpus, ckpt, extra=None):
    common = {"pipeline-model-parallel-size": 2, "train-iters": 6,
              "forward-compress-method": "subspace", "subspace-rank": K, **(extra or {})}
    straight = runner.train(tiny_gpt_argv(corpus, **common), world)
    first = runner.train(tiny_gpt_argv(corpus, **common, save=ckpt, **{"exit-interval": 3}),
                         world)
    resumed = runner.train(tiny_gpt_argv(corpus, **common, load=ckpt), world)
    return straight, first, resumed


@pytest.mark.parametrize("extra", [{}, {"subspace-constrain": "learned"}])
def test_resume_is_bit_exact(tiny_corpus, tmp_path, extra):
    straight, first, resumed = run_distributed(
        _resume_worker, 2, (tiny_corpus, str(tmp_path / "ckpt"), extra), timeout=600)[-1]
    assert first == straight[:3]
    assert resumed == straight[3:], (resumed, straight[3:])


def _bytes_worker(rank, world, corpus, extra):
    from megatron.training.flags.arguments import parse_args
    from megatron.training.model import subspace
    argv = tiny_gpt_argv(corpus, **{"tensor-model-parallel-size": 2,
                                    "pipeline-model-parallel-size": 2, "train-iters": 2,
                                    "micro-batch-size": 2, **extra})
    per_message = subspace.expected_bytes_per_message(parse_args(argv, world_size=world))
    out = {ch: runner.train_with_stats(argv, world, ch)[1] for ch in ("pp-fwd", "pp-bwd")}
    return per_message, out


@pytest.mark.parametrize("bits", [0, 4])
def test_logged_bytes_match_formula(tiny_corpus, bits):
    extra = {"forward-compress-method": "subspace", "subspace-rank": K, "subspace-bits": bits}
    (sent, raw), got = run_distributed(_bytes_worker, 4, (tiny_corpus, extra), timeout=600)[-1]
    # 2 iterations x M = 8 / (2 x 1) micro-batches x 2 tp ranks, one message each direction
    messages = 2 * 4 * 2
    for ch in ("pp-fwd", "pp-bwd"):
        assert got[ch]["messages"] == messages, (ch, got[ch])
        assert got[ch]["sent"] == messages * sent, (ch, got[ch], sent)
        assert got[ch]["raw"] == messages * raw, (ch, got[ch], raw)
    # S/tp x B = 16 x 2 tokens per message, hidden 32
    tokens, h = 16 * 2, 32
    assert raw == tokens * h * 4
    assert sent == (tokens * K * 4 if bits == 0 else tokens * K * bits // 8 + 2 * K)


def _emb_worker(rank, world, corpus):
    from megatron.training.flags.arguments import parse_args
    argv = tiny_gpt_argv(corpus, **{"pipeline-model-parallel-size": 2, "train-iters": 1,
                                    "global-batch-size": 4, **WIRE, **UNTIED})
    a = parse_args(argv, world_size=world)
    return (a.model.hidden_size, a.model.max_position_embeddings, a.model.seq_length,
            runner.train_with_stats(argv, world, "emb")[1])


def test_untied_word_table_sums_only_looked_up_rows(tiny_corpus):
    h, positions, seq, emb = run_distributed(_emb_worker, 2, (tiny_corpus,), timeout=300)[-1]
    row, pos = h * 4, positions * h * 4          # fp32 bytes of a row, of the position table
    vocab_rows = (emb["raw"] // 2 - pos) // row  # raw: both stages, the whole tables
    assert emb["raw"] == 2 * (vocab_rows * row + pos)
    rows, rest = divmod(emb["sent"] // 2 - pos, row)
    assert rest == 0 and emb["sent"] % 2 == 0
    assert 0 < rows <= min(4 * seq, vocab_rows - 1), (rows, vocab_rows)


@pytest.mark.parametrize("flags,match", [
    ({"forward-compress-method": "subspace", "hidden-dropout": 0.1}, "--hidden-dropout 0"),
    ({"forward-compress-method": "subspace", "pipeline-model-parallel-size": 1},
     "--subspace-rank 24 alone"),
    ({"forward-compress-method": "subspace", "subspace-rank": 64}, "1..--hidden-size"),
    ({"forward-compress-method": "subspace", "subspace-bits": 9}, "0 .unquantised. or 1..8"),
    ({"forward-compress-method": "subspace", "inter-grad-comp": True},
     "brings its own backward partner"),
    ({"forward-compress-method": "subspace", "backward-compress-method": "fixpoint"},
     "brings its own backward partner"),
    ({"subspace-bits": 2}, "--forward-compress-method is none"),
    ({"forward-compress-method": "subspace", "compress-warmup-iters": 2},
     "no uncompressed warm-up"),
    ({"forward-compress-method": "subspace", "tensor-model-parallel-size": 2,
      "sequence-parallel": True}, "drop --sequence-parallel"),
    ({"forward-compress-method": "subspace", "num-layers-per-virtual-pipeline-stage": 1},
     "interleaved"),
    ({"subspace-write-scale": 0.5}, "give --subspace-rank K"),
    ({"subspace-constrain": "boundary"}, "give --forward-compress-method subspace"),
    ({"subspace-rank": 4, "subspace-constrain": "boundary"},
     "give --forward-compress-method subspace"),
    ({"forward-compress-method": "subspace", "subspace-constrain": "boundary",
      "subspace-write-scale": 0.5}, "no write is projected"),
    ({"subspace-rank": 4, "subspace-constrain": "learned"},
     "learned projects what crosses a stage boundary; give --forward-compress-method"),
    ({"forward-compress-method": "subspace", "subspace-constrain": "learned",
      "subspace-write-scale": 0.5}, "with --subspace-constrain learned no write is projected"),
    ({"forward-compress-method": "subspace", "subspace-write-scale": 0.0}, "must be > 0"),
])
def test_refusals_name_the_flag(tiny_corpus, flags, match):
    from megatron.training.flags.arguments import parse_args
    from megatron.training.config.config_flags import ConfigError
    flags = {"pipeline-model-parallel-size": 2, "hidden-dropout": 0.0, **flags}
    with pytest.raises(ConfigError, match=match):
        parse_args(tiny_gpt_argv(tiny_corpus, **flags), world_size=4)


def _overlap_worker(rank, world, corpus):
    common = {"pipeline-model-parallel-size": 2, "train-iters": 3,
              "forward-compress-method": "subspace", "subspace-rank": K}
    return [runner.train(tiny_gpt_argv(corpus, **common, **extra), world)
            for extra in ({}, {"overlap-p2p-comm": True})]


def test_overlap_p2p_gives_the_same_losses(tiny_corpus):
    plain, overlapped = run_distributed(_overlap_worker, 2, (tiny_corpus,), timeout=300)[-1]
    assert len(plain) == 3 and plain == overlapped


@pytest.mark.parametrize("hidden", [128, 256])
def test_defaults_at_the_demo_shape(tiny_corpus, hidden):
    """make demo's shape (seq 128, micro-batch 4, tp 2 x pp 2 x dp 2): the method alone is the
    quality protocol's frontier, k = 3H/4 at 4 bits with only the boundary projected (x10.6
    both ways at tp 1); --subspace-rank alone still constrains the writes."""
    from megatron.training.model import subspace
    from megatron.training.flags.arguments import parse_args
    shape = {"num-layers": 4, "hidden-size": hidden, "seq-length": 128, "micro-batch-size": 4,
             "global-batch-size": 32, "tensor-model-parallel-size": 2,
             "pipeline-model-parallel-size": 2}
    args = parse_args(tiny_gpt_argv(tiny_corpus, **shape, **{
        "forward-compress-method": "subspace"}), world_size=8)
    assert subspace.rank(args) == hidden * 3 // 4 and subspace.bits(args) == 4
    assert subspace.constrain_kind(args) == "boundary" and not subspace.constrains_writes(args)
    sent, raw = subspace.expected_bytes_per_message(args)
    # one formula for both directions; x10.6 at tp 1, the scales' share larger at tp 2
    assert 10.4 < raw / sent < 32 / 3, (sent, raw)
    alone = parse_args(tiny_gpt_argv(tiny_corpus, **shape, **{"subspace-rank": 8}),
                       world_size=8)
    assert subspace.constrains_writes(alone)


def test_checkpoint_of_another_constrain_mode_is_refused():
    """writes and boundary checkpoints hold the same tensors: the saved flags tell them apart
    (an older checkpoint holds "writes" explicitly; a newer default one None)."""
    from megatron.training.model.subspace import SubspaceGPTModel, check_saved_mode
    model = object.__new__(SubspaceGPTModel)
    model.constrain_mode = "boundary"
    old = {"compression": {"forward_compress_method": "subspace", "subspace_rank": None,
                           "subspace_constrain": "writes"}}
    with pytest.raises(ValueError, match="trained with --subspace-constrain writes, these "
                                         "flags build boundary.*give --subspace-constrain writes"):
        check_saved_mode(model, old)
    new = {"compression": {"forward_compress_method": "subspace", "subspace_constrain": None}}
    check_saved_mode(model, new)                        # the default: boundary
    check_saved_mode(model, {"compression": {}})        # not a subspace checkpoint
    model.constrain_mode = "writes"
    check_saved_mode(model, {"compression": {"subspace_rank": 4, "subspace_constrain": None}})
    with pytest.raises(ValueError, match="give --subspace-constrain boundary"):
        check_saved_mode(model, new)


def _whole_worker(rank, world, corpus):
    return runner.train(tiny_gpt_argv(corpus, **{"pipeline-model-parallel-size": 2,
                                                 **CONSTRAINED}), world)


def test_constrained_model_alone_at_pp2_matches_pp1(tiny_corpus):
    """--subspace-rank without the coefficient wire: whole activations, the same model."""
    ref = run_distributed(_layout_worker, 1, (tiny_corpus, [(1, 1, CONSTRAINED)]),
                          timeout=300)[0][(1, 1)]
    got = run_distributed(_whole_worker, 2, (tiny_corpus,), timeout=300)[-1]
    assert len(got) == 5
    for a, b in zip(got, ref):
        assert abs(a - b) <= REL_TOL * abs(b), (a, b)


def test_write_scale_default_and_every_write_scaled(tiny_corpus):
    """a = sqrt(k / H) unless given; the hook returns a U U^T out and a U U^T bias."""
    import math
    import types
    from megatron.training.model import subspace
    from megatron.training.flags.arguments import parse_args
    argv = tiny_gpt_argv(tiny_corpus, **{"pipeline-model-parallel-size": 2, **WIRE})
    args = parse_args(argv, world_size=2)
    assert subspace.write_scale(args) == pytest.approx(math.sqrt(K / args.model.hidden_size))
    given = parse_args(tiny_gpt_argv(tiny_corpus, **{"pipeline-model-parallel-size": 2,
                                                     "subspace-write-scale": 0.7, **WIRE}),
                       world_size=2)
    assert subspace.write_scale(given) == 0.7
    h = args.model.hidden_size
    u = subspace.basis(1234, h, K)
    stub = types.SimpleNamespace(subspace_basis=u, subspace_write_scale=torch.tensor(0.3))
    out, bias = torch.randn(5, 2, h), torch.randn(h)
    got_out, got_bias = subspace.SubspaceGPTModel._project_write(stub, None, None, (out, bias))
    p = 0.3 * u @ u.t()
    torch.testing.assert_close(got_out, out @ p, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_bias, p @ bias, rtol=1e-5, atol=1e-6)


def test_checkpoint_without_write_scale_loads_with_scale_one():
    from megatron.training.model.subspace import fill_old_state
    expected = {"subspace_basis": 0, "subspace_write_scale": 0, "output_layer.weight": 0}
    old = {"subspace_basis": torch.zeros(3, 1), "output_layer.weight": torch.zeros(1)}
    fill_old_state(old, expected)
    assert float(old["subspace_write_scale"]) == 1.0
    new = {"subspace_basis": torch.zeros(3, 1), "subspace_write_scale": torch.tensor(0.25)}
    fill_old_state(new, expected)
    assert float(new["subspace_write_scale"]) == 0.25
    plain = {"output_layer.weight": torch.zeros(1)}   # not a subspace checkpoint: untouched
    fill_old_state(plain, {"output_layer.weight": 0})
    assert list(plain) == ["output_layer.weight"]


BOUNDARY = {"subspace-constrain": "boundary"}


def test_boundary_projects_only_the_stage_boundary(tiny_corpus):
    """One iteration at pp 2: the output projections' gradients have full rank (no write is
    confined) and the loss is another model's than the confined one."""
    import numpy as np
    loss, got = run_distributed(_pp_worker, 2, (tiny_corpus, BOUNDARY, 2), timeout=300)[-1]
    confined, _ = run_distributed(_pp_worker, 2, (tiny_corpus, {}, 2), timeout=300)[-1]
    assert np.isfinite(loss[0]) and loss[0] != confined[0]
    for name in ("decoder.layers.0.self_attention.linear_proj.weight",
                 "decoder.layers.3.mlp.linear_fc2.weight"):
        sv = np.linalg.svd(got[name][0].astype(np.float64), compute_uv=False)
        assert sv[K] > 1e-3 * sv[0], (name, sv[:K + 1])


@pytest.mark.parametrize("pp", [2, 4])
def test_learned_boundary_starts_at_the_fixed_one_and_trains(tiny_corpus, pp):
    """At initialisation the learned encoder and decoder are U: one iteration gives the fixed
    boundary's loss and gradients; the learned ones have their own, named per boundary."""
    import numpy as np
    learned = {"subspace-constrain": "learned"}
    loss, got = run_distributed(_pp_worker, pp, (tiny_corpus, learned, pp), timeout=300)[-1]
    ref_loss, ref = run_distributed(_pp_worker, pp, (tiny_corpus, BOUNDARY, pp),
                                    timeout=300)[-1]
    assert loss[0] == ref_loss[0]
    layers = 4
    ends = {f"subspace_boundary.{b}.{end}" for b in range(layers // pp, layers, layers // pp)
            for end in ("encoder", "decoder")}
    assert set(got) == set(ref) | ends
    for name in ref:
        assert all(np.array_equal(a, b) for a, b in zip(got[name], ref[name])), name
    for name in ends:
        (g,) = got[name]
        assert g.shape == (32, K) and np.abs(g).max() > 0, name
