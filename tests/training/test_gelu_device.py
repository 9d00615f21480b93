"""One MLP activation per model definition, on every device.

megatron-core's fused bias-GeLU (taken on GPUs when bias_activation_fusion is on) is the tanh
approximation; its unfused path runs whatever activation_func is. Here megatron-core's own MLP
is built from config_kwargs(m, on_gpu=False) and (…, on_gpu=True) with the same weights and run
on the CPU (its fused kernels eagerly: megatron-core wraps them in torch.compile), so the GPU's
choice of kernel is checked without a GPU: both must compute the same function, and for the
GPT-2 family the function the Hugging Face config written by tools/checkpoint names
("gelu" = exact erf by default, "gelu_new" = tanh with --openai-gelu).
"""
import pytest
import torch

from tests.distributed import run_distributed

BASE = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "4"]
FLAGS = {"gelu": [], "openai-gelu": ["--openai-gelu"],
         "swiglu": ["--swiglu", "--disable-bias-linear"], "swiglu-bias": ["--swiglu"],
         "relu": ["--relu"]}
# fp32, the same weights: fused and unfused kernels differ in rounding only (and in the 8-digit
# sqrt(2/pi) megatron-core's kernel writes); exact vs tanh GeLU differ by ~1e-3 here
TOL = 2e-5
SHAPE = (8, 2, 32)   # (S, B, H)


def _mlp(config, m):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.mlp import MLP
    from megatron.training.runtime.compat import mlp_submodules
    sub = mlp_submodules(get_gpt_layer_local_spec())
    mlp = MLP(config, sub, ffn_hidden_size=m.ffn_hidden_size)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in mlp.parameters():   # the same weights for both configs; biases non-zero
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return mlp


def _outputs(rank, world):
    from megatron.core import parallel_state as ps
    from megatron.core.transformer import TransformerConfig
    from megatron.training.model.architecture import config_kwargs
    from megatron.training.flags.arguments import parse_args
    ps.initialize_model_parallel(1, 1)
    torch.compiler.set_stance("force_eager")   # megatron-core's jit_fuser is torch.compile
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(1)) * 2
    out = {}
    for name, flags in FLAGS.items():
        m = parse_args(BASE + flags, world_size=1).model
        runs = {}
        for on_gpu in (False, True):
            kw = config_kwargs(m, on_gpu)
            config = TransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=4,
                                       ffn_hidden_size=m.ffn_hidden_size,
                                       use_cpu_initialization=True, **kw)
            mlp = _mlp(config, m)
            with torch.no_grad():
                y, bias = mlp(x)
            y = y if bias is None else y + bias
            runs[on_gpu] = (y.detach().numpy(), kw["bias_activation_fusion"])
        w = {n: p.detach().numpy() for n, p in mlp.named_parameters()}
        out[name] = (runs, w, parse_args(BASE + flags, world_size=1).to_dict()["model"])
    ps.destroy_model_parallel()
    # by value: shared-memory tensor handles die with the spawned rank
    return x.numpy(), out


@pytest.fixture(scope="module")
def outputs():
    x, out = run_distributed(_outputs, 1, timeout=240)[0]
    t = torch.from_numpy
    return t(x), {name: ({k: (t(y), f) for k, (y, f) in runs.items()},
                         {n: t(v) for n, v in w.items()}, args)
                  for name, (runs, w, args) in out.items()}


@pytest.mark.parametrize("name", list(FLAGS))
def test_mlp_is_one_function_on_cpu_and_gpu_configs(outputs, name):
    _, out = outputs
    runs, _, _ = out[name]
    (cpu, fused_cpu), (gpu, fused_gpu) = runs[False], runs[True]
    assert not fused_cpu   # megatron-core's fused kernels are for CUDA
    diff = (gpu - cpu).abs().max().item()
    assert diff <= TOL, f"{name}: the GPU config computes another MLP ({diff:.2e})"


def test_gpu_fuses_where_the_fused_kernel_is_the_flagged_function(outputs):
    _, out = outputs
    fused = {name: runs[True][1] for name, (runs, _, _) in out.items()}
    # exact GeLU cannot use megatron-core's (tanh) kernel; ReLU has none
    assert fused == {"gelu": False, "openai-gelu": True, "swiglu": True, "swiglu-bias": True,
                     "relu": False}


@pytest.mark.parametrize("name,hf_act", [("gelu", "gelu"), ("openai-gelu", "gelu_new")])
def test_gpt2_mlp_matches_the_exported_hugging_face_activation(outputs, name, hf_act):
    from transformers.activations import ACT2FN
    from tools.checkpoint.gpt2_mapping import hf_config
    x, out = outputs
    runs, w, model_args = out[name]
    assert hf_config(model_args, 64, 0, torch.float32).activation_function == hf_act
    h = x @ w["linear_fc1.weight"].t() + w["linear_fc1.bias"]
    ref = ACT2FN[hf_act](h) @ w["linear_fc2.weight"].t() + w["linear_fc2.bias"]
    other = ACT2FN["gelu" if hf_act == "gelu_new" else "gelu_new"](h) @ \
        w["linear_fc2.weight"].t() + w["linear_fc2.bias"]
    assert (other - ref).abs().max() > 50 * TOL   # the test can tell the two GeLUs apart
    for on_gpu, (y, _) in runs.items():
        assert (y - ref).abs().max() <= TOL, f"on_gpu={on_gpu}"
