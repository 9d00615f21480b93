"""Megatron-LM checkpoint interoperability, both ways, at (tp, pp) = (1, 1).

Ours are written in Megatron-LM's layout (mp_rank_00, `args` an argparse.Namespace with its
attribute names) and still resume bit for bit, also from our older layout (mp_rank_00_000,
args a dict). A checkpoint in Megatron-LM's own form -- made here by hand from one of ours:
its file keys, its flat Namespace, megatron-core names in the local or the Transformer Engine
spelling, no checksum -- loads with --finetune (weights) or --no-load-optim (weights and
progress), and plain --load names both flags. The tools read it too.

transformers 5 no longer ships models/megatron_gpt2/convert_megatron_gpt2_checkpoint.py, so
the attributes that script reads off `args` are checked here instead.
"""
import argparse
import os
import random
import shutil

import numpy as np
import pytest
import torch

from megatron.training.checkpointing.checkpoint_args import args_dict
from megatron.training.checkpointing.checkpoint_io import safe_load, write_file
from tests.conftest import tiny_gpt_argv
from tests.distributed import run_distributed

ITERS, SAVE_AT = 5, 3
SHARD = os.path.join("iter_0000003", "{}", "model_optim_rng.pt")
TE_NAMES = {"input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
            "input_layernorm.bias": "self_attention.linear_qkv.layer_norm_bias",
            "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight",
            "pre_mlp_layernorm.bias": "mlp.linear_fc1.layer_norm_bias"}


def _argv(corpus, **kw):
    return tiny_gpt_argv(corpus, **{"train-iters": ITERS, **kw})


def write_legacy(ours: str, dst: str) -> None:
    """Our layout before Megatron-LM's: mp_rank_00_000 at pp 1, args a plain dict."""
    shutil.copytree(ours, dst)
    old = os.path.join(dst, "iter_0000003", "mp_rank_00_000")
    os.replace(os.path.join(dst, "iter_0000003", "mp_rank_00"), old)
    path = os.path.join(old, "model_optim_rng.pt")
    sd = safe_load(path)
    sd["args"], sd["checkpoint_version"] = args_dict(sd["args"]), 2
    write_file(sd, path)


def megatron_lm_args(ours: dict, layout: dict) -> argparse.Namespace:
    """A Namespace with Megatron-LM's attribute names (not ours: no megatron_cc_args)."""
    m, d = ours["model"], ours["data"]
    return argparse.Namespace(
        num_layers=m["num_layers"], hidden_size=m["hidden_size"],
        num_attention_heads=m["num_attention_heads"], ffn_hidden_size=m["ffn_hidden_size"],
        seq_length=m["seq_length"], max_position_embeddings=m["max_position_embeddings"],
        padded_vocab_size=layout["padded_vocab_size"], make_vocab_size_divisible_by=128,
        tensor_model_parallel_size=1, pipeline_model_parallel_size=1, world_size=1,
        data_parallel_size=1, norm_epsilon=m["layernorm_epsilon"], add_bias_linear=True,
        position_embedding_type="learned_absolute", normalization="LayerNorm", swiglu=False,
        untie_embeddings_and_output_weights=False, openai_gelu=False, bias_gelu_fusion=True,
        attention_dropout=0.0, hidden_dropout=0.0, consumed_train_samples=24,
        tokenizer_type="GPT2BPETokenizer", vocab_file=d["vocab_file"],
        merge_file=d["merge_file"], params_dtype=torch.float32, fp16=False, bf16=False,
        transformer_impl="transformer_engine", use_mcore_models=True, ckpt_format="torch")


