"""tools/preprocess_data.py: exact tokens in .bin/.idx, bad-line accounting, workers, CLI."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from megatron.training.data.tokenizer import build_tokenizer
from tests.training.test_tokenizer import write_tiny_gpt2_tokenizer
from tools.preprocess_data import PreprocessError, main, preprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "tools", "preprocess_data.py")

# 1-based line numbers of the bad lines written by make_jsonl.
BAD_LINES = {"json": [3, 20], "key": [7], "type": [11], "object": [13], "utf8": [17]}


def make_jsonl(path, n=40):
    """n lines: good documents, a blank line, and one of each kind of bad line (BAD_LINES)."""
    bad = {ln: r for r, lines in BAD_LINES.items() for ln in lines}
    texts = []
    with open(path, "wb") as f:
        for lineno in range(1, n + 1):
            reason = bad.get(lineno)
            if reason == "json":
                f.write(b'{"text": "unterminated\n')
            elif reason == "key":
                f.write(b'{"body": "no text key"}\n')
            elif reason == "type":
                f.write(b'{"text": 42}\n')
            elif reason == "object":
                f.write(b'["a", "list"]\n')
            elif reason == "utf8":
                f.write(b'{"text": "\xff\xfe"}\n')
            elif lineno == 5:
                f.write(b"   \n")
            else:
                text = f"document {lineno}: the cat sat on the mat " * (1 + lineno % 5) + "déjà vu\n\nend"
                texts.append(text)
                f.write((json.dumps({"text": text, "title": f"title {lineno}", "url": "x"}) + "\n").encode())
    return texts


@pytest.fixture(scope="module")
def tok_files(tmp_path_factory):
    return write_tiny_gpt2_tokenizer(str(tmp_path_factory.mktemp("tok")))


@pytest.fixture(scope="module")
def tokenizer(tok_files):
    return build_tokenizer("GPT2BPETokenizer", vocab_file=tok_files[0], merge_file=tok_files[1])


def read_docs(prefix):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(prefix)
    return ds, [ds[i].tolist() for i in range(len(ds))]


def test_tokens_and_bad_line_report(tmp_path, tokenizer):
    texts = make_jsonl(tmp_path / "in.jsonl")
    stats = preprocess(str(tmp_path / "in.jsonl"), str(tmp_path / "out" / "ds"), tokenizer, append_eod=True)

    assert stats.documents == len(texts) == 40 - 1 - 6
    assert stats.blank_lines == 1 and stats.lines == 40
    assert {r: n for r, n in stats.bad.items()} == {r: len(v) for r, v in BAD_LINES.items()}
    assert stats.bad_examples == BAD_LINES
    report = stats.report()
    assert "skipped 6 bad lines" in report and "2 malformed JSON (lines 3, 20)" in report
    assert "1 missing key 'text' (line 7)" in report

    prefix = str(tmp_path / "out" / "ds_text_document")
    assert stats.outputs == {"text": prefix}
    ds, docs = read_docs(prefix)
    assert ds.index.dtype == np.uint16  # vocab < 65500
    assert docs == [tokenizer.tokenize(t) + [tokenizer.eod] for t in texts]
    assert stats.tokens["text"] == sum(map(len, docs))
    assert list(ds.document_indices) == list(range(len(texts) + 1))
    assert sorted(os.listdir(tmp_path / "out")) == ["ds_text_document.bin", "ds_text_document.idx"]


def test_multiple_keys_and_no_eod(tmp_path, tokenizer):
    make_jsonl(tmp_path / "in.jsonl")
    stats = preprocess(str(tmp_path / "in.jsonl"), str(tmp_path / "ds"), tokenizer,
                       json_keys=("text", "title"), append_eod=False)
    _, text_docs = read_docs(str(tmp_path / "ds_text_document"))
    _, title_docs = read_docs(str(tmp_path / "ds_title_document"))
    assert len(text_docs) == len(title_docs) == stats.documents
    assert tokenizer.detokenize(title_docs[0]) == "title 1"
    assert all(tokenizer.eod not in d for d in text_docs)


def test_all_bad_lines_fail_and_leave_nothing(tmp_path, tokenizer, tok_files, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"{oops\n\n" + b'{"other": "x"}\n' + b"[1]\n")
    with pytest.raises(PreprocessError, match="all 3 non-blank lines are bad"):
        preprocess(str(path), str(tmp_path / "out"), tokenizer)
    code = main(["--input", str(path), "--output-prefix", str(tmp_path / "out"),
                 "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", tok_files[0],
                 "--merge-file", tok_files[1]])
    err = capsys.readouterr().err
    assert code == 1
    assert "produced no documents" in err and "1 malformed JSON (line 1)" in err
    assert sorted(os.listdir(tmp_path)) == ["bad.jsonl"]  # no .bin/.idx, no temp files


def test_missing_vocab_file_is_a_clear_error(tmp_path, capsys):
    make_jsonl(tmp_path / "in.jsonl", n=3)
    missing = str(tmp_path / "vocab.json")
    code = main(["--input", str(tmp_path / "in.jsonl"), "--output-prefix", str(tmp_path / "o"),
                 "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", missing,
                 "--merge-file", missing])
    assert code == 2
    assert f"--vocab-file {missing} does not exist" in capsys.readouterr().err


def test_help_explains_every_flag(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--input", "--output-prefix", "--json-keys", "--tokenizer-type", "--vocab-file",
                 "--merge-file", "--tokenizer-model", "--append-eod", "--workers", "--log-interval"):
        assert flag in out


def test_cli_workers_2_matches_workers_1(tmp_path, tok_files):
    """The script as users run it (subprocess, spawn pool) writes the same bytes as one process."""
    make_jsonl(tmp_path / "in.jsonl", n=300)
    common = ["--input", str(tmp_path / "in.jsonl"), "--tokenizer-type", "GPT2BPETokenizer",
              "--vocab-file", tok_files[0], "--merge-file", tok_files[1], "--append-eod",
              "--chunk-size", "16"]
    assert main(common + ["--output-prefix", str(tmp_path / "w1"), "--workers", "1"]) == 0
    run = subprocess.run([sys.executable, SCRIPT, *common, "--output-prefix", str(tmp_path / "w2"),
                          "--workers", "2", "--log-interval", "50"],
                         capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert run.returncode == 0, run.stderr
    assert "malformed JSON (lines 3, 20)" in run.stdout
    assert "processed 250 documents" in run.stderr  # --log-interval lines when not on a terminal
    for ext in (".bin", ".idx"):
        one = (tmp_path / f"w1_text_document{ext}").read_bytes()
        two = (tmp_path / f"w2_text_document{ext}").read_bytes()
        assert one == two
