"""Parameter lists of the cost model against published parameter counts (GPT-2, Llama-2-7B,
Qwen2-0.5B), and the per-stage / per-tp-rank split summing back to the whole model."""
import pytest

from megatron.cc.plan.shapes import Layout, ModelShape, stage_params

GPT2_SMALL = ModelShape(num_layers=12, hidden_size=768, num_attention_heads=12, vocab_size=50257,
                        seq_length=1024)
LLAMA2_7B = ModelShape(num_layers=32, hidden_size=4096, num_attention_heads=32, vocab_size=32000,
                       seq_length=4096, ffn_hidden_size=11008, swiglu=True,
                       normalization="RMSNorm", position_embedding_type="rope",
                       untie_embeddings_and_output_weights=True, disable_bias_linear=True)
QWEN2_05B = ModelShape(num_layers=24, hidden_size=896, num_attention_heads=14,
                       vocab_size=151936, seq_length=4096, ffn_hidden_size=4864,
                       num_query_groups=2, swiglu=True, normalization="RMSNorm",
                       position_embedding_type="rope", disable_bias_linear=True,
                       add_qkv_bias=True)


def test_published_parameter_counts():
    # Hugging Face GPT2LMHeadModel: 124,439,808 with 50,257 rows; Megatron pads to 50,304
    assert GPT2_SMALL.num_params() == 124_439_808 + (50_304 - 50_257) * 768
    assert LLAMA2_7B.num_params() == 6_738_415_616   # 32,000 rows: no padding
    # Qwen2-0.5B: 494,032,768 with 151,936 rows (a multiple of 128)
    assert QWEN2_05B.num_params() == 494_032_768


@pytest.mark.parametrize("shape", [GPT2_SMALL, LLAMA2_7B, QWEN2_05B], ids=["gpt2", "llama",
                                                                          "qwen2"])
@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 2), (4, 4)])
def test_stages_and_tp_ranks_sum_to_the_model(shape, tp, pp):
    """tp-split tensors hold 1/tp each, the rest are replicated; with pp > 1 and tied
    embeddings the last stage's output layer is a second copy of the embedding."""
    total = 0
    vocab_pad = shape.padded_vocab(tp) - shape.padded_vocab(1)
    for s in range(pp):
        params = stage_params(shape, tp, pp, s)
        for p in params:
            if p.shared_embedding and s == pp - 1 and pp > 1:
                continue
            total += p.numel * (tp if p.tp_split else 1)
        has_emb = any(p.shared_embedding for p in params)   # the stage's tied embedding copy
        assert has_emb == (shape.tied and s in (0, pp - 1))
    extra = vocab_pad * shape.hidden_size * (1 if shape.tied else 2)
    assert total == shape.num_params() + extra


def test_from_args_and_bad_layouts():
    from megatron.training.flags.arguments import parse_args
    args = parse_args(["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                       "--swiglu", "--group-query-attention", "--num-query-groups", "2"],
                      world_size=1)
    s = ModelShape.from_args(args.model, vocab_size=1000)
    assert (s.ffn_hidden_size, s.num_query_groups, s.swiglu) == (128, 2, True)
    with pytest.raises(ValueError, match="Layout.dp must be >= 1"):
        Layout(dp=0)
    with pytest.raises(ValueError, match="virtual_stages"):
        Layout(virtual_stages=2)   # pp 1: nothing to interleave
    assert Layout(pp=4, virtual_stages=2).boundaries == 7
    with pytest.raises(ValueError, match="not divisible by pp"):
        stage_params(GPT2_SMALL, 1, 5, 0)


def test_llama2_70b_grouped_query_attention_and_swiglu():
    """Llama-2-70B's shape: q and o 8192 x 8192, k and v 8192 x 1024 (8 kv heads of 128),
    SwiGLU gate, up and down 8192 x 28672, two RMSNorms per layer, untied 32000-row embedding
    and output layer, a final norm; at tp 8 the k/v rows split by 8 too."""
    m = ModelShape(num_layers=80, hidden_size=8192, num_attention_heads=64, vocab_size=32000,
                   seq_length=4096, ffn_hidden_size=28672, num_query_groups=8, swiglu=True,
                   normalization="RMSNorm", position_embedding_type="rope",
                   untie_embeddings_and_output_weights=True, disable_bias_linear=True)
    H, kv, F = 8192, 1024, 28672
    layer = 2 * H * H + 2 * H * kv + 3 * H * F + 2 * H
    assert m.num_params() == 80 * layer + 2 * 32000 * H + H == 68_976_648_192
    qkv = next(p for p in stage_params(m, 8, 4, 1) if p.name.endswith("linear_qkv.weight"))
    assert qkv.shape == ((H + 2 * kv) // 8, H)
