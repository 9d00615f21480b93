"""eval_lm.py offline: the shipped tasks (tools/checkpoint/eval_tasks/) run with no hub, the
README's task templates run without an lm-eval warning, and every failure is one
`eval_lm.py: error:` line with exit status 2 (run as a script, stderr read whole)."""
import json
import logging
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools.checkpoint.conftest import write_vocab1000_tokenizer

REPO = Path(__file__).resolve().parents[3]
SCRIPT = str(REPO / "tools" / "checkpoint" / "eval_lm.py")
SHIPPED = ("heldout_continuation", "heldout_perplexity")
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A random GPT-2 (2 layers, 512 positions: the tasks' passages fit) with a tokenizer."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    from megatron.training.data.tokenizer import build_tokenizer
    root = tmp_path_factory.mktemp("eval_offline")
    tok = build_tokenizer("GPT2BPETokenizer", *write_vocab1000_tokenizer(str(root / "tok")))
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=tok.vocab_size, n_positions=512, n_embd=32,
                                       n_layer=2, n_head=4, bos_token_id=tok.eod,
                                       eos_token_id=tok.eod))
    path = str(root / "model")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _run(argv, cwd, env_extra=None, timeout=600):
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env_extra or {}))
    return subprocess.run([sys.executable, SCRIPT] + argv, cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_shipped_tasks_run_offline_from_any_directory(tiny_model, tmp_path):
    out_json = str(tmp_path / "results.json")
    r = _run(["--model", tiny_model, "--tasks", ",".join(SHIPPED), "--offline", "--limit", "8",
              "--batch-size", "4", "--device", "cpu", "--output-path", out_json],
             cwd=str(tmp_path), env_extra=OFFLINE)   # not the repository root
    assert r.returncode == 0, r.stderr[-3000:]
    print("\n" + r.stdout)
    for name in SHIPPED:
        assert re.search(rf"^\|{name}\s*\|", r.stdout, re.M), r.stdout
    results = json.load(open(out_json))["results"]
    mc, ppl = results["heldout_continuation"], results["heldout_perplexity"]
    values = [mc["acc,none"], mc["acc_norm,none"], ppl["word_perplexity,none"],
              ppl["byte_perplexity,none"], ppl["bits_per_byte,none"]]
    assert all(math.isfinite(v) for v in values), results
    assert 0.0 <= mc["acc,none"] <= 1.0 and ppl["byte_perplexity,none"] > 1.0


def test_shipped_data_is_what_the_tasks_read():
    """Four choices with the answer among them; passages of the documented sizes."""
    d = REPO / "tools" / "checkpoint" / "eval_tasks"
    mc = [json.loads(x) for x in open(d / "heldout_continuation.jsonl")]
    text = [json.loads(x) for x in open(d / "heldout_text.jsonl")]
    assert len(mc) == 200 and len(text) == 50
    for row in mc:
        assert len(row["choices"]) == 4 == len(set(row["choices"]))
        assert 0 <= row["label"] < 4 and row["context"].strip()
        assert row["source"].startswith(("tools/", "tests/", "bench/"))
    assert all(500 <= len(row["text"]) <= 1500 for row in text)
    size = sum(os.path.getsize(d / f) for f in ("heldout_continuation.jsonl",
                                                 "heldout_text.jsonl"))
    assert size < 200_000


def _readme_templates(tmp_path):
    """tools/checkpoint/README.md's task YAMLs, their data_files pointed at small local files."""
    readme = (REPO / "tools" / "checkpoint" / "README.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", readme, re.S)
    assert len(blocks) == 2, "the README's multiple-choice and perplexity templates"
    src = REPO / "tools" / "checkpoint" / "eval_tasks"
    mc = [json.loads(x) for x in open(src / "heldout_continuation.jsonl")][:8]
    data = {"my_mc": [{"question": r["context"], "choices": r["choices"], "label": r["label"]}
                      for r in mc],
            "my_ppl": [{"text": json.loads(x)["text"]}
                       for x in open(src / "heldout_text.jsonl")][:4]}
    tasks = tmp_path / "my_tasks"
    tasks.mkdir()
    names = []
    for block in blocks:
        name = re.search(r"^task: (\S+)", block, re.M)[1]
        rows = tmp_path / f"{name}.jsonl"
        rows.write_text("".join(json.dumps(r) + "\n" for r in data[name]))
        block = re.sub(r"data_files: \{test: [^}]+\}", f"data_files: {{test: {rows}}}", block)
        (tasks / f"{name}.yaml").write_text(block)
        names.append(name)
    return str(tasks), names


def test_readme_task_templates_run_without_lm_eval_warnings(tiny_model, tmp_path, caplog,
                                                            capsys, monkeypatch):
    from tools.checkpoint.eval_lm import main
    for k, v in OFFLINE.items():
        monkeypatch.setenv(k, v)
    tasks, names = _readme_templates(tmp_path)
    with caplog.at_level(logging.WARNING):
        assert main(["--model", tiny_model, "--include-path", tasks, "--only-include-path",
                     "--tasks", ",".join(names), "--offline", "--device", "cpu",
                     "--batch-size", "4"]) == 0
    printed = capsys.readouterr().out
    assert all(n in printed for n in names), printed
    warnings = [f"{r.name}: {r.getMessage()}" for r in caplog.records
                if r.levelno >= logging.WARNING and r.name.startswith("lm_eval")]
    assert not warnings, warnings


@pytest.fixture(scope="module")
def no_lm_eval(tmp_path_factory):
    """A PYTHONPATH entry that makes `import lm_eval` fail as if it were not installed."""
    d = tmp_path_factory.mktemp("no_lm_eval")
    (d / "lm_eval").mkdir()
    (d / "lm_eval" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'lm_eval'\", name='lm_eval')\n")
    return str(d)


@pytest.mark.parametrize("case,argv,fragment", [
    ("no model flag", ["--tasks", "heldout_continuation"],
     "one of the arguments --model --load is required"),
    ("missing model dir", ["--model", "{tmp}/nope", "--tasks", "heldout_continuation"],
     "--model {tmp}/nope: no such directory"),
    ("not a model dir", ["--model", "{tmp}", "--tasks", "heldout_continuation"],
     "no config.json"),
    ("missing checkpoint", ["--load", "{tmp}/nope", "--tasks", "heldout_continuation"],
     "--load {tmp}/nope: no such directory"),
    ("unknown task", ["--model", "{model}", "--tasks", "heldout_continuation,no_such_task_xyz",
                      "--only-include-path"],
     "unknown task(s) no_such_task_xyz"),
    ("hub task offline", ["--model", "{model}", "--tasks", "lambada_openai", "--offline"],
     "--tasks lambada_openai: its data is on the Hugging Face hub and offline mode is on"),
    ("bad batch size", ["--model", "{model}", "--tasks", "heldout_continuation",
                        "--batch-size", "x"], "--batch-size x"),
    ("missing include path", ["--model", "{model}", "--tasks", "heldout_continuation",
                              "--include-path", "{tmp}/nope"], "no such directory"),
    ("lm-eval missing", ["--model", "{model}", "--tasks", "heldout_continuation"],
     "lm-eval is not installed"),
])
def test_every_failure_is_one_error_line(tiny_model, no_lm_eval, tmp_path, case, argv,
                                         fragment):
    fill = {"tmp": str(tmp_path), "model": tiny_model}
    argv = [a.format(**fill) for a in argv]
    # an empty datasets cache: a hub task is not there by chance
    env = dict(OFFLINE, HF_HOME=str(tmp_path / "hf_home"))
    if case == "lm-eval missing":
        env["PYTHONPATH"] = os.pathsep.join([no_lm_eval, str(REPO)])
    r = _run(argv, cwd=str(REPO), env_extra=env)
    lines = r.stderr.splitlines()
    print(f"\n{case}: {r.stderr.strip()}")
    assert r.returncode == 2, r.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("eval_lm.py: error: "), r.stderr[-3000:]
    assert fragment.format(**fill) in lines[0]
    if case == "hub task offline":
        assert all(t in lines[0] for t in SHIPPED)   # the hint names the offline tasks
    assert r.stdout == ""
