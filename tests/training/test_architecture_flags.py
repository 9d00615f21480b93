"""Architecture flags: contradictions refused before training with the flags named; defaults."""
import pytest

from megatron.training.flags.arguments import parse_args
from megatron.training.config.config_flags import ConfigError

BASE = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4"]


@pytest.mark.parametrize("flags,fragment", [
    (["--swiglu", "--relu"], "--swiglu, --relu and --openai-gelu"),
    (["--group-query-attention"], "--group-query-attention and --num-query-groups"),
    (["--num-query-groups", "2"], "--group-query-attention and --num-query-groups"),
    (["--group-query-attention", "--num-query-groups", "3"], "--num-query-groups (3) must divide"),
    (["--group-query-attention", "--num-query-groups", "1", "--tensor-model-parallel-size",
      "2"], "divisible by --tensor-model-parallel-size (2)"),
    (["--rotary-percent", "0.1"], "--rotary-percent (0.1)"),
    (["--add-qkv-bias", "--disable-bias-attention"], "--add-qkv-bias contradicts"),
    (["--parallel-residual-shared-norm"], "needs --parallel-residual"),
    (["--output-layer-bias"], "--output-layer-bias needs --untie-embeddings-and-output-weights"),
])
def test_contradictions_are_refused(flags, fragment):
    with pytest.raises(ConfigError) as e:
        parse_args(BASE + flags, world_size=2)
    assert fragment in str(e.value)


def test_swiglu_default_ffn_and_norm_epsilon_alias():
    m = parse_args(BASE + ["--swiglu", "--norm-epsilon", "1e-6"], world_size=1).model
    assert m.ffn_hidden_size == int(4 * 64 * 2 / 3 / 64) * 64 and m.layernorm_epsilon == 1e-6
    assert parse_args(BASE, world_size=1).model.ffn_hidden_size == 256
