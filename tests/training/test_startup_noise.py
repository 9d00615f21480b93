"""A run's start-up prints what the user needs and nothing else: no library warnings before
(or after) the first iteration line, on the demo's channels (tp 2 x pp 2, every channel
compressed), as the user launches it: pretrain_gpt.py under torchrun, warnings not filtered.
"""
import os
import subprocess
import sys

from tests.conftest import tiny_gpt_argv
from tests.distributed import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO_CHANNELS = ["--forward-compress-method", "fixpoint", "--forward-bits", "8",
                 "--inter-grad-comp", "--inter-grad-comp-rank", "4", "--use-error-feedback",
                 "--emb-comm-opt", "--comp-seed", "1234"]


def test_nothing_but_the_run_before_the_first_iteration(tiny_corpus):
    argv = tiny_gpt_argv(tiny_corpus, **{"tensor-model-parallel-size": 2,
                                         "pipeline-model-parallel-size": 2,
                                         "train-iters": 2}) + DEMO_CHANNELS
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4",
           "--master-port", str(free_port()), os.path.join(ROOT, "pretrain_gpt.py")] + argv
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    env["OMP_NUM_THREADS"] = "1"
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = (r.stderr + r.stdout).splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("iteration"))
    before = lines[:first]
    assert not [ln for ln in lines if "Warning" in ln or "warnings.warn" in ln], "\n".join(lines)
    assert len(before) <= 2, "\n".join(before)
