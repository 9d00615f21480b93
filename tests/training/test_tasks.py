"""--task-name: weighted jsonl files / prefixes, tokenised on the fly into .bin/.idx."""
import os
import shutil

import pytest

from megatron.training.flags.arguments import parse_args
from megatron.training.config.config_flags import ConfigError
from megatron.training.data.tasks import parse_task_name, resolve_task_name
from tests.conftest import tiny_gpt_argv


def test_parse_weights_and_errors(tiny_corpus, tmp_path):
    j = tiny_corpus["jsonl"]
    assert parse_task_name(f"{j}:0.5,{tiny_corpus['prefix']}") == [(j, 0.5),
                                                                    (tiny_corpus["prefix"], 1.0)]
    with pytest.raises(ConfigError, match="does not exist"):
        parse_task_name(str(tmp_path / "missing.jsonl"))
    with pytest.raises(ConfigError, match="must be > 0"):
        parse_task_name(f"{j}:0")
    with pytest.raises(ConfigError, match="neither a .jsonl"):
        parse_task_name(str(tmp_path / "nothing_here"))
    argv = tiny_gpt_argv(tiny_corpus, **{"task-name": j})
    with pytest.raises(ConfigError, match="--task-name and --data-path"):
        parse_args(argv, world_size=1)


def test_jsonl_is_tokenised_on_the_fly(tiny_corpus, tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from megatron.training.data.tokenizer import build_tokenizer
    tok = build_tokenizer("GPT2BPETokenizer", tiny_corpus["vocab"], tiny_corpus["merges"], None)
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    shutil.copy(tiny_corpus["jsonl"], a)
    b.write_text('{"text": "def f(x):\\n    return x + 1\\n"}\n')
    blend = resolve_task_name(f"{a}:0.5,{b}:1.5", tok)
    assert [float(w) for w in blend[0::2]] == [0.25, 0.75]
    for prefix in blend[1::2]:
        assert os.path.isfile(prefix + ".bin") and os.path.isfile(prefix + ".idx")
    ds = IndexedDataset(blend[3])
    assert ds[0].tolist() == tok.tokenize("def f(x):\n    return x + 1\n") + [tok.eod]
    # the original .bin of the same jsonl (conftest) holds the same tokens
    ours, theirs = IndexedDataset(blend[1]), IndexedDataset(tiny_corpus["prefix"])  # kept alive:
    assert ours[0].tolist() == theirs[0].tolist()   # items are views of their memory maps
    mtime = os.path.getmtime(blend[1] + ".idx")
    assert resolve_task_name(f"{a}:0.5,{b}:1.5", tok) == blend     # cached: not rebuilt
    assert os.path.getmtime(blend[1] + ".idx") == mtime
