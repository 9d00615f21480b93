"""LlamaForCausalLM and Qwen2ForCausalLM <-> our GPTModel with rope, RMSNorm, SwiGLU, GQA.

    HF (model.layers.N.)             ours (decoder.layers.N.)
    input_layernorm                  input_layernorm                 (RMSNorm, weight only)
    self_attn.{q,k,v}_proj           self_attention.linear_qkv       rows per query group
    self_attn.o_proj                 self_attention.linear_proj
    post_attention_layernorm         pre_mlp_layernorm
    mlp.{gate,up}_proj               mlp.linear_fc1                  [gate; up] (--swiglu)
    mlp.down_proj                    mlp.linear_fc2
    model.norm, model.embed_tokens, lm_head: final_layernorm, word_embeddings, output_layer

HF Llama's rotary embedding rotates the two halves of each head (its q/k weights are stored
permuted for that), as megatron-core's non-interleaved RoPE does: no permutation here.
Qwen2 differs by its q/k/v biases only (--add-qkv-bias).
"""
from typing import Dict

import torch

from tools.checkpoint.hf_families.base import (
    FINAL_NORM, OUTPUT, WORD_EMB, Family, check_fields, common_flags, cut_vocab, getter, layer,
    pack_qkv, pad_rows, refuse, rope_parameters, unpack_qkv)

_LINEAR = [("self_attention.linear_proj.weight", "self_attn.o_proj.weight"),
           ("mlp.linear_fc2.weight", "mlp.down_proj.weight")]
_NORMS = [("input_layernorm.weight", "input_layernorm.weight"),
          ("pre_mlp_layernorm.weight", "post_attention_layernorm.weight")]


