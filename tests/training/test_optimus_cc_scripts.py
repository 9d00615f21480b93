"""Optimus-CC's own scripts against pretrain_gpt.py: every argument list parses and validates
(placeholders filled), and one CB+FE+SC script trains 3 iterations under the launcher it uses,
`python -m torch.distributed.launch` (which passes --local-rank)."""
import os
import re
import subprocess
import sys

import pytest
import torch

from megatron.cc.data_parallel.allreduce import AllReduce
from megatron.training.flags.arguments import parse_args
from megatron.training.schedules.batch_rampup import BatchRampup
from tests.distributed import free_port
from tests.training.optimus_cc_scripts import ALL_SCRIPTS, fill, override

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _values(corpus, tmp):
    return dict(data=corpus["prefix"], vocab=corpus["vocab"], merges=corpus["merges"],
                ckpt=str(tmp / "ckpt"), tb=str(tmp / "tb"), name="exp")


def _flag(argv, name, default=1):
    return int(argv[argv.index(name) + 1]) if name in argv else default


@pytest.mark.parametrize("script", sorted(ALL_SCRIPTS))
def test_script_parses_and_validates(script, tiny_corpus, tmp_path, monkeypatch):
    argv = fill(ALL_SCRIPTS[script], **_values(tiny_corpus, tmp_path))
    tp = _flag(argv, "--tensor-model-parallel-size")
    pp = _flag(argv, "--pipeline-model-parallel-size")
    # validated as on the scripts' GPU nodes (--fp16 needs CUDA), at data-parallel size 2
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    args = parse_args(argv, world_size=tp * pp * 2)
    gran, method, layers = args.recompute.resolved()
    assert (gran, method, layers) == ("full", "uniform", 1)   # v2.5 activation checkpointing
    assert args.compat.data_impl == "mmap" and args.compat.DDP_impl == "local"
    c = args.compression
    if "--selective_grad_comp_way" in argv:
        # the seed compresses stage s if s < way: way 3 at pp=2 compresses both stages
        assert c.of(AllReduce).compressed_stages(pp) == min(3, pp)
    if "--no-masked-softmax-fusion" in argv:
        assert args.compat.no_masked_softmax_fusion
    if "--experiment_name" in argv:
        assert args.logging.experiment_name == argv[argv.index("--experiment_name") + 1]


