"""Merge/split is exact, resharding chains are exact, and training resumes with the same losses."""
import argparse
import os

import pytest
import torch

from tools.checkpoint import layout
from tools.checkpoint.common import tokenizer_vocab_size
from tools.checkpoint.reshard import main as reshard_main

REL_TOL = 1e-5


def _shards(path):
    return layout.read_checkpoint(path).shards


def _assert_same_shard(a: dict, b: dict, where: str):
    assert a["model"].keys() == b["model"].keys(), where
    for k, v in a["model"].items():
        if torch.is_tensor(v):
            assert torch.equal(v, b["model"][k]), f"{where}: {k}"
        else:
            assert v == b["model"][k], f"{where}: {k}"
    oa, ob = a["optimizer_by_name"], b["optimizer_by_name"]
    assert oa.keys() == ob.keys(), where
    for name in oa:
        for k, v in oa[name].items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(ob[name][k])), \
                f"{where}: optimizer {name}.{k}"
    for k in ("iteration", "consumed_samples", "opt_param_scheduler"):
        assert a[k] == b[k], f"{where}: {k}"
    for k in ("kinds", "grad_scaler"):   # absent where no optimizer state is kept
        assert a.get(k) == b.get(k), f"{where}: {k}"
    assert (a["layout"]["tp"], a["layout"]["pp"], a["layout"]["tp_rank"], a["layout"]["pp_rank"],
            a["layout"]["padded_vocab_size"]) == (
        b["layout"]["tp"], b["layout"]["pp"], b["layout"]["tp_rank"], b["layout"]["pp_rank"],
        b["layout"]["padded_vocab_size"]), where


def test_split_at_the_saved_layout_gives_the_saved_files_back(ckpts):
    original = layout.read_checkpoint(ckpts["ck22"])
    full = layout.merge(original)
    vocab = tokenizer_vocab_size(argparse.Namespace(), full.args)
    again = layout.split(full, 2, 2, vocab_size=vocab)
    assert again.keys() == original.shards.keys()
    for key, sd in original.shards.items():
        _assert_same_shard(again[key], sd, f"shard {key}")
        assert sd["optimizer_by_name"], "the trained checkpoint has Adam state by name"
        assert sd["kinds"] == ["adam"], sd.get("kinds")


def test_reshard_chain_22_11_14_22_is_exact(ckpts, tmp_path):
    src = ckpts["ck22"]
    chain = [(1, 1), (1, 4), (2, 2)]
    prev = src
    for tp, pp in chain:
        out = str(tmp_path / f"tp{tp}pp{pp}")
        assert reshard_main(["--load", prev, "--save", out, "--target-tensor-parallel-size",
                             str(tp), "--target-pipeline-model-parallel-size", str(pp),
                             "--no-progress"]) == 0
        shards = _shards(out)
        assert sorted(shards) == [(t, p) for t in range(tp) for p in range(pp)]
        for sd in shards.values():
            assert sd["args"]["parallel"]["tensor_model_parallel_size"] == tp
            assert sd["args"]["parallel"]["pipeline_model_parallel_size"] == pp
        prev = out
    merged = layout.merge(layout.read_checkpoint(str(tmp_path / "tp1pp1")))
    reference = layout.merge(layout.read_checkpoint(src))
    assert merged.params.keys() == reference.params.keys()
    for k in reference.params:
        assert torch.equal(merged.params[k], reference.params[k]), k
    original, final = _shards(src), _shards(prev)
    for key in original:
        _assert_same_shard(final[key], original[key], f"after the chain, shard {key}")


def test_training_resumed_from_a_resharded_checkpoint_continues_the_same(ckpts):
    """(2,2,1) saved at iteration 3, resharded to (1,4,1) and resumed, matches iterations 4-6
    of the uninterrupted (2,2,1) run."""
    r = ckpts["losses22"]
    ref, resharded = r["uninterrupted"][3:], r["resharded_14"]
    print(f"\n(2,2,1) uninterrupted, iterations 4-6: {ref}"
          f"\n(2,2,1) -> (1,4,1) resumed at 3:      {resharded}")
    assert len(r["uninterrupted"]) == 6 and len(resharded) == 3
    for i, (a, b) in enumerate(zip(resharded, ref)):
        assert abs(a - b) <= REL_TOL * abs(b), (i, a, b)
    assert ref[-1] < r["uninterrupted"][0]  # it trains


