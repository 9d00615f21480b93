"""--legacy-layout: the merged checkpoint in legacy Megatron-LM's nested layout, as transformers
4.x's convert_megatron_gpt2_checkpoint.py reads it.

The checkpoint is a random Hugging Face GPT-2 (every tensor perturbed, tanh GeLU, 1000 tokens
padded to 1024) imported at (2, 2), so the original tensors are known. Always checked: the
file key by key under torch.load(weights_only=True), the QKV order the converter assumes for
checkpoint_version 3.0 (re-implemented here), and that a GPT2LMHeadModel built from the file
gives the logits of export_hf.py's directory. Transformers' own converter runs when a 4.x
release that ships it (4.47.1 is the last) is importable, or MEGATRON_CC_TRANSFORMERS4 names
either the script file of a 4.x source (run with this interpreter's transformers) or a
directory made by `pip install --target DIR --no-deps 'transformers==4.47.1'
'tokenizers>=0.21,<0.22' 'huggingface_hub>=0.24,<1.0'`.
"""
import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from tools import ckpt_convert
from tools.checkpoint import import_hf, reshard

CONVERTER = "transformers.models.megatron_gpt2.convert_megatron_gpt2_checkpoint"
TF4_ENV = "MEGATRON_CC_TRANSFORMERS4"
LAYER_SUFFIXES = [f"{m}.{p}" for m in (
    "input_layernorm", "self_attention.query_key_value", "self_attention.dense",
    "post_attention_layernorm", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h")
    for p in ("weight", "bias")]
# legacy module -> GPT2LMHeadModel module (linear weights are Conv1D there: transposed)
TO_HF = {"input_layernorm": "ln_1", "post_attention_layernorm": "ln_2",
         "self_attention.query_key_value": "attn.c_attn", "self_attention.dense": "attn.c_proj",
         "mlp.dense_h_to_4h": "mlp.c_fc", "mlp.dense_4h_to_h": "mlp.c_proj"}


def regroup_qkv(t: torch.Tensor, heads: int) -> torch.Tensor:
    """checkpoint_version >= 2 stores QKV rows per head, [q_h k_h v_h]; GPT-2's c_attn wants
    [all q | all k | all v] (the converter's fix_query_key_value_ordering)."""
    d = t.shape[0] // (3 * heads)
    return t.reshape(heads, 3, d, *t.shape[1:]).transpose(0, 1).reshape(t.shape)


def gpt2_from_legacy(sd: dict):
    """A GPT2LMHeadModel holding a legacy file's tensors, built from its args."""
    from transformers import GPT2Config, GPT2LMHeadModel
    a = sd["args"]
    config = GPT2Config(vocab_size=a.padded_vocab_size, n_positions=a.max_position_embeddings,
                        n_embd=a.hidden_size, n_layer=a.num_layers, n_head=a.num_attention_heads,
                        n_inner=a.ffn_hidden_size, layer_norm_epsilon=a.norm_epsilon,
                        activation_function="gelu_new" if a.openai_gelu else "gelu",
                        bos_token_id=None, eos_token_id=None)
    lm = sd["model"]["language_model"]
    state = {"transformer.wte.weight": lm["embedding"]["word_embeddings"]["weight"],
             "transformer.wpe.weight": lm["embedding"]["position_embeddings"]["weight"]}
    for key, t in lm["encoder"].items():
        m = re.fullmatch(r"layers\.(\d+)\.(.+)\.(weight|bias)", key)
        if m is None:   # final_layernorm.{weight,bias}
            state[f"transformer.ln_f.{key.split('.')[-1]}"] = t
            continue
        layer, module, kind = m.groups()
        if module == "self_attention.query_key_value":
            t = regroup_qkv(t, a.num_attention_heads)
        if kind == "weight" and "layernorm" not in module:
            t = t.t()
        state[f"transformer.h.{layer}.{TO_HF[module]}.{kind}"] = t.contiguous()
    model = GPT2LMHeadModel(config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert missing == ["lm_head.weight"] and not unexpected, (missing, unexpected)
    model.tie_weights()
    return model.eval()


def logits(model_or_dir, tokens):
    from transformers import AutoModelForCausalLM
    model = model_or_dir if not isinstance(model_or_dir, str) else \
        AutoModelForCausalLM.from_pretrained(model_or_dir, local_files_only=True).eval()
    with torch.no_grad():
        return model(tokens).logits


def _tokens():
    return torch.randint(0, 1000, (2, 24), generator=torch.Generator().manual_seed(3))


def converter_command():
    """The command that runs transformers 4.x's converter and the PYTHONPATH entry it needs
    ('' for none), or None when there is none here (see the module docstring)."""
    try:
        if importlib.util.find_spec(CONVERTER) is not None:
            return [sys.executable, "-m", CONVERTER], ""
    except ImportError:
        pass
    given = os.environ.get(TF4_ENV)
    if given and os.path.isfile(given) and given.endswith(".py"):
        return [sys.executable, given], ""
    if given and os.path.isfile(os.path.join(given, *CONVERTER.split(".")) + ".py"):
        return [sys.executable, "-m", CONVERTER], given
    return None


@pytest.fixture(scope="module")
def legacy(hf_gpt2, tmp_path_factory):
    root = tmp_path_factory.mktemp("legacy")
    ck = str(root / "ck22")
    assert import_hf.main(["--hf-model", hf_gpt2["dir"], "--save", ck, "--no-progress",
                           "--tensor-model-parallel-size", "2",
                           "--pipeline-model-parallel-size", "2"]) == 0
    save, out = str(root / "legacy"), str(root / "hf")
    assert ckpt_convert.main(["--load", ck, "--save", save, "--legacy-layout", "-o", out,
                              "--no-progress"]) == 0
    shard = os.path.join(save, "iter_0000000", "mp_rank_00")
    return {"ck": ck, "save": save, "shard": shard, "hf": out, "root": root,
            "file": os.path.join(shard, "model_optim_rng.pt")}


def test_layout_key_by_key_under_weights_only_load(legacy, hf_gpt2):
    sd = torch.load(legacy["file"], map_location="cpu", weights_only=True)
    assert sorted(sd) == ["args", "checkpoint_version", "iteration", "model"]
    assert sd["checkpoint_version"] == 3.0 and sd["iteration"] == 0
    assert list(sd["model"]) == ["language_model"]
    lm = sd["model"]["language_model"]
    assert list(lm) == ["embedding", "encoder"]
    emb = lm["embedding"]
    assert {k: tuple(v["weight"].shape) for k, v in emb.items()} == \
        {"word_embeddings": (1000, 32), "position_embeddings": (64, 32)}
    expected = [f"layers.{i}.{s}" for i in range(4) for s in LAYER_SUFFIXES] + \
        ["final_layernorm.weight", "final_layernorm.bias"]
    assert list(lm["encoder"]) == expected   # the converter stops at the first non-layer key
    shapes = {"query_key_value.weight": (96, 32), "query_key_value.bias": (96,),
              "dense.weight": (32, 32), "dense_h_to_4h.weight": (128, 32),
              "dense_h_to_4h.bias": (128,), "dense_4h_to_h.weight": (32, 128)}
    for key, t in lm["encoder"].items():
        want = next((s for suffix, s in shapes.items() if key.endswith("." + suffix)), (32,))
        assert tuple(t.shape) == want, key
    a = sd["args"]   # read by attribute (the converter, Megatron-LM) and by item alike
    assert vars(a) == dict(a)
    assert (a.padded_vocab_size, a.hidden_size, a.num_layers, a.num_attention_heads,
            a.ffn_hidden_size, a.max_position_embeddings) == (1000, 32, 4, 4, 128, 64)
    assert a.openai_gelu is True and a.bias_gelu_fusion is False
    assert (a.tensor_model_parallel_size, a.pipeline_model_parallel_size) == (1, 1)
    assert a.tokenizer_type == "PretrainedFromHF"
    assert a.tokenizer_name_or_path == legacy["shard"]
    assert {"config.json", "tokenizer_config.json"} <= set(os.listdir(legacy["shard"]))
    with open(os.path.join(legacy["save"], "latest_checkpointed_iteration.txt")) as f:
        assert f.read().strip() == "0"
    # the embedding is the original's real rows; every tensor is the original's
    assert torch.equal(emb["word_embeddings"]["weight"],
                       hf_gpt2["state"]["transformer.wte.weight"])


def test_qkv_order_is_the_one_checkpoint_version_3_means(legacy, hf_gpt2):
    enc = torch.load(legacy["file"], weights_only=True)["model"]["language_model"]["encoder"]
    for i in range(4):
        w, b = (enc[f"layers.{i}.self_attention.query_key_value.{k}"] for k in ("weight", "bias"))
        hf_w, hf_b = (hf_gpt2["state"][f"transformer.h.{i}.attn.c_attn.{k}"]
                      for k in ("weight", "bias"))
        assert torch.equal(regroup_qkv(w, 4).t(), hf_w)
        assert torch.equal(regroup_qkv(b, 4), hf_b)
        assert not torch.equal(w.t(), hf_w)   # not the identity: heads really are interleaved


def test_gpt2_built_from_the_file_gives_the_exported_logits(legacy, hf_gpt2):
    model = gpt2_from_legacy(torch.load(legacy["file"], weights_only=True))
    tokens = _tokens()
    ours, exported, original = (logits(m, tokens) for m in (model, legacy["hf"], hf_gpt2["dir"]))
    print(f"\nGPT-2 from the legacy file vs export_hf: max |logit diff| "
          f"{(ours - exported).abs().max():.3e}; vs the original "
          f"{(ours - original).abs().max():.3e}")
    assert torch.equal(ours, exported)
    assert torch.allclose(ours, original, atol=1e-5, rtol=0)


def test_transformers4_converter_gives_the_exported_model(legacy, tmp_path):
    found = converter_command()
    if found is None:
        pytest.skip(f"no transformers 4.x with {CONVERTER} (set {TF4_ENV}; see the docstring)")
    command, pythonpath = found
    shard = str(tmp_path / "mp_rank_00")
    shutil.copytree(legacy["shard"], shard)   # the converter writes next to its input
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH")) if p)
    r = subprocess.run(command + ["--config_file", os.path.join(shard, "config.json"),
                                  os.path.join(shard, "model_optim_rng.pt")],
                       env=env, capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert os.path.isfile(os.path.join(shard, "pytorch_model.bin"))
    tokens = _tokens()
    converted, exported = logits(shard, tokens), logits(legacy["hf"], tokens)
    print(f"\ntransformers 4.x converter vs export_hf: max |logit diff| "
          f"{(converted - exported).abs().max():.3e}")
    assert torch.equal(converted, exported)


def test_reshard_writes_the_same_file(legacy, tmp_path):
    save = str(tmp_path / "legacy")
    assert reshard.main(["--load", legacy["ck"], "--save", save, "--legacy-layout",
                         "--no-progress"]) == 0
    a = torch.load(legacy["file"], weights_only=True)["model"]
    b = torch.load(os.path.join(save, "iter_0000000", "mp_rank_00", "model_optim_rng.pt"),
                   weights_only=True)["model"]
    flat = lambda d, p="": {k2: v2 for k, v in d.items() for k2, v2 in (  # noqa: E731
        flat(v, p + k + "/").items() if isinstance(v, dict) else [(p + k, v)])}
    fa, fb = flat(a), flat(b)
    assert fa.keys() == fb.keys() and all(torch.equal(fa[k], fb[k]) for k in fa)


@pytest.mark.parametrize("save,extra,fragment", [
    (True, ["--target-tensor-model-parallel-size", "2"], "--legacy-layout writes one piece"),
    (False, [], "--legacy-layout is the layout of --save"),
])
def test_legacy_layout_refusals(legacy, tmp_path, capsys, save, extra, fragment):
    argv = ["--load", legacy["ck"], "--legacy-layout", "--no-progress", "-o", str(tmp_path / "o")]
    argv += (["--save", str(tmp_path / "s")] if save else []) + extra
    assert ckpt_convert.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and fragment in err[0], err
    assert not os.path.exists(tmp_path / "s") and not os.path.exists(tmp_path / "o")