def _megatron_train_iters(train_samples, gbs, start, incr, ramp_samples):
    """Megatron-LM's update_train_iters + RampupBatchsizeNumMicroBatches, transcribed."""
    per_increment = ramp_samples / ((gbs - start) // incr)
    iterations = consumed = 0
    while consumed <= ramp_samples:
        consumed += start + int(consumed / per_increment) * incr
        iterations += 1
    return iterations + (train_samples - consumed) // gbs


def test_175b_example_is_sample_based_with_rampup(tiny_corpus, tmp_path, monkeypatch):
    argv = fill(ALL_SCRIPTS["examples/pretrain_gpt3_175B.sh"], **_values(tiny_corpus, tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    args = parse_args(argv, world_size=8 * 16 * 2)
    assert args.training.train_iters == _megatron_train_iters(146484375, 1536, 16, 16, 5859375)
    ramp = BatchRampup.from_args(args)
    assert ramp.batch_size(0) == 16 and ramp.batch_size(5859375) == 1536
    tenth = -(-5859375 * 10 // 95)                   # 95 equal increments: the 10th starts here
    assert ramp.batch_size(tenth) == 16 + 10 * 16 and ramp.batch_size(tenth - 1) == 16 + 9 * 16


def test_rampup_trains_with_growing_batches(tiny_corpus, tmp_path):
    """4 iterations at 1 process: batches 2, 2, 4, 4 (ramp over 4 samples), LR by samples."""
    from tests.conftest import tiny_gpt_argv
    from tests.distributed import run_distributed
    argv = tiny_gpt_argv(tiny_corpus, **{"train-iters": None, "global-batch-size": 4,
                                         "train-samples": 12, "rampup-batch-size": "2 2 4",
                                         "lr-warmup-samples": 4, "lr-decay-style": "linear"})
    argv = " ".join(argv).split()
    out = run_distributed(_ramp_job, 1, (argv,), timeout=300)[0]
    assert out["batches"] == [2, 2, 4, 4] and out["iters"] == 4
    # LR after each step: warm-up over 4 samples, then linear decay over 12 samples
    lr = 1e-3
    expect = [lr * 2 / 4, lr, lr * (12 - 8) / 8, lr * (12 - 12) / 8]
    assert out["lrs"] == pytest.approx(expect, rel=1e-6)


def _ramp_job(rank, world, argv):
    from megatron.training.runtime.initialize import initialize_distributed
    from megatron.training.loop.training import Trainer
    from megatron.core import parallel_state as ps
    args = parse_args(argv, world_size=world)
    initialize_distributed(args)
    t = Trainer(args)
    batches, lrs = [], []
    while t.iteration < args.training.train_iters:
        t.train_step()
        batches.append(t.batches.global_batch_size)
        lrs.append(t.optimizer.param_groups[0]["lr"])
    ps.destroy_model_parallel()
    return {"batches": batches, "lrs": lrs, "iters": args.training.train_iters}


def test_cb_fe_sc_script_runs_under_torch_distributed_launch(tiny_corpus, tmp_path):
    """functionality_check/GPT2-335M-CB-FE-SC-Breakdown.sh with small values: TP1 x PP2 x DP2
    on 4 processes, 2 layers of width 32, 3 iterations. Its `--load` of the same fresh
    directory is left out (auto-resume from an empty --load is a separate feature)."""
    script = "functionality_check/GPT2-335M-CB-FE-SC-Breakdown.sh"
    argv = fill(ALL_SCRIPTS[script], **_values(tiny_corpus, tmp_path))
    argv = override(argv, num_layers=2, hidden_size=32, num_attention_heads=4,
                    micro_batch_size=1, global_batch_size=4, seq_length=32,
                    max_position_embeddings=32, train_iters=3, eval_iters=1,
                    tensor_model_parallel_size=1, pipeline_model_parallel_size=2,
                    distributed_backend="gloo", inter_grad_comp_rank=4, grad_comp_rank=4,
                    split="90,10,0")
    i = argv.index("--load")
    del argv[i:i + 2]
    argv += ["--check_comp_ratio"]
    cmd = [sys.executable, "-m", "torch.distributed.launch", "--nproc_per_node", "4",
           "--nnodes", "1", "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           "--node_rank", "0", os.path.join(ROOT, "pretrain_gpt.py")] + argv
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    losses = [float(x) for x in re.findall(r"lm loss: ([0-9.E+-]+)", out)]
    assert len(losses) == 3, out[-3000:]
    print("\nlosses:", losses, "\n" + re.search(r" compression summary.*?(?=\n [a-z]|\Z)",
                                                 out, re.S).group(0))
    # way 3 > pp 2: both stages compressed their dp gradients (Optimus-CC semantics)
    assert "every stage compresses" in out
    summary = re.search(r"compression summary over 3 iterations.*", out, re.S).group(0)
    ratios = dict(re.findall(r"(pp-bwd|dp|emb)\s+sent.*?ratio x([0-9.]+)", summary))
    assert float(ratios["dp"]) > 1.0 and float(ratios["emb"]) == pytest.approx(2.0, rel=0.01)
    # --experiment_name names the run directory: log lines and TensorBoard events
    run_dir = tmp_path / "runs" / "GPT2-335M-CB-FE-SC-Breakdown"
    log = (run_dir / "log.txt").read_text()
    assert log.count("lm loss:") == 3 and "compression summary" in log
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(run_dir))
    assert os.path.isdir(tmp_path / "ckpt")
