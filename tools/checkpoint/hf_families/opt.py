"""OPTForCausalLM <-> our GPTModel with learned positions, LayerNorm and ReLU (--relu).

    HF (model.decoder.layers.N.)     ours (decoder.layers.N.)
    self_attn_layer_norm             input_layernorm
    self_attn.{q,k,v}_proj           self_attention.linear_qkv       rows per head [q k v]
    self_attn.out_proj               self_attention.linear_proj
    final_layer_norm                 pre_mlp_layernorm
    fc1 / fc2                        mlp.linear_fc1 / linear_fc2
    embed_tokens, final_layer_norm (decoder's), lm_head (tied): word_embeddings,
    final_layernorm

OPT's position table has max_position_embeddings + 2 rows and looks up position + 2 (rows 0
and 1 serve only left-padding, which our training never has): we keep rows 2.. as our table,
and an export writes rows 0 and 1 as zeros. The post-LayerNorm variant (OPT-350m:
do_layer_norm_before=False, word_embed_proj_dim != hidden_size with project_in/project_out)
is refused by name.
"""
from typing import Dict

import torch

from tools.checkpoint.hf_families.base import (
    FINAL_NORM, POS_EMB, WORD_EMB, Family, check_fields, common_flags, cut_vocab, getter, layer,
    pack_qkv, pad_rows, refuse, unpack_qkv)

OFFSET = 2  # HF OPTLearnedPositionalEmbedding.offset
_MAP = [("input_layernorm.weight", "self_attn_layer_norm.weight"),
        ("input_layernorm.bias", "self_attn_layer_norm.bias"),
        ("self_attention.linear_proj.weight", "self_attn.out_proj.weight"),
        ("self_attention.linear_proj.bias", "self_attn.out_proj.bias"),
        ("pre_mlp_layernorm.weight", "final_layer_norm.weight"),
        ("pre_mlp_layernorm.bias", "final_layer_norm.bias"),
        ("mlp.linear_fc1.weight", "fc1.weight"), ("mlp.linear_fc1.bias", "fc1.bias"),
        ("mlp.linear_fc2.weight", "fc2.weight"), ("mlp.linear_fc2.bias", "fc2.bias")]


class OPT(Family):
    model_type = "opt"
    hf_class = "OPTForCausalLM"

    def model_flags(self, config) -> Dict[str, object]:
        check_fields(config, {
            "do_layer_norm_before": ((True,), "post-LayerNorm OPT (OPT-350m) has no flag; "
                                              "our layers are pre-norm"),
            "_remove_final_layer_norm": ((False,), "the final LayerNorm is always present"),
            "enable_bias": ((True,), "OPT without biases has no flag"),
            "layer_norm_elementwise_affine": ((True,), "LayerNorm always has weight and bias"),
            "activation_function": (("relu",), "OPT's MLP runs ReLU (--relu)"),
            "layerdrop": ((0.0, 0), "LayerDrop has no flag"),
            "tie_word_embeddings": ((True,), "OPT ties lm_head to embed_tokens"),
        })
        if config.word_embed_proj_dim != config.hidden_size:
            refuse(config, "word_embed_proj_dim", config.word_embed_proj_dim,
                   f"project_in/project_out (embedding width != hidden_size "
                   f"{config.hidden_size}) have no flag")
        flags = common_flags(config.num_hidden_layers, config.hidden_size,
                             config.num_attention_heads, config.ffn_dim,
                             config.max_position_embeddings, 1e-5, config.init_std, True)
        flags.update({"relu": True, "attention_dropout": config.attention_dropout,
                      "hidden_dropout": config.dropout})
        return flags

    def from_hf(self, sd, config, rows):
        get = getter(sd, self.model_type)
        heads = config.num_attention_heads
        d = "model.decoder."
        out = {WORD_EMB: pad_rows(get(f"{d}embed_tokens.weight"), rows),
               POS_EMB: get(f"{d}embed_positions.weight")[OFFSET:].clone(),
               f"{FINAL_NORM}.weight": get(f"{d}final_layer_norm.weight").clone(),
               f"{FINAL_NORM}.bias": get(f"{d}final_layer_norm.bias").clone()}
        for i in range(config.num_hidden_layers):
            hf = f"{d}layers.{i}."
            for kind in ("weight", "bias"):
                qkv = [get(f"{hf}self_attn.{x}_proj.{kind}") for x in "qkv"]
                out[layer(i, f"self_attention.linear_qkv.{kind}")] = pack_qkv(*qkv, heads, heads)
            for ours, theirs in _MAP:
                out[layer(i, ours)] = get(hf + theirs).clone()
        return out

    def requires(self, model_args):
        why = "Hugging Face OPTForCausalLM"
        return {"position_embedding_type": ("learned_absolute", f"{why} learns positions"),
                "normalization": ("LayerNorm", f"{why} uses LayerNorm"),
                "relu": (True, f"{why}'s MLP is ReLU"), "swiglu": (False, f"{why}'s MLP is ReLU"),
                "group_query_attention": (False, f"{why} has one key/value head per head"),
                "disable_bias_linear": (False, f"{why}'s linear layers have biases"),
                "disable_bias_attention": (False, f"{why}'s attention has biases"),
                "parallel_residual": (False, f"{why} is sequential pre-norm"),
                "untie_embeddings_and_output_weights": (False, f"{why} ties lm_head"),
                "layernorm_epsilon": (1e-5, f"{why}'s LayerNorm epsilon is fixed at 1e-5")}

    def hf_config(self, model_args, vocab_size, eod, dtype):
        from transformers import OPTConfig
        m = model_args
        return OPTConfig(
            vocab_size=vocab_size, hidden_size=m["hidden_size"],
            num_hidden_layers=m["num_layers"], ffn_dim=m["ffn_hidden_size"],
            max_position_embeddings=m["max_position_embeddings"], do_layer_norm_before=True,
            word_embed_proj_dim=m["hidden_size"], dropout=m.get("hidden_dropout", 0.0),
            attention_dropout=m.get("attention_dropout", 0.0),
            num_attention_heads=m["num_attention_heads"], activation_function="relu",
            init_std=m.get("init_method_std", 0.02), enable_bias=True,
            tie_word_embeddings=True, bos_token_id=eod, eos_token_id=eod,
            pad_token_id=eod, architectures=[self.hf_class],
            dtype=str(dtype).replace("torch.", ""))

    def to_hf(self, params, model_args, vocab_size):
        heads = model_args["num_attention_heads"]
        d = "model.decoder."
        pos = params[POS_EMB]
        out = {f"{d}embed_tokens.weight": cut_vocab(params[WORD_EMB], vocab_size),
               f"{d}embed_positions.weight": torch.cat([pos.new_zeros(OFFSET, pos.shape[1]),
                                                        pos]),
               f"{d}final_layer_norm.weight": params[f"{FINAL_NORM}.weight"].clone(),
               f"{d}final_layer_norm.bias": params[f"{FINAL_NORM}.bias"].clone()}
        for i in range(model_args["num_layers"]):
            hf = f"{d}layers.{i}."
            for kind in ("weight", "bias"):
                q, k, v = unpack_qkv(params[layer(i, f"self_attention.linear_qkv.{kind}")],
                                     heads, heads)
                out.update({f"{hf}self_attn.q_proj.{kind}": q, f"{hf}self_attn.k_proj.{kind}": k,
                            f"{hf}self_attn.v_proj.{kind}": v})
            for ours, theirs in _MAP:
                out[hf + theirs] = params[layer(i, ours)].clone()
        return out
