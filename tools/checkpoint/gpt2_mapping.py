"""Our GPT (megatron-core GPTModel, local spec) <-> Hugging Face GPT2LMHeadModel, tensor by tensor.

    hf_sd = to_hf(params, model_args, vocab_size)      # {global name: tensor} -> GPT-2 state dict
    params = from_hf(hf_sd, hf_config, padded_rows)    # and back; exact both ways

The two models compute the same function; the tensors differ in three ways only:
  - HF's Conv1D stores weights as (in, out): every linear weight is transposed.
  - Megatron's linear_qkv interleaves per head, rows [q_0 k_0 v_0 | q_1 k_1 v_1 | ...] (one
    query group per head), while c_attn is [all q | all k | all v].
  - Our embedding has the vocabulary padded to a multiple of make_vocab_size_divisible_by x tp;
    GPT-2's has exactly the tokenizer's rows.

Architecture flags GPT-2 cannot express are refused by `unsupported_features` with the flag
named; `model_flags_from_hf` is the inverse check for an incoming GPT-2 config.
"""
from typing import Dict, List

import torch

from tools.checkpoint.errors import ConversionError  # noqa: F401  (re-exported)

WORD_EMB = "embedding.word_embeddings.weight"
POS_EMB = "embedding.position_embeddings.weight"

# (our suffix under decoder.layers.N, HF suffix under transformer.h.N, transpose)
_LAYER_MAP = [
    ("input_layernorm.weight", "ln_1.weight", False),
    ("input_layernorm.bias", "ln_1.bias", False),
    ("self_attention.linear_qkv.weight", "attn.c_attn.weight", True),
    ("self_attention.linear_qkv.bias", "attn.c_attn.bias", False),
    ("self_attention.linear_proj.weight", "attn.c_proj.weight", True),
    ("self_attention.linear_proj.bias", "attn.c_proj.bias", False),
    ("pre_mlp_layernorm.weight", "ln_2.weight", False),
    ("pre_mlp_layernorm.bias", "ln_2.bias", False),
    ("mlp.linear_fc1.weight", "mlp.c_fc.weight", True),
    ("mlp.linear_fc1.bias", "mlp.c_fc.bias", False),
    ("mlp.linear_fc2.weight", "mlp.c_proj.weight", True),
    ("mlp.linear_fc2.bias", "mlp.c_proj.bias", False),
]
_FINAL = [("decoder.final_layernorm.weight", "transformer.ln_f.weight"),
          ("decoder.final_layernorm.bias", "transformer.ln_f.bias")]

# Values a field of args['model'] must have for GPT-2 (fields this version lacks are skipped,
# so newer flags are checked as soon as the driver grows them).
_GPT2_REQUIRES = {
    "untie_embeddings_and_output_weights": (False, "GPT2LMHeadModel ties lm_head to wte"),
    "position_embedding_type": ("learned_absolute", "GPT-2 has learned absolute positions only"),
    "normalization": ("LayerNorm", "GPT-2 uses LayerNorm"),
    "swiglu": (False, "GPT-2's MLP is a single GeLU"),
    "gated_linear_unit": (False, "GPT-2's MLP is a single GeLU"),
    "squared_relu": (False, "GPT-2's MLP is GeLU"),
    "group_query_attention": (False, "GPT-2 has one key/value head per query head"),
    "disable_bias_linear": (False, "GPT-2's linear layers all have biases"),
    "add_bias_linear": (True, "GPT-2's linear layers all have biases"),
    "apply_residual_connection_post_layernorm": (False, "GPT-2 is pre-LayerNorm"),
    "qk_layernorm": (False, "GPT-2 has no query/key LayerNorm"),
    "apply_layernorm_1p": (False, "GPT-2's LayerNorm weight is not zero-centred"),
}


def unsupported_features(model_args: dict) -> List[str]:
    """Human-readable reasons this model is not a GPT-2 (empty when it is one)."""
    reasons = []
    for name, (want, why) in _GPT2_REQUIRES.items():
        if name in model_args and model_args[name] != want:
            reasons.append(f"--{name.replace('_', '-')}={model_args[name]} ({why})")
    groups = model_args.get("num_query_groups")
    if groups not in (None, model_args["num_attention_heads"]):
        reasons.append(f"--num-query-groups={groups} (GPT-2 has one key/value head per query "
                       f"head)")
    return reasons


