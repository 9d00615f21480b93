"""megatron-core's six "Transformer Engine / Apex not installed" warnings stay out of every start."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _stderr(*argv) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stderr


@pytest.mark.parametrize("argv", [
    ["pretrain_gpt.py", "--help"],
    ["tools/checkpoint/export_hf.py", "--help"],   # imports megatron.core at start
], ids=["pretrain_gpt", "export_hf"])
def test_no_transformer_engine_or_apex_warnings(argv):
    err = _stderr(*argv)
    assert "Transformer Engine" not in err and "Apex" not in err, err


def test_only_those_messages_from_megatron_core_are_filtered():
    import warnings
    from megatron.training.runtime.fallback_warnings import silence_fallback_warnings
    apex = "Apex is not installed. Falling back to Torch Norm"
    te = "Transformer Engine and Apex are not installed. Falling back to Torch optimizers."
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        silence_fallback_warnings()
        for text, module in ((te, "megatron.core.optimizer"), (apex, "megatron.core.models.backends"),
                             ("something else", "megatron.core.optimizer"),
                             (apex, "somewhere.else")):
            warnings.warn_explicit(text, UserWarning, "x.py", 1, module=module)
    assert [str(w.message) for w in seen] == ["something else", apex]


def test_fallback_note_is_one_line_without_either():
    from megatron.training.runtime.fallback_warnings import fallback_note
    import importlib.util
    absent = all(importlib.util.find_spec(m) is None for m in ("transformer_engine", "apex"))
    note = fallback_note()
    assert (note is not None) == absent
    if note:
        assert "\n" not in note and "Transformer Engine and Apex" in note
