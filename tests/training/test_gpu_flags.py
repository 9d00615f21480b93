"""GPU flags on the CPU side: validation messages, the mixed-precision optimizer state saved by
parameter name (with fp32 main weights), the loss-scale log field. The CUDA-only halves (the
real Float16 optimizer, loss scaling, staging) run in tests/gpu."""
import types

import pytest
import torch

from megatron.training.checkpointing import save_load as checkpointing
from megatron.training.flags.arguments import ConfigError, parse_args


@pytest.mark.parametrize("flags,message", [
    (["--loss-scale", "1024"], "--loss-scale sets fp16 loss scaling; add --fp16"),
    (["--loss-scale-window", "10"], "--loss-scale-window sets fp16"),
    (["--overlap-param-gather"], "--overlap-param-gather needs --use-distributed-optimizer"),
    (["--dp-backend", "nccl"], "--dp-backend nccl needs GPUs"),
    (["--pp-backend", "nccl"], "--pp-backend nccl needs CUDA"),
    (["--use-distributed-optimizer", "--dp-mode", "diloco"],
     "--dp-mode diloco exchanges its own state"),
    (["--use-distributed-optimizer", "--dp-backend", "gloo"], "--dp-backend gives the dp channel"),
    (["--bf16"], "need GPUs"),
])
def test_bad_gpu_flags_are_refused(flags, message):
    if torch.cuda.is_available():
        pytest.skip("CPU-side messages")
    with pytest.raises(ConfigError, match=message.replace("-", r"\-")):
        parse_args(flags, world_size=4)


def test_distributed_optimizer_on_gloo_refused_on_gpus(monkeypatch):
    """megatron-core's parameter all-gather coalesces CUDA tensors, which gloo cannot (an
    H200 segfault): refused at dp > 1 on GPUs; dp 1 and the CPU keep it."""
    flags = ["--use-distributed-optimizer", "--distributed-backend", "gloo"]
    parse_args(flags, world_size=2)   # CPU
    monkeypatch.setattr("megatron.training.runtime.topology.cuda_available", lambda: True)
    parse_args(flags, world_size=1)
    with pytest.raises(ConfigError, match=r"\-\-distributed\-backend gloo on GPUs"):
        parse_args(flags, world_size=2)


def test_gpu_flags_parse_with_megatron_spelling():
    a = parse_args(["--transformer-impl", "sdpa", "--dp-backend", "gloo", "--pp_backend",
                    "gloo"], world_size=2)
    assert (a.gpu.transformer_impl, a.compression.dp_backend, a.gpu.pp_backend) == ("sdpa", "gloo", "gloo")
    assert a.to_dict()["compression"]["dp_backend"] == "gloo"


class _FakeMixedPrecision:
    """The two attributes of megatron-core's Float16OptimizerWithFloat16Params that the
    checkpoint uses (float16_groups / fp32_from_float16_groups) around a real torch Adam."""

    def __init__(self, model, seed):
        self.float16_groups = [[p for p in model.parameters()]]
        torch.manual_seed(seed)
        self.fp32_from_float16_groups = [[p.detach().float().clone().add_(torch.randn_like(
            p, dtype=torch.float32) * 1e-3).requires_grad_() for p in self.float16_groups[0]]]
        self.optimizer = torch.optim.Adam(self.fp32_from_float16_groups[0], lr=0.1)
        for main in self.fp32_from_float16_groups[0]:
            main.grad = torch.randn_like(main)
        self.optimizer.step()


def test_mixed_precision_state_round_trips_by_name(monkeypatch):
    model = torch.nn.Linear(4, 3).to(torch.bfloat16)
    monkeypatch.setattr(checkpointing, "global_param_names",
                        lambda m: [(n, "g." + n, p) for n, p in m.named_parameters()])
    monkeypatch.setattr(checkpointing, "unwrap", lambda m: m)
    saved = _FakeMixedPrecision(model, seed=0)
    state = checkpointing.named_optimizer_state(saved, model)
    assert set(state) == {"g.weight", "g.bias"}
    for (n, _), main in zip(model.named_parameters(), saved.fp32_from_float16_groups[0]):
        entry = state["g." + n]
        assert entry["main_param"].dtype == torch.float32 and torch.equal(entry["main_param"], main)
        assert torch.equal(entry["exp_avg"], saved.optimizer.state[main]["exp_avg"])
    fresh = _FakeMixedPrecision(model, seed=1)
    checkpointing.load_named_optimizer_state(fresh, model, state)
    for a, b in zip(saved.fp32_from_float16_groups[0], fresh.fp32_from_float16_groups[0]):
        assert torch.equal(a, b)
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(torch.as_tensor(saved.optimizer.state[a][k]),
                               torch.as_tensor(fresh.optimizer.state[b][k]))


def test_loss_scale_only_with_a_scaler():
    from megatron.training.model.mixed_precision import loss_scale_field, loss_scaler
    assert loss_scale_field(types.SimpleNamespace(grad_scaler=None)) == ""
    assert loss_scaler(types.SimpleNamespace(grad_scaler=None)) is None
    scaler = types.SimpleNamespace(scale=torch.tensor(65536.0))
    opt = types.SimpleNamespace(grad_scaler=scaler, scale_loss=lambda loss: scaler.scale * loss)
    assert loss_scale_field(opt) == " loss scale: 65536.0 |"
    assert loss_scaler(opt)(torch.tensor(2.0)) == 131072.0


def _dp_on_own_group(rank, world, corpus):
    """(1,1,2) twice: megatron DDP's own all-reduce, then the dp channel on a group of its own
    (what --dp-backend builds when it differs from the default backend; on CPU both are gloo,
    so the difference is forced)."""
    from megatron.training.runtime import transports
    from tests.conftest import tiny_gpt_argv
    from tests.training import runner
    argv = tiny_gpt_argv(corpus, **{"train-iters": 3})
    ddp = runner.train(argv, world)
    transports._differs = lambda backend: True
    own = runner.train(argv + ["--dp-backend", "gloo"], world)
    return ddp, own


def test_dp_channel_on_its_own_group_gives_the_same_losses(tiny_corpus):
    from tests.distributed import run_distributed
    ddp, own = run_distributed(_dp_on_own_group, 2, (tiny_corpus,), timeout=300)[-1]
    assert len(ddp) == 3 and own == ddp