def test_tied_output_copy_equals_the_embedding(ckpts):
    """Stage pp-1's output_layer.weight is the embedding: merging keeps one, splitting copies."""
    shards = _shards(ckpts["ck22"])
    for t in range(2):
        assert torch.equal(shards[(t, 0)]["model"]["embedding.word_embeddings.weight"],
                           shards[(t, 1)]["model"]["output_layer.weight"])


def _full_from_hf(hf_gpt2, divisible_by):
    from tools.checkpoint.import_hf import full_from_hf
    return full_from_hf(hf_gpt2["dir"], make_vocab_size_divisible_by=divisible_by)


def test_vocab_padding_changes_with_tp_keep_real_rows(hf_gpt2):
    full = _full_from_hf(hf_gpt2, 400)          # 1000 tokens: 1200 rows at tp=1
    assert full.padded_vocab_size == 1200
    tp2 = layout.split(full, 2, 1)              # multiple 800: 1600 rows
    emb = torch.cat([tp2[(t, 0)]["model"]["embedding.word_embeddings.weight"] for t in range(2)])
    assert emb.shape[0] == 1600
    assert torch.equal(emb[:1200], full.params["embedding.word_embeddings.weight"])
    assert not emb[1000:].any()                 # padding rows are zeros
    back = layout.split(layout.merge(layout.ShardedCheckpoint("-", 0, 2, 1, tp2)), 1, 1)
    assert torch.equal(back[(0, 0)]["model"]["embedding.word_embeddings.weight"],
                       full.params["embedding.word_embeddings.weight"])


def test_unknown_vocab_size_is_refused_only_when_padding_is_ambiguous(hf_gpt2):
    full = _full_from_hf(hf_gpt2, 128)
    full.vocab_size = None
    full.args["parallel"]["tensor_model_parallel_size"] = 1
    full.padded_vocab_size = 1024
    assert layout.target_padded_vocab(full, 2) == 1024   # any size in (896, 1024] pads to 1024
    full.args["parallel"]["tensor_model_parallel_size"] = 2
    with pytest.raises(layout.CheckpointError, match="--true-vocab-size"):
        layout.target_padded_vocab(full, 1)             # (768, 1024] pads to 896 or 1024
    assert layout.target_padded_vocab(full, 1, vocab_size=1000) == 1024
    # GPT-2's 50257 tokens: 50432 rows at tp=2 but 50304 at tp=1
    full.padded_vocab_size = 50432
    with pytest.raises(layout.CheckpointError):
        layout.target_padded_vocab(full, 1)
    assert layout.target_padded_vocab(full, 1, vocab_size=50257) == 50304


def test_partition_rules_name_every_tensor_parallel_weight():
    assert layout.partition_dim("decoder.layers.7.self_attention.linear_qkv.weight") == 0
    assert layout.partition_dim("decoder.layers.7.self_attention.linear_qkv.bias") == 0
    assert layout.partition_dim("decoder.layers.7.mlp.linear_fc1.bias") == 0
    assert layout.partition_dim("decoder.layers.7.self_attention.linear_proj.weight") == 1
    assert layout.partition_dim("decoder.layers.7.mlp.linear_fc2.weight") == 1
    assert layout.partition_dim("decoder.layers.7.mlp.linear_fc2.bias") == -1
    assert layout.partition_dim("decoder.layers.7.input_layernorm.weight") == -1
    assert layout.partition_dim("embedding.word_embeddings.weight") == 0
    assert layout.partition_dim("embedding.position_embeddings.weight") == -1
    assert layout.partition_dim("output_layer.weight") == 0
    assert os.path.basename(layout.MODEL_FILE) == "model_optim_rng.pt"
