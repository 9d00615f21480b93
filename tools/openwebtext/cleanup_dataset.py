"""Repair text with ftfy, keep English documents, drop short ones.

For each loose-JSON document: fix mojibake and broken Unicode with ftfy; detect the
language with langdetect (seeded, so runs repeat) and drop it unless it is --lang; drop
it if it has fewer than --min-tokens tokens. Tokens are counted with the GPT-2-format
BPE given by --vocab-file/--merge-file (GPT-2's own files or this project's tokenizer
saved in that format); without them, whitespace-separated words are counted instead,
which is roughly 0.75x the GPT-2 token count of English text.

    python tools/openwebtext/cleanup_dataset.py raw.json clean.json \\
        --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt --workers 2
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tools.openwebtext` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import ftfy
from langdetect import DetectorFactory, detect
from langdetect.lang_detect_exception import LangDetectException

from tools.openwebtext.jsonl_io import (Summary, add_common_args, atomic_output, parse_checked,
                                        dump_line, parallel_map, read_documents)


class TokenCounter:
    """Counts GPT-2 BPE tokens when vocab/merges are given, whitespace words otherwise."""

    def __init__(self, vocab_file: str | None = None, merge_file: str | None = None):
        self._tokenizer = None
        if vocab_file and merge_file:
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # we parallelize by process
            from tokenizers import ByteLevelBPETokenizer
            self._tokenizer = ByteLevelBPETokenizer(vocab_file, merge_file)

    @property
    def unit(self) -> str:
        return "bpe_tokens" if self._tokenizer is not None else "words"

    def __call__(self, text: str) -> int:
        if self._tokenizer is None:
            return len(text.split())
        return len(self._tokenizer.encode(text).ids)


def detect_language(text: str) -> str | None:
    try:
        return detect(text)
    except LangDetectException:  # no letters to go on (digits, punctuation, emoji)
        return None


_state: dict = {}


def _init_worker(vocab_file, merge_file, lang, min_tokens, text_key) -> None:
    DetectorFactory.seed = 0  # langdetect samples n-grams at random; fix it per process
    _state.update(counter=TokenCounter(vocab_file, merge_file), lang=lang,
                  min_tokens=min_tokens, text_key=text_key)


def _clean(doc: dict) -> tuple[dict | None, str | None, bool]:
    """(document or None, drop reason, whether ftfy changed the text)."""
    key = _state["text_key"]
    text = doc[key]
    fixed = ftfy.fix_text(text)
    changed = fixed != text
    if not fixed.strip():
        return None, "empty_text", changed
    lang = detect_language(fixed)
    if lang is None:
        return None, "language_undetected", changed
    if lang != _state["lang"]:
        return None, f"not_{_state['lang']} ({lang})", changed
    if _state["counter"](fixed) < _state["min_tokens"]:
        return None, f"under_{_state['min_tokens']}_{_state['counter'].unit}", changed
    return dict(doc, **{key: fixed}), None, changed


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", help="loose-JSON input, one {'text', 'url', ...} object per line.")
    p.add_argument("output", help="loose-JSON output of the kept documents, text repaired.")
    p.add_argument("--min-tokens", type=int, default=128,
                   help="drop documents with fewer tokens than this (default 128).")
    p.add_argument("--vocab-file", default=None,
                   help="GPT-2-format vocab.json for counting tokens; with --merge-file.")
    p.add_argument("--merge-file", default=None,
                   help="GPT-2-format merges.txt for counting tokens; with --vocab-file. "
                        "Without both, whitespace-separated words are counted.")
    p.add_argument("--lang", default="en",
                   help="language code (langdetect's) of the documents to keep (default 'en').")
    p.add_argument("--text-key", default="text", help="JSON key holding the text (default 'text').")
    add_common_args(p)
    return p


def main(argv=None) -> dict:
    parser = build_parser()
    args = parse_checked(parser, argv)
    if bool(args.vocab_file) != bool(args.merge_file):
        parser.error("--vocab-file and --merge-file go together; give both or neither")
    summary, reading = Summary("cleanup_dataset"), Summary("cleanup_dataset")
    if not args.vocab_file:
        print(f"[cleanup_dataset] no --vocab-file/--merge-file: --min-tokens {args.min_tokens} "
              "counts whitespace words", file=sys.stderr)
    docs = read_documents(args.input, reading, args.text_key, progress=False)
    init = (args.vocab_file, args.merge_file, args.lang, args.min_tokens, args.text_key)
    with atomic_output(args.output) as out:
        for doc, reason, changed in parallel_map(_clean, docs, args.workers, _init_worker, init,
                                                 progress=not args.no_progress, desc="cleanup"):
            if changed:
                summary.note("ftfy_fixed_text")
            if doc is None:
                summary.drop(reason)
                continue
            out.write(dump_line(doc))
            summary.keep()
    summary.merge(reading)
    return summary.finish(args.summary_json)


if __name__ == "__main__":
    main()