def qkv_megatron_to_hf(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows [q_h k_h v_h] per head -> [all q | all k | all v] (weight (3H, H) or bias (3H,))."""
    rest = t.shape[1:]
    d = t.shape[0] // (3 * heads)
    return t.reshape(heads, 3, d, *rest).transpose(0, 1).reshape(3 * heads * d, *rest)


def qkv_hf_to_megatron(t: torch.Tensor, heads: int) -> torch.Tensor:
    rest = t.shape[1:]
    d = t.shape[0] // (3 * heads)
    return t.reshape(3, heads, d, *rest).transpose(0, 1).reshape(3 * heads * d, *rest)


def hf_config(model_args: dict, vocab_size: int, eod: int, dtype: torch.dtype):
    """A transformers GPT2Config for our model (raises ConversionError if it is not GPT-2)."""
    from transformers import GPT2Config
    reasons = unsupported_features(model_args)
    if reasons:
        raise ConversionError("this model cannot be written as a Hugging Face GPT-2: "
                              + "; ".join(reasons))
    m = model_args
    return GPT2Config(
        vocab_size=vocab_size, n_positions=m["max_position_embeddings"], n_embd=m["hidden_size"],
        n_layer=m["num_layers"], n_head=m["num_attention_heads"],
        n_inner=m["ffn_hidden_size"],
        # HF "gelu" is exact (erf) GeLU, "gelu_new" the tanh form Megatron's --openai-gelu uses.
        activation_function="gelu_new" if m.get("openai_gelu") else "gelu",
        resid_pdrop=m.get("hidden_dropout", 0.0), embd_pdrop=m.get("hidden_dropout", 0.0),
        attn_pdrop=m.get("attention_dropout", 0.0), layer_norm_epsilon=m["layernorm_epsilon"],
        initializer_range=m.get("init_method_std", 0.02), scale_attn_weights=True,
        bos_token_id=eod, eos_token_id=eod, tie_word_embeddings=True,
        architectures=["GPT2LMHeadModel"], dtype=str(dtype).replace("torch.", ""))


def to_hf(params: Dict[str, torch.Tensor], model_args: dict, vocab_size: int
          ) -> Dict[str, torch.Tensor]:
    """{our global name: tensor} -> GPT2LMHeadModel state dict (lm_head tied, so omitted)."""
    reasons = unsupported_features(model_args)
    if reasons:
        raise ConversionError("this model cannot be written as a Hugging Face GPT-2: "
                              + "; ".join(reasons))
    heads = model_args["num_attention_heads"]
    emb = params[WORD_EMB]
    if emb.shape[0] < vocab_size:
        raise ConversionError(f"the tokenizer has {vocab_size} tokens but the embedding only "
                              f"{emb.shape[0]} rows; wrong tokenizer?")
    out = {"transformer.wte.weight": emb[:vocab_size].clone(),
           "transformer.wpe.weight": params[POS_EMB].clone()}
    for layer in range(model_args["num_layers"]):
        for ours, hf, transpose in _LAYER_MAP:
            t = params[f"decoder.layers.{layer}.{ours}"]
            if "linear_qkv" in ours:
                t = qkv_megatron_to_hf(t, heads)
            out[f"transformer.h.{layer}.{hf}"] = (t.t() if transpose else t).contiguous().clone()
    for ours, hf in _FINAL:
        out[hf] = params[ours].clone()
    return out


def model_flags_from_hf(config) -> Dict[str, object]:
    """args['model'] fields for a GPT2Config; ConversionError for what our model cannot do."""
    if getattr(config, "model_type", None) != "gpt2":
        raise ConversionError(f"model_type is '{config.model_type}', expected 'gpt2' "
                              f"(only GPT-2 checkpoints can be imported)")
    act = config.activation_function
    if act not in ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        raise ConversionError(f"activation_function '{act}' has no Megatron flag (we run GeLU: "
                              f"'gelu', or tanh GeLU via --openai-gelu: 'gelu_new')")
    checks = [("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
              ("add_cross_attention", False)]
    for name, want in checks:
        if getattr(config, name, want) != want:
            raise ConversionError(f"{name}={getattr(config, name)} in the GPT-2 config is not "
                                  f"supported by our model (needs {want})")
    return {
        "num_layers": config.n_layer, "hidden_size": config.n_embd,
        "num_attention_heads": config.n_head,
        "ffn_hidden_size": config.n_inner or 4 * config.n_embd,
        "max_position_embeddings": config.n_positions, "layernorm_epsilon":
        config.layer_norm_epsilon, "openai_gelu": act != "gelu",
        "attention_dropout": config.attn_pdrop, "hidden_dropout": config.resid_pdrop,
        "init_method_std": config.initializer_range,
        "untie_embeddings_and_output_weights": not getattr(config, "tie_word_embeddings", True),
    }


def from_hf(hf_sd: Dict[str, torch.Tensor], config, padded_rows: int
            ) -> Dict[str, torch.Tensor]:
    """GPT2LMHeadModel state dict -> {our global name: tensor}; padding rows are zeros."""
    def get(name):
        t = hf_sd.get(name)
        if t is None:
            t = hf_sd.get(name[len("transformer."):])  # a GPT2Model state dict (no prefix)
        if t is None:
            raise ConversionError(f"the Hugging Face state dict has no '{name}'")
        return t

    def pad(t):
        if t.shape[0] > padded_rows:
            raise ConversionError(f"{t.shape[0]} vocabulary rows exceed {padded_rows}")
        return torch.cat([t, t.new_zeros((padded_rows - t.shape[0],) + tuple(t.shape[1:]))])

    heads = config.n_head
    out = {WORD_EMB: pad(get("transformer.wte.weight")).clone(),
           POS_EMB: get("transformer.wpe.weight").clone()}
    for layer in range(config.n_layer):
        for ours, hf, transpose in _LAYER_MAP:
            t = get(f"transformer.h.{layer}.{hf}")
            t = t.t() if transpose else t
            if "linear_qkv" in ours:
                t = qkv_hf_to_megatron(t, heads)
            out[f"decoder.layers.{layer}.{ours}"] = t.contiguous().clone()
    for ours, hf in _FINAL:
        out[ours] = get(hf).clone()
    if not getattr(config, "tie_word_embeddings", True):
        out["output_layer.weight"] = pad(hf_sd["lm_head.weight"]).clone()
    return out
