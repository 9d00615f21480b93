"""--transformer-impl sdpa (torch scaled_dot_product_attention, causal) against megatron-core's
local unfused attention: same parameters, same logits and gradients within float rounding,
at tp=2 so the per-partition head split is exercised too."""
import pytest
import torch

from tests.distributed import run_distributed

TOL = 2e-5  # fp32, different summation order in softmax(QK^T)V


def _logits_and_grads(rank, world, impl):
    from megatron.core import parallel_state as ps
    from megatron.training.flags.arguments import parse_args
    from megatron.training.runtime.initialize import initialize_distributed
    from megatron.training.model.model import build_gpt_model, transformer_config
    args = parse_args(["--tensor-model-parallel-size", "2", "--num-layers", "2",
                       "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
                       "--attention-dropout", "0", "--hidden-dropout", "0",
                       "--transformer-impl", impl], world_size=world)
    topo = initialize_distributed(args)
    try:
        model = build_gpt_model(args, transformer_config(args), 256, topo)
        tokens = torch.randint(0, 256, (3, 32), generator=torch.Generator().manual_seed(1))
        pos = torch.arange(32).expand_as(tokens)
        logits = model(tokens, pos, None)
        logits.float().pow(2).mean().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        core = type(model.decoder.layers[0].self_attention.core_attention).__name__
    finally:
        ps.destroy_model_parallel()
    return logits.detach(), grads, core


def _both(rank, world):
    return [_logits_and_grads(rank, world, impl) for impl in ("local", "sdpa")]


def test_sdpa_matches_local_attention():
    for (ref, ref_grads, ref_core), (out, grads, core) in run_distributed(_both, 2, timeout=240):
        assert (ref_core, core) == ("DotProductAttention", "SDPAttention")
        scale = ref.abs().max()
        assert (out - ref).abs().max() <= TOL * scale
        assert grads.keys() == ref_grads.keys()
        for n in grads:
            g, r = grads[n], ref_grads[n]
            assert (g - r).abs().max() <= TOL * max(r.abs().max(), 1e-12), n


def test_default_impl_is_local_on_cpu_and_transformer_engine_is_checked():
    from megatron.training.flags.arguments import ConfigError, parse_args
    from megatron.training.model.attention import default_impl, have_transformer_engine
    if not torch.cuda.is_available():
        assert default_impl() == "local"
    if not have_transformer_engine():
        with pytest.raises(ConfigError, match="transformer_engine"):
            parse_args(["--transformer-impl", "transformer_engine"], world_size=1)
