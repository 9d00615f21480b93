"""--optimizer muon: Muon on the hidden matrices, AdamW on the rest, inside the trainer.

The oracle of the Muon half is torch.optim.Muon run by hand on a copy of each matrix with the
same gradient and the lr the schedule set; the Adam half is megatron-core's own. Resume is bit
exact (through a reshard too), an Adam run given a Muon checkpoint is refused by name, and the
slices Muon cannot orthogonalise (tp > 1, the distributed optimizer) are refused at parse time.
"""
import pytest
import torch

from megatron.cc.common.config_fields import ConfigError
from megatron.training.flags.arguments import parse_args
from megatron.training.loop.muon import is_muon_param
from tests.conftest import tiny_gpt_argv
from tests.distributed import run_distributed
from tests.training import runner
from tools.checkpoint.reshard import main as reshard_main

MUON = {"optimizer": "muon", "weight-decay": 0.1, "clip-grad": 0.0}


def _one_step_against_torch(trainer):
    """Take one more step by hand: the trainer's optimizer and torch.optim.Muon on copies must
    move every hidden matrix the same way; returns (matrix names, other names, max error)."""
    from megatron.core import parallel_state as ps
    model = trainer.model
    params = [(n, p) for n, p in model.named_parameters()]
    muon = [(n, p) for n, p in params if is_muon_param(n, p)]
    lr = trainer.optimizer.param_groups[0]["lr"]
    torch.manual_seed(7 + ps.get_pipeline_model_parallel_rank())
    grads = {n: torch.randn_like(p) for n, p in params}
    copies = {n: torch.nn.Parameter(p.detach().clone()) for n, p in muon}
    kinds = {type(o.optimizer).__name__ for o in trainer.optimizer.chained_optimizers}
    states = [o.optimizer.state for o in trainer.optimizer.chained_optimizers
              if type(o.optimizer).__name__ == "Muon"][0]
    by_param = {id(p): n for n, p in muon}
    ref = torch.optim.Muon(list(copies.values()), lr=lr, weight_decay=0.1, momentum=0.95,
                           nesterov=True, adjust_lr_fn="match_rms_adamw")
    for p, st in states.items():   # the same momentum the trainer has built up
        n = by_param[id(p)]
        ref.state[copies[n]] = {"momentum_buffer": st["momentum_buffer"].clone()}
    for n, p in params:
        p.main_grad.copy_(grads[n])
    for n, c in copies.items():
        c.grad = grads[n].clone()
    trainer.optimizer.step()
    ref.step()
    err = max(float((p.detach() - copies[n].detach()).abs().max()) for n, p in muon)
    return kinds, sorted(n for n, _ in muon), sorted(n for n, p in params
                                                      if not is_muon_param(n, p)), err


def _worker(rank, world, corpus, ckpt):
    common = {"pipeline-model-parallel-size": 2, "train-iters": 8, **MUON}
    kinds, matrices, others, err = runner._run(
        tiny_gpt_argv(corpus, **{**common, "train-iters": 3}), world,
        after_train=_one_step_against_torch)[1]
    straight = runner.train(tiny_gpt_argv(corpus, **common), world)
    first = runner.train(tiny_gpt_argv(corpus, **common, save=ckpt, **{"exit-interval": 4}),
                         world)
    # through tools/checkpoint/reshard.py (each rank its own copy): the Muon state and its
    # record of which optimizer it belongs to must survive the merge and split
    from megatron.core import parallel_state as ps
    torch.distributed.barrier()   # every stage's shard written
    copy = f"{ckpt}-resharded-{rank}"
    assert reshard_main(["--load", ckpt, "--save", copy, "--target-tensor-parallel-size", "1",
                         "--target-pipeline-model-parallel-size", "2", "--no-progress"]) == 0
    resumed = runner.train(tiny_gpt_argv(corpus, **common, load=copy), world)
    try:
        runner.train(tiny_gpt_argv(corpus, **{"pipeline-model-parallel-size": 2,
                                              "train-iters": 8, "load": copy}), world)
        refused = ""
    except ValueError as e:
        refused = str(e)
        ps.destroy_model_parallel()
        runner.destroy_subgroups()
    return kinds, matrices, others, err, straight, first, resumed, refused


def test_muon_matches_torch_and_resumes(tiny_corpus, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    out = run_distributed(_worker, 4, (tiny_corpus, ckpt), timeout=600)
    kinds, matrices, others, err, straight, first, resumed, refused = out[-1]
    assert kinds == {"Muon", "AdamW"}
    assert matrices and all(m.endswith("weight") for m in matrices)
    assert any("linear_fc1" in m for m in matrices) and any("linear_qkv" in m for m in matrices)
    assert any("layernorm" in n or "norm" in n for n in others)
    assert not any("embedding" in m or "output_layer" in m for m in matrices)
    assert any("output_layer" in n or "embedding" in n for n in others + out[0][2])
    assert err < 1e-6, err
    assert straight[-1] < straight[0] - 0.05, straight
    assert first == straight[:4] and resumed == straight[4:], (first, resumed, straight)
    assert "--no-load-optim" in refused and "muon" in refused and "adam" in refused, refused


@pytest.mark.parametrize("flags,names", [
    (["--tensor-model-parallel-size", "2"], "--tensor-model-parallel-size"),
    (["--use-distributed-optimizer"], "--use-distributed-optimizer"),
])
def test_muon_refuses_slices(tiny_corpus, flags, names):
    with pytest.raises(ConfigError, match=names):
        parse_args(tiny_gpt_argv(tiny_corpus, optimizer="muon") + flags, world_size=2)


def test_muon_flags_parse(tiny_corpus):
    args = parse_args(tiny_gpt_argv(tiny_corpus, optimizer="muon", **{
        "muon-momentum": 0.9, "muon-num-ns-steps": 3, "muon-scale-mode": "spectral"}),
        world_size=1)
    t = args.training
    assert (t.optimizer, t.muon_momentum, t.muon_num_ns_steps, t.muon_scale_mode) == \
        ("muon", 0.9, 3, "spectral")
    with pytest.raises(ConfigError, match="--dp-adam-correction"):
        parse_args(tiny_gpt_argv(tiny_corpus, optimizer="muon") + [
            "--dp-mode", "diloco", "--dp-adam-correction"], world_size=2)


def test_muon_needs_a_torch_that_has_it(monkeypatch):
    from megatron.training.loop.muon import build_muon_optimizer
    monkeypatch.delattr(torch.optim, "Muon")
    with pytest.raises(ConfigError, match=r"torch >= 2.9.*--optimizer adam"):
        build_muon_optimizer(None, None)
