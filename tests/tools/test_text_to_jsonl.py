"""tools/text_to_jsonl.py: raw text -> one JSON document per paragraph, article or line."""
import json
import subprocess
import sys

import pytest

from tools import text_to_jsonl

WIKI = (" = Alpha = \n\n Alpha is a letter @-@ like sign .\n\n = = History = = \n\n"
        " It is 1 @,@ 000 years old .\n\n = Beta = \n\n Beta follows .\n")


def _run(tmp_path, *flags, text=WIKI):
    src, out = tmp_path / "in.txt", tmp_path / "out.jsonl"
    src.write_text(text)
    code = text_to_jsonl.main([str(src), "--output", str(out), *flags])
    return code, [json.loads(l)["text"] for l in out.read_text().splitlines()]


def test_heading_split_keeps_articles_whole(tmp_path):
    code, docs = _run(tmp_path, "--split", "heading", "--wikitext-detokenize")
    assert code == 0
    assert docs == [" = Alpha = \n\n Alpha is a letter-like sign .\n\n = = History = = \n\n"
                    " It is 1,000 years old .", " = Beta = \n\n Beta follows ."]


@pytest.mark.parametrize("split,n", [("paragraph", 6), ("line", 6)])
def test_paragraph_and_line_splits(tmp_path, split, n):
    code, docs = _run(tmp_path, "--split", split)
    assert code == 0 and len(docs) == n and docs[1] == " Alpha is a letter @-@ like sign ."
    _, docs = _run(tmp_path, "--split", split, "--min-chars", "20")
    assert all(len(d) >= 20 for d in docs) and len(docs) == 2


def test_paragraphs_span_lines_and_empty_input_fails(tmp_path):
    _, docs = _run(tmp_path, text="one\ntwo\n\n\nthree\n")
    assert docs == ["one\ntwo", "three"]
    code, docs = _run(tmp_path, text="\n \n")
    assert code == 1 and docs == []


def test_help_explains_flags():
    out = subprocess.run([sys.executable, "tools/text_to_jsonl.py", "--help"],
                         capture_output=True, text=True, check=True).stdout
    for flag in ("--split", "--min-chars", "--wikitext-detokenize", "--output"):
        assert flag in out