def write_megatron_lm(ours: str, dst: str, spec: str) -> dict:
    """One of our checkpoints rewritten as Megatron-LM's torch format writes it."""
    sd = safe_load(os.path.join(ours, SHARD.format("mp_rank_00")))
    model = {}
    for k, v in sd["model"].items():
        if spec == "te":
            for local, te in TE_NAMES.items():
                k = k.replace(local, te)
            if k.endswith("_extra_state"):   # Transformer Engine's serialised fp8 metadata
                v = torch.zeros(8, dtype=torch.uint8)
        model[k] = v
    if spec == "te":
        for i in range(4):
            model[f"decoder.layers.{i}.self_attention.core_attention._extra_state"] = \
                torch.zeros(8, dtype=torch.uint8)
    out = {"args": megatron_lm_args(args_dict(sd["args"]), sd["layout"]),
           "checkpoint_version": 3.0, "iteration": SAVE_AT, "model": model,
           "optimizer": {"state": {}, "param_groups": [{"lr": 1e-3, "params": []}]},
           "opt_param_scheduler": {"max_lr": 1e-3, "num_steps": 24},
           "rng_state": [{"random_rng_state": random.getstate(),
                          "np_rng_state": np.random.get_state(),
                          "torch_rng_state": torch.get_rng_state(),
                          "rng_tracker_states": {}}],
           "num_floating_point_operations_so_far": 0}
    path = os.path.join(dst, SHARD.format("mp_rank_00"))
    os.makedirs(os.path.dirname(path))
    torch.save(out, path)   # Megatron-LM writes no checksum file
    with open(os.path.join(dst, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(SAVE_AT))
    return model


def _loaded(argv):
    """(model state, iteration, consumed samples) right after Trainer loads, or the error."""
    from megatron.core import parallel_state as ps
    from megatron.training.flags.arguments import parse_args
    from megatron.training.runtime.initialize import initialize_distributed
    from megatron.training.model.model import unwrap
    from megatron.training.loop.training import Trainer
    args = parse_args(argv, world_size=1)
    initialize_distributed(args)
    try:
        t = Trainer(args)
    except ValueError as e:
        return str(e)
    finally:
        ps.destroy_model_parallel()
    state = {k: v.clone() for k, v in unwrap(t.model).state_dict().items() if torch.is_tensor(v)}
    return state, t.iteration, t.consumed_samples


def _job(rank, world, corpus, root):
    from tests.training import runner
    ours, legacy = os.path.join(root, "ours"), os.path.join(root, "legacy")
    out = {"straight": runner.train(_argv(corpus), 1),
           "first": runner.train(_argv(corpus, save=ours, **{"exit-interval": SAVE_AT}), 1),
           "resumed": runner.train(_argv(corpus, load=ours), 1)}
    write_legacy(ours, legacy)
    out["resumed_legacy"] = runner.train(_argv(corpus, load=legacy), 1)
    out["saved"] = _loaded(_argv(corpus, load=ours, finetune=True))[0]
    for spec in ("local", "te"):
        mlm = os.path.join(root, f"megatron_lm_{spec}")
        write_megatron_lm(ours, mlm, spec)
        out[spec] = {"plain": _loaded(_argv(corpus, load=mlm)),
                     "finetune": _loaded(_argv(corpus, load=mlm, finetune=True)),
                     "no_load_optim": _loaded(_argv(corpus, load=mlm,
                                                    **{"no-load-optim": True}))}
    return out


@pytest.fixture(scope="module")
def runs(tiny_corpus, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("megatron_lm"))
    return root, run_distributed(_job, 1, (tiny_corpus, root), timeout=600)[0]


def test_written_in_megatron_lm_layout(runs):
    root, _ = runs
    assert sorted(os.listdir(os.path.join(root, "ours", "iter_0000003"))) == \
        ["mp_rank_00", "rank_state"]
    path = os.path.join(root, "ours", SHARD.format("mp_rank_00"))
    with torch.serialization.safe_globals([argparse.Namespace]):   # as Megatron-LM loads
        sd = torch.load(path, map_location="cpu", weights_only=True)
    assert isinstance(sd["args"], argparse.Namespace) and sd["checkpoint_version"] == 3
    assert sd["iteration"] == SAVE_AT and "model" in sd


def test_args_carry_what_megatron_lm_tools_read(runs, tiny_corpus):
    """convert_megatron_gpt2_checkpoint.py's reads (GPT2Config fields, activation, tokenizer),
    and Megatron-LM's load_args_from_checkpoint / check_checkpoint_args."""
    root, _ = runs
    a = torch.load(os.path.join(root, "ours", SHARD.format("mp_rank_00")), weights_only=False)[
        "args"]
    activation = "gelu_fast" if a.bias_gelu_fusion else "gelu_new" if a.openai_gelu else "gelu"
    assert activation == "gelu"   # exact GeLU, what export_hf writes as well
    assert (a.num_layers, a.hidden_size, a.num_attention_heads, a.ffn_hidden_size) == \
        (4, 32, 4, 128)
    assert (a.max_position_embeddings, a.seq_length, a.padded_vocab_size) == (32, 32, 1024)
    assert a.tokenizer_type == "GPT2BPETokenizer" and a.vocab_file == tiny_corpus["vocab"]
    assert (a.tensor_model_parallel_size, a.pipeline_model_parallel_size) == (1, 1)
    assert a.add_bias_linear and a.add_position_embedding and not a.swiglu
    assert (a.norm_epsilon, a.kv_channels, a.make_vocab_size_divisible_by) == (1e-5, 8, 128)
    assert a.consumed_train_samples == SAVE_AT * 8 and a.params_dtype == torch.float32
    assert a.megatron_cc_args["model"]["num_layers"] == 4   # ours, read back whole


def test_resume_is_bit_exact_from_both_layouts(runs):
    _, r = runs
    assert r["first"] == r["straight"][:SAVE_AT]
    assert r["resumed"] == r["straight"][SAVE_AT:], (r["resumed"], r["straight"])
    assert r["resumed_legacy"] == r["straight"][SAVE_AT:]


@pytest.mark.parametrize("spec", ["local", "te"])
def test_megatron_lm_checkpoint_loads(runs, spec):
    _, r = runs
    got = r[spec]
    assert "--finetune" in got["plain"] and "--no-load-optim" in got["plain"], got["plain"]
    state, iteration, consumed = got["finetune"]
    assert (iteration, consumed) == (0, 0)
    assert state.keys() == r["saved"].keys()
    for k, v in r["saved"].items():
        assert torch.equal(state[k], v), k
    state, iteration, consumed = got["no_load_optim"]
    assert (iteration, consumed) == (SAVE_AT, 24)
    assert all(torch.equal(state[k], v) for k, v in r["saved"].items())


@pytest.mark.parametrize("spec", ["local", "te"])
def test_tools_read_megatron_lm_and_legacy_checkpoints(runs, spec):
    from tools.checkpoint.layout import merge, read_checkpoint
    root, _ = runs
    reference = merge(read_checkpoint(os.path.join(root, "ours"))).params
    for name in (f"megatron_lm_{spec}", "legacy"):
        params = merge(read_checkpoint(os.path.join(root, name))).params
        assert params.keys() == reference.keys(), name
        assert all(torch.equal(params[k], v) for k, v in reference.items()), name


def test_args_namespace_round_trip_and_flat_flags():
    from megatron.training.flags.arguments import parse_args
    from megatron.training.checkpointing.checkpoint_args import args_namespace
    d = parse_args(["--tensor-model-parallel-size", "2"], world_size=4).to_dict()
    ns = args_namespace(d, {"padded_vocab_size": 256, "vocab_size": 200}, consumed_samples=7)
    assert args_dict(ns) == d and args_dict(d) == d
    for group in (g for g in d.values() if isinstance(g, dict)):
        assert all(getattr(ns, k) == v for k, v in group.items())   # each flag, flat
    assert (ns.padded_vocab_size, ns.true_vocab_size, ns.consumed_train_samples,
            ns.data_parallel_size) == (256, 200, 7, 2)


@pytest.mark.parametrize("tp_rank,pp_rank,pp,name", [
    (0, 0, 1, "mp_rank_00"), (3, 0, 1, "mp_rank_03"), (1, 2, 4, "mp_rank_01_002")])
def test_shard_directory_names(tp_rank, pp_rank, pp, name):
    from megatron.training.checkpointing.checkpoint_compat import (
        parse_shard_dir, shard_dir_candidates, shard_dir_name)
    assert shard_dir_name(tp_rank, pp_rank, pp) == name
    assert parse_shard_dir(name) == (tp_rank, pp_rank)
    legacy = f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"
    assert shard_dir_candidates(tp_rank, pp_rank, pp) == list(dict.fromkeys([name, legacy]))
    assert parse_shard_dir("mp_rank_00_000_001") is None   # expert parallel: not read
