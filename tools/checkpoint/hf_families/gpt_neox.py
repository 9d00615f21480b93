"""GPTNeoXForCausalLM <-> our GPTModel with partial rope and (usually) a parallel residual.

    HF (gpt_neox.layers.N.)          ours (decoder.layers.N.)
    input_layernorm                  input_layernorm
    attention.query_key_value        self_attention.linear_qkv       identical rows
    attention.dense                  self_attention.linear_proj
    post_attention_layernorm         pre_mlp_layernorm
    mlp.dense_h_to_4h / dense_4h_to_h  mlp.linear_fc1 / linear_fc2
    gpt_neox.embed_in, final_layer_norm, lm_head (embed_out before transformers 5):
    word_embeddings, final_layernorm, output_layer (untied)

NeoX's fused query_key_value is viewed as (heads, 3 x head_size): rows [q_h k_h v_h] per head,
which is megatron-core's per-group order with one head per group, so rows map unchanged.
use_parallel_residual=True is x + attn(ln1(x)) + mlp(ln2(x)) (--parallel-residual); its
rotary embedding rotates the two halves of the first rotary_pct of each head.
"""
from typing import Dict

from tools.checkpoint.hf_families.base import (
    FINAL_NORM, OUTPUT, WORD_EMB, Family, check_fields, common_flags, cut_vocab, getter, layer,
    pad_rows, rope_parameters)

_ACTS = {"gelu": False, "gelu_new": True, "gelu_pytorch_tanh": True, "gelu_fast": True}
_MAP = [("input_layernorm.weight", "input_layernorm.weight"),
        ("input_layernorm.bias", "input_layernorm.bias"),
        ("self_attention.linear_qkv.weight", "attention.query_key_value.weight"),
        ("self_attention.linear_qkv.bias", "attention.query_key_value.bias"),
        ("self_attention.linear_proj.weight", "attention.dense.weight"),
        ("self_attention.linear_proj.bias", "attention.dense.bias"),
        ("pre_mlp_layernorm.weight", "post_attention_layernorm.weight"),
        ("pre_mlp_layernorm.bias", "post_attention_layernorm.bias"),
        ("mlp.linear_fc1.weight", "mlp.dense_h_to_4h.weight"),
        ("mlp.linear_fc1.bias", "mlp.dense_h_to_4h.bias"),
        ("mlp.linear_fc2.weight", "mlp.dense_4h_to_h.weight"),
        ("mlp.linear_fc2.bias", "mlp.dense_4h_to_h.bias")]


def _lm_head_key() -> str:
    """transformers 5 names NeoX's output layer lm_head; earlier versions embed_out."""
    import inspect
    from transformers import GPTNeoXForCausalLM
    source = inspect.getsource(GPTNeoXForCausalLM.__init__)
    return "embed_out.weight" if "self.embed_out" in source else "lm_head.weight"


class GPTNeoX(Family):
    model_type = "gpt_neox"
    hf_class = "GPTNeoXForCausalLM"

    def model_flags(self, config) -> Dict[str, object]:
        check_fields(config, {
            "hidden_act": (tuple(_ACTS), "the MLP runs GeLU (erf, or tanh via --openai-gelu)"),
            "attention_bias": ((True,), "no flag drops the attention biases but keeps the "
                                        "MLP's and the norms'"),
        })
        rope = rope_parameters(config)
        flags = common_flags(config.num_hidden_layers, config.hidden_size,
                             config.num_attention_heads, config.intermediate_size,
                             config.max_position_embeddings, config.layer_norm_eps,
                             config.initializer_range,
                             getattr(config, "tie_word_embeddings", False))
        flags.update({
            "position_embedding_type": "rope", "rotary_base": float(rope["rope_theta"]),
            "rotary_percent": float(rope.get("partial_rotary_factor", 1.0)),
            "openai_gelu": _ACTS[config.hidden_act],
            "parallel_residual": bool(config.use_parallel_residual),
            "attention_dropout": config.attention_dropout,
            "hidden_dropout": config.hidden_dropout})
        return flags

    def from_hf(self, sd, config, rows):
        get = getter(sd, self.model_type)
        out = {WORD_EMB: pad_rows(get("gpt_neox.embed_in.weight"), rows),
               f"{FINAL_NORM}.weight": get("gpt_neox.final_layer_norm.weight").clone(),
               f"{FINAL_NORM}.bias": get("gpt_neox.final_layer_norm.bias").clone()}
        for i in range(config.num_hidden_layers):
            for ours, theirs in _MAP:
                out[layer(i, ours)] = get(f"gpt_neox.layers.{i}.{theirs}").clone()
        if getattr(config, "tie_word_embeddings", False):
            return out
        head = "embed_out.weight" if "embed_out.weight" in sd else "lm_head.weight"
        out[OUTPUT] = pad_rows(get(head), rows)
        return out

    def requires(self, model_args):
        why = "Hugging Face GPTNeoXForCausalLM"
        return {"position_embedding_type": ("rope", f"{why} uses rotary embeddings"),
                "normalization": ("LayerNorm", f"{why} uses LayerNorm"),
                "swiglu": (False, f"{why}'s MLP is GeLU"), "relu": (False, f"{why}'s MLP is GeLU"),
                "group_query_attention": (False, f"{why} has one key/value head per head"),
                "disable_bias_linear": (False, f"{why}'s linear layers have biases"),
                "disable_bias_attention": (False, f"{why}'s attention has biases"),
                "rotary_interleaved": (False, f"{why} rotates the two halves of each head"),
                "parallel_residual_shared_norm": (False, f"{why} has two norms per layer"),
                "output_layer_bias": (False, f"{why}'s embed_out has no bias")}

    def hf_config(self, model_args, vocab_size, eod, dtype):
        from transformers import GPTNeoXConfig
        m = model_args
        return GPTNeoXConfig(
            vocab_size=vocab_size, hidden_size=m["hidden_size"],
            num_hidden_layers=m["num_layers"], num_attention_heads=m["num_attention_heads"],
            intermediate_size=m["ffn_hidden_size"],
            hidden_act="gelu_new" if m.get("openai_gelu") else "gelu",
            rope_parameters={"rope_type": "default", "rope_theta": m.get("rotary_base", 1e4),
                             "partial_rotary_factor": m.get("rotary_percent", 1.0)},
            max_position_embeddings=m["max_position_embeddings"],
            initializer_range=m.get("init_method_std", 0.02),
            layer_norm_eps=m["layernorm_epsilon"],
            use_parallel_residual=m.get("parallel_residual", False),
            attention_dropout=m.get("attention_dropout", 0.0),
            hidden_dropout=m.get("hidden_dropout", 0.0), attention_bias=True,
            tie_word_embeddings=not m.get("untie_embeddings_and_output_weights", False),
            bos_token_id=eod, eos_token_id=eod, architectures=[self.hf_class],
            dtype=str(dtype).replace("torch.", ""))

    def to_hf(self, params, model_args, vocab_size):
        out = {"gpt_neox.embed_in.weight": cut_vocab(params[WORD_EMB], vocab_size),
               "gpt_neox.final_layer_norm.weight": params[f"{FINAL_NORM}.weight"].clone(),
               "gpt_neox.final_layer_norm.bias": params[f"{FINAL_NORM}.bias"].clone()}
        for i in range(model_args["num_layers"]):
            for ours, theirs in _MAP:
                out[f"gpt_neox.layers.{i}.{theirs}"] = params[layer(i, ours)].clone()
        if model_args.get("untie_embeddings_and_output_weights", False):
            out[_lm_head_key()] = cut_vocab(params[OUTPUT], vocab_size)
        return out