class Llama(Family):
    model_type = "llama"
    hf_class = "LlamaForCausalLM"
    qkv_bias = False

    def _check(self, config) -> None:
        check_fields(config, {
            "hidden_act": (("silu",), "the MLP is SwiGLU: --swiglu is silu(gate) * up"),
            "attention_bias": ((False,), "Llama attention biases include o_proj's; only "
                                         "q/k/v biases have a flag (--add-qkv-bias, Qwen2)"),
            "mlp_bias": ((False,), "no flag gives the MLP biases without the attention's"),
            "pretraining_tp": ((1,), "the sliced-matmul emulation has no flag"),
            "use_sliding_window": ((False,), "sliding-window attention has no flag; every "
                                             "layer here attends to the whole causal prefix"),
        })
        kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
        if kinds != {"full_attention"}:
            refuse(config, "layer_types", sorted(kinds), "only full causal attention in "
                   "every layer; sliding-window layers have no flag")
        head_dim = getattr(config, "head_dim", None)
        if head_dim not in (None, config.hidden_size // config.num_attention_heads):
            refuse(config, "head_dim", head_dim, "head_dim must be hidden_size / "
                   "num_attention_heads here")

    def model_flags(self, config) -> Dict[str, object]:
        self._check(config)
        rope = rope_parameters(config)
        if rope.get("partial_rotary_factor", 1.0) != 1.0:
            refuse(config, "partial_rotary_factor", rope["partial_rotary_factor"],
                   f"{self.model_type} rotates whole heads")
        heads, groups = config.num_attention_heads, config.num_key_value_heads or \
            config.num_attention_heads
        flags = common_flags(config.num_hidden_layers, config.hidden_size, heads,
                             config.intermediate_size, config.max_position_embeddings,
                             config.rms_norm_eps, config.initializer_range,
                             getattr(config, "tie_word_embeddings", False))
        flags.update({
            "position_embedding_type": "rope", "rotary_base": float(rope["rope_theta"]),
            "normalization": "RMSNorm", "swiglu": True, "disable_bias_linear": True,
            "add_qkv_bias": self.qkv_bias, "attention_dropout": config.attention_dropout,
            "hidden_dropout": 0.0})
        if groups != heads:
            flags.update({"group_query_attention": True, "num_query_groups": groups})
        return flags

    def from_hf(self, sd, config, rows):
        get = getter(sd, self.model_type)
        heads = config.num_attention_heads
        groups = config.num_key_value_heads or heads
        out = {WORD_EMB: pad_rows(get("model.embed_tokens.weight"), rows),
               f"{FINAL_NORM}.weight": get("model.norm.weight").clone()}
        for i in range(config.num_hidden_layers):
            hf = f"model.layers.{i}."
            qkv = [get(f"{hf}self_attn.{x}_proj.weight") for x in "qkv"]
            out[layer(i, "self_attention.linear_qkv.weight")] = pack_qkv(*qkv, heads, groups)
            if self.qkv_bias:
                qkv = [get(f"{hf}self_attn.{x}_proj.bias") for x in "qkv"]
                out[layer(i, "self_attention.linear_qkv.bias")] = pack_qkv(*qkv, heads, groups)
            out[layer(i, "mlp.linear_fc1.weight")] = torch.cat(
                [get(f"{hf}mlp.gate_proj.weight"), get(f"{hf}mlp.up_proj.weight")])
            for ours, theirs in _LINEAR + _NORMS:
                out[layer(i, ours)] = get(hf + theirs).clone()
        if not getattr(config, "tie_word_embeddings", False):
            out[OUTPUT] = pad_rows(get("lm_head.weight"), rows)
        return out

    def requires(self, model_args):
        why = f"Hugging Face {self.hf_class}"
        req = {"position_embedding_type": ("rope", f"{why} uses rotary embeddings"),
               "normalization": ("RMSNorm", f"{why} uses RMSNorm"),
               "swiglu": (True, f"{why}'s MLP is SwiGLU"),
               "disable_bias_linear": (True, f"{why} has no linear biases"),
               "add_qkv_bias": (self.qkv_bias, f"{why} {'has' if self.qkv_bias else 'has no'} "
                                               f"q/k/v biases"),
               "rotary_interleaved": (False, f"{why} rotates the two halves of each head"),
               "rotary_percent": (1.0, f"{why} rotates whole heads"),
               "parallel_residual": (False, f"{why} is sequential pre-norm"),
               "output_layer_bias": (False, f"{why}'s lm_head has no bias")}
        return req

    def hf_config(self, model_args, vocab_size, eod, dtype):
        from transformers import AutoConfig
        m = model_args
        heads = m["num_attention_heads"]
        kwargs = dict(
            vocab_size=vocab_size, hidden_size=m["hidden_size"],
            intermediate_size=m["ffn_hidden_size"], num_hidden_layers=m["num_layers"],
            num_attention_heads=heads,
            num_key_value_heads=m["num_query_groups"] if m.get("group_query_attention")
            else heads,
            hidden_act="silu", max_position_embeddings=m["max_position_embeddings"],
            initializer_range=m.get("init_method_std", 0.02), rms_norm_eps=m["layernorm_epsilon"],
            tie_word_embeddings=not m.get("untie_embeddings_and_output_weights", False),
            rope_parameters={"rope_type": "default", "rope_theta": m.get("rotary_base", 10000.0)},
            attention_dropout=m.get("attention_dropout", 0.0), bos_token_id=eod,
            eos_token_id=eod, architectures=[self.hf_class],
            dtype=str(dtype).replace("torch.", ""))
        if self.model_type == "llama":
            kwargs.update(attention_bias=False, mlp_bias=False)
        return AutoConfig.for_model(self.model_type, **kwargs)

    def to_hf(self, params, model_args, vocab_size):
        m = model_args
        heads = m["num_attention_heads"]
        groups = m["num_query_groups"] if m.get("group_query_attention") else heads
        out = {"model.embed_tokens.weight": cut_vocab(params[WORD_EMB], vocab_size),
               "model.norm.weight": params[f"{FINAL_NORM}.weight"].clone()}
        for i in range(m["num_layers"]):
            hf = f"model.layers.{i}."
            q, k, v = unpack_qkv(params[layer(i, "self_attention.linear_qkv.weight")], heads,
                                 groups)
            out.update({f"{hf}self_attn.q_proj.weight": q, f"{hf}self_attn.k_proj.weight": k,
                        f"{hf}self_attn.v_proj.weight": v})
            if self.qkv_bias:
                q, k, v = unpack_qkv(params[layer(i, "self_attention.linear_qkv.bias")], heads,
                                     groups)
                out.update({f"{hf}self_attn.q_proj.bias": q, f"{hf}self_attn.k_proj.bias": k,
                            f"{hf}self_attn.v_proj.bias": v})
            gate, up = params[layer(i, "mlp.linear_fc1.weight")].chunk(2)
            out[f"{hf}mlp.gate_proj.weight"] = gate.clone()
            out[f"{hf}mlp.up_proj.weight"] = up.clone()
            for ours, theirs in _LINEAR + _NORMS:
                out[hf + theirs] = params[layer(i, ours)].clone()
        if m.get("untie_embeddings_and_output_weights", False):
            out["lm_head.weight"] = cut_vocab(params[OUTPUT], vocab_size)
        return out


class Qwen2(Llama):
    model_type = "qwen2"
    hf_class = "Qwen2ForCausalLM"
    qkv_bias = True
