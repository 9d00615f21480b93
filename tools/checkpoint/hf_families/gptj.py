"""GPTJForCausalLM <-> our GPTModel with interleaved partial rope and a shared-norm parallel layer.

    HF (transformer.h.N.)            ours (decoder.layers.N.)
    ln_1                             input_layernorm     (feeds attention and MLP)
    attn.{q,k,v}_proj (no bias)      self_attention.linear_qkv (no bias)
    attn.out_proj (no bias)          self_attention.linear_proj (no bias)
    mlp.fc_in / mlp.fc_out           mlp.linear_fc1 / linear_fc2
    transformer.wte, ln_f, lm_head (weight and bias): word_embeddings, final_layernorm,
    output_layer (untied, --output-layer-bias)

GPT-J's rotary embedding rotates interleaved channel pairs (rotate_every_two) of the first
rotary_dim channels of each head: megatron-core's --rotary-interleaved with --rotary-percent
rotary_dim / head_dim, so the q/k rows map unchanged.
"""
from typing import Dict

from tools.checkpoint.hf_families.base import (
    FINAL_NORM, OUTPUT, OUTPUT_BIAS, WORD_EMB, Family, check_fields, common_flags, cut_vocab,
    getter, layer, pack_qkv, pad_rows, refuse, unpack_qkv)

_ACTS = {"gelu": False, "gelu_new": True, "gelu_pytorch_tanh": True, "gelu_fast": True}
_MAP = [("input_layernorm.weight", "ln_1.weight"), ("input_layernorm.bias", "ln_1.bias"),
        ("self_attention.linear_proj.weight", "attn.out_proj.weight"),
        ("mlp.linear_fc1.weight", "mlp.fc_in.weight"), ("mlp.linear_fc1.bias", "mlp.fc_in.bias"),
        ("mlp.linear_fc2.weight", "mlp.fc_out.weight"),
        ("mlp.linear_fc2.bias", "mlp.fc_out.bias")]


class GPTJ(Family):
    model_type = "gptj"
    hf_class = "GPTJForCausalLM"

    def model_flags(self, config) -> Dict[str, object]:
        check_fields(config, {
            "activation_function": (tuple(_ACTS), "the MLP runs GeLU (erf, or tanh via "
                                                  "--openai-gelu)"),
            "tie_word_embeddings": ((False,), "GPT-J's lm_head has a bias, which a tied "
                                              "output layer cannot hold"),
        })
        head_dim = config.n_embd // config.n_head
        rotary_dim = config.rotary_dim or head_dim
        if rotary_dim > head_dim or rotary_dim % 2:
            refuse(config, "rotary_dim", config.rotary_dim, f"must be even and at most the "
                   f"head size {head_dim}")
        flags = common_flags(config.n_layer, config.n_embd, config.n_head,
                             config.n_inner or 4 * config.n_embd, config.n_positions,
                             config.layer_norm_epsilon, config.initializer_range, False)
        flags.update({
            "position_embedding_type": "rope", "rotary_base": 10000.0,
            "rotary_percent": rotary_dim / head_dim, "rotary_interleaved": True,
            "openai_gelu": _ACTS[config.activation_function], "parallel_residual": True,
            "parallel_residual_shared_norm": True, "disable_bias_attention": True,
            "output_layer_bias": True, "attention_dropout": config.attn_pdrop,
            "hidden_dropout": config.resid_pdrop})
        return flags

    def from_hf(self, sd, config, rows):
        get = getter(sd, self.model_type)
        heads = config.n_head
        out = {WORD_EMB: pad_rows(get("transformer.wte.weight"), rows),
               f"{FINAL_NORM}.weight": get("transformer.ln_f.weight").clone(),
               f"{FINAL_NORM}.bias": get("transformer.ln_f.bias").clone(),
               OUTPUT: pad_rows(get("lm_head.weight"), rows),
               OUTPUT_BIAS: pad_rows(get("lm_head.bias"), rows)}
        for i in range(config.n_layer):
            hf = f"transformer.h.{i}."
            qkv = [get(f"{hf}attn.{x}_proj.weight") for x in "qkv"]
            out[layer(i, "self_attention.linear_qkv.weight")] = pack_qkv(*qkv, heads, heads)
            for ours, theirs in _MAP:
                out[layer(i, ours)] = get(hf + theirs).clone()
        return out

    def requires(self, model_args):
        why = "Hugging Face GPTJForCausalLM"
        return {"position_embedding_type": ("rope", f"{why} uses rotary embeddings"),
                "rotary_interleaved": (True, f"{why} rotates interleaved channel pairs"),
                "normalization": ("LayerNorm", f"{why} uses LayerNorm"),
                "swiglu": (False, f"{why}'s MLP is GeLU"), "relu": (False, f"{why}'s MLP is GeLU"),
                "group_query_attention": (False, f"{why} has one key/value head per head"),
                "disable_bias_linear": (False, f"{why}'s MLP has biases"),
                "disable_bias_attention": (True, f"{why}'s attention has no biases"),
                "parallel_residual": (True, f"{why} runs attention and MLP in parallel"),
                "parallel_residual_shared_norm": (True, f"{why} has one norm per layer"),
                "untie_embeddings_and_output_weights": (True, f"{why} has its own lm_head"),
                "output_layer_bias": (True, f"{why}'s lm_head has a bias")}

    def hf_config(self, model_args, vocab_size, eod, dtype):
        from transformers import GPTJConfig
        m = model_args
        head_dim = m["hidden_size"] // m["num_attention_heads"]
        return GPTJConfig(
            vocab_size=vocab_size, n_positions=m["max_position_embeddings"],
            n_embd=m["hidden_size"], n_layer=m["num_layers"], n_head=m["num_attention_heads"],
            rotary_dim=int(round(head_dim * m.get("rotary_percent", 1.0))),
            n_inner=m["ffn_hidden_size"],
            activation_function="gelu_new" if m.get("openai_gelu") else "gelu",
            resid_pdrop=m.get("hidden_dropout", 0.0), embd_pdrop=m.get("hidden_dropout", 0.0),
            attn_pdrop=m.get("attention_dropout", 0.0), layer_norm_epsilon=m["layernorm_epsilon"],
            initializer_range=m.get("init_method_std", 0.02), tie_word_embeddings=False,
            bos_token_id=eod, eos_token_id=eod, architectures=[self.hf_class],
            dtype=str(dtype).replace("torch.", ""))

    def to_hf(self, params, model_args, vocab_size):
        heads = model_args["num_attention_heads"]
        out = {"transformer.wte.weight": cut_vocab(params[WORD_EMB], vocab_size),
               "transformer.ln_f.weight": params[f"{FINAL_NORM}.weight"].clone(),
               "transformer.ln_f.bias": params[f"{FINAL_NORM}.bias"].clone(),
               "lm_head.weight": cut_vocab(params[OUTPUT], vocab_size),
               "lm_head.bias": cut_vocab(params[OUTPUT_BIAS], vocab_size)}
        for i in range(model_args["num_layers"]):
            hf = f"transformer.h.{i}."
            q, k, v = unpack_qkv(params[layer(i, "self_attention.linear_qkv.weight")], heads,
                                 heads)
            out.update({f"{hf}attn.q_proj.weight": q, f"{hf}attn.k_proj.weight": k,
                        f"{hf}attn.v_proj.weight": v})
            for ours, theirs in _MAP:
                out[hf + theirs] = params[layer(i, ours)].clone()
        return out
