"""What the interpreter cannot show, checked on the CPU in fresh processes:
- every kernel compiles for an H100 (sm_90) and its PTX has no instruction that rounds
  differently from the eager reference (FMA contraction, approximate division / sqrt);
- without triton the package imports and the codecs run eagerly.
"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


def run(args, **env):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | env
    out = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_kernels_compile_for_sm90_without_inexact_instructions():
    pytest.importorskip("triton")
    report = json.loads(run(["-m", "tests.cc.kernels.aot_compile"]).strip().splitlines()[-1])
    from tests.cc.kernels.aot_compile import SPECS
    assert set(report) == set(SPECS)
    bad = {name: [k for k, v in flags.items() if v] for name, flags in report.items()}
    assert not any(bad.values()), bad


def test_codecs_run_eagerly_without_triton():
    code = """
import sys
sys.modules["triton"] = None          # import triton -> ImportError
import torch
from megatron.cc.codecs import get_codec
from megatron.cc.kernels import dispatch
assert not dispatch.available()
c = get_codec("fixpoint", bits=4)
x = torch.randn(6, 2, 16)
y = c.decode(c.encode(x), x.shape, torch.float32)
assert y.shape == x.shape
print("ok")
"""
    assert run(["-c", code]).strip().endswith("ok")
