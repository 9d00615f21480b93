"""Surviving the cluster, each case launched with torchrun as a user would.

- a rank SIGKILLed mid-run under `torchrun --max-restarts 1`: the restarted job resumes from
  the latest checkpoint and its losses equal an uninterrupted run's, bit for bit (fp32, dropout
  on, pp=2 with the fused embedding groups, --async-save); its first launch found --load empty
- kill -9 during an async save: `latest` still names the previous checkpoint, which loads
- SIGTERM with --exit-signal-handler: checkpoint of the current iteration, exit code 0, resumes
- a rank stuck in a collective (or at start-up) is ended by --distributed-timeout-minutes
  with the collective named
"""
import json
import os
import subprocess
import sys

from tests.conftest import tiny_gpt_argv
from tests.distributed import free_port, run_distributed
from tests.training import runner

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENTRY = os.path.join(ROOT, "tests", "training", "fault_entry.py")


def _torchrun(nproc, argv, restarts=0, timeout=600, **env):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--max-restarts", str(restarts), "--master-port", str(free_port()), ENTRY] + argv
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
               **{k: str(v) for k, v in env.items()})
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _restart_argv(corpus, **extra):
    return tiny_gpt_argv(corpus, **{"pipeline-model-parallel-size": 2, "train-iters": 10,
                                    "hidden-dropout": 0.1, "attention-dropout": 0.1,
                                    "emb-comm-opt": True, **extra})


def _reference_worker(rank, world, argv):
    return runner.train(argv, world)


def test_killed_rank_restarts_and_matches_uninterrupted_run(tiny_corpus, tmp_path):
    ckpt, losses = str(tmp_path / "ckpt"), str(tmp_path / "losses")
    argv = _restart_argv(tiny_corpus, save=ckpt, load=ckpt, **{"save-interval": 4,
                                                              "async-save": True})
    run = _torchrun(2, argv, restarts=1, FAULT="kill", FAULT_RANK=1, FAULT_AT=6,
                    LOSS_FILE=losses)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-4000:]
    assert f"WARNING: --load {ckpt} holds no checkpoint" in log   # first launch: from scratch
    assert f"loaded checkpoint from {ckpt} at iteration 4" in log  # the restart resumed
    resumed = json.load(open(losses + ".1"))
    straight = run_distributed(_reference_worker, 2, (_restart_argv(tiny_corpus),),
                               timeout=600)[-1]
    assert resumed["start"] == 4 and len(straight) == 10
    assert resumed["losses"] == straight[4:], (resumed, straight)
    assert open(os.path.join(ckpt, "latest_checkpointed_iteration.txt")).read() == "10"


def test_kill_during_async_save_keeps_previous_checkpoint(tiny_corpus, tmp_path):
    from tools.checkpoint.layout import read_checkpoint
    ckpt = str(tmp_path / "ckpt")
    argv = tiny_gpt_argv(tiny_corpus, save=ckpt, **{"train-iters": 8, "save-interval": 2,
                                                    "async-save": True, "keep-last": 1})
    run = _torchrun(2, argv, FAULT="kill_in_save", FAULT_RANK=0, FAULT_AT=4)
    assert run.returncode != 0
    assert open(os.path.join(ckpt, "latest_checkpointed_iteration.txt")).read() == "2"
    assert os.path.isdir(os.path.join(ckpt, "iter_0000004.tmp"))   # the half-written save
    assert sorted(d for d in os.listdir(ckpt) if not d.endswith(".tmp")) == [
        "iter_0000002", "latest_checkpointed_iteration.txt"]
    loaded = read_checkpoint(ckpt)   # checksums verified, weights_only
    assert loaded.iteration == 2
    rerun = _torchrun(2, argv + ["--load", ckpt])
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"loaded checkpoint from {ckpt} at iteration 2" in rerun.stdout
    # --keep-last 1: only the final checkpoint is left, the stale .tmp is gone
    assert sorted(os.listdir(ckpt)) == ["iter_0000008", "latest_checkpointed_iteration.txt"]


def test_sigterm_saves_current_iteration_and_exits_zero(tiny_corpus, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    argv = tiny_gpt_argv(tiny_corpus, save=ckpt, **{"train-iters": 50, "save-interval": 20,
                                                    "exit-signal-handler": True})
    # SIGTERM reaches rank 1 only: both ranks must still stop after the same iteration
    run = _torchrun(2, argv, FAULT="sigterm", FAULT_RANK=1, FAULT_AT=3)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "SIGTERM received: saving iteration 3 and exiting" in run.stdout
    assert open(os.path.join(ckpt, "latest_checkpointed_iteration.txt")).read() == "3"
    resumed = _torchrun(2, [a if a != "50" else "5" for a in argv] + ["--load", ckpt])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"loaded checkpoint from {ckpt} at iteration 3" in resumed.stdout
    assert "iteration        5/" in resumed.stdout and "iteration        3/" not in resumed.stdout


def test_stuck_rank_is_ended_with_the_collective_named(tiny_corpus, tmp_path):
    # 0.5 min mid-run: start-up on a loaded machine must not trip it before iteration 2
    argv = tiny_gpt_argv(tiny_corpus, **{"train-iters": 6, "distributed-timeout-minutes": 0.5})
    run = _torchrun(2, argv, FAULT="hang", FAULT_RANK=1, FAULT_AT=2, FAULT_SLEEP=60)
    errors = [l for l in run.stderr.splitlines() if l.startswith("[rank 0] error:")]
    assert run.returncode != 0 and errors, run.stderr[-3000:]
    assert "collective torch.distributed." in errors[0] and "timed out" in errors[0], errors
    argv = tiny_gpt_argv(tiny_corpus, **{"train-iters": 6, "distributed-timeout-minutes": 0.05})
    startup = _torchrun(2, argv, FAULT="hang_startup", FAULT_RANK=1, FAULT_SLEEP=40)
    errors = [l for l in startup.stderr.splitlines() if l.startswith("[rank 0] error:")]
    assert startup.returncode != 0 and errors, startup.stderr[-3000:]
    assert "start-up" in errors[0] and "rank(s) [1]" in errors[0], errors
