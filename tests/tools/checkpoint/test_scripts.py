"""Every tool: a docstring, a main(), --help that explains each flag, runnable as a script."""
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPTS = ["reshard", "export_hf", "import_hf", "eval_lm", "val_ppl"]


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_flag_has_help(name):
    mod = importlib.import_module(f"tools.checkpoint.{name}")
    assert mod.__doc__ and len(mod.__doc__) > 300 and callable(mod.main)
    for action in mod.build_parser()._actions:
        assert action.help and len(action.help) > 10, f"{name}: {action.option_strings}"


def test_help_runs_as_a_script_from_the_repo_root():
    # Every script bootstraps sys.path the same way; two of them (one importing megatron-core,
    # one not) show it works without paying a torch start-up per script.
    procs = {n: subprocess.Popen([sys.executable, f"tools/checkpoint/{n}.py", "--help"],
                                 cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True) for n in ("reshard", "eval_lm")}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, f"{name}: {err[-2000:]}"
        assert out.startswith("usage:"), name
