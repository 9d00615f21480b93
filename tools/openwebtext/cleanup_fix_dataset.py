"""Extra, dataset-specific cleaning tasks run by name over loose-JSON files.

Each input file X.json is written to --output-path as X_cleaned.json (and, with
--write-dropped, the dropped documents to X_dropped.json with a "drop_reason" field).
The text-fixing tasks run first, in the order below, then the filters; a document is
dropped by the first filter that rejects it. The tasks:

  ftfy_fix_text          repair mojibake and broken Unicode with ftfy ("cafÃ©" -> "café").
  general_cleaning       normalize whitespace: CRLF -> LF, drop control characters,
                         collapse runs of spaces/tabs, at most one blank line in a row,
                         strip each line's trailing spaces and the text's ends.
  remove_512             drop documents shorter than 512 characters.
  remove_256_javascript  drop documents shorter than 256 characters that mention
                         "javascript" (the "please enable JavaScript" stubs of scraped pages).
  remove_512_non_english drop documents shorter than 512 characters that langdetect
                         does not read as English (short pages in mixed languages).

--min-chars adds a generic length filter after the named tasks.

    python tools/openwebtext/cleanup_fix_dataset.py --input-files a.json b.json \\
        --output-path fixed/ --tasks ftfy_fix_text general_cleaning remove_512
"""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tools.openwebtext` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import ftfy
import regex
from langdetect import DetectorFactory

from tools.openwebtext.cleanup_dataset import detect_language
from tools.openwebtext.jsonl_io import (Summary, add_common_args, atomic_output, parse_checked,
                                        dump_line, parallel_map, read_documents)

_CONTROL = regex.compile(r"[\p{Cc}--[\n\t]]", flags=regex.V1)  # control chars except newline/tab
_SPACES = regex.compile(r"[ \t\p{Zs}]+")
_TRAILING = regex.compile(r" +\n")
_BLANKS = regex.compile(r"\n{3,}")


def general_cleaning(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _CONTROL.sub("", text)
    text = _SPACES.sub(" ", text)
    text = _TRAILING.sub("\n", text)
    return _BLANKS.sub("\n\n", text).strip()


FIXES = {  # name -> text -> text
    "ftfy_fix_text": ftfy.fix_text,
    "general_cleaning": general_cleaning,
}
FILTERS = {  # name -> text -> True to drop
    "remove_512": lambda t: len(t) < 512,
    "remove_256_javascript": lambda t: len(t) < 256 and "javascript" in t.lower(),
    "remove_512_non_english": lambda t: len(t) < 512 and detect_language(t) != "en",
}
TASKS = list(FIXES) + list(FILTERS)

_state: dict = {}


def _init_worker(tasks: list[str], min_chars: int, text_key: str) -> None:
    DetectorFactory.seed = 0
    _state.update(fixes=[t for t in FIXES if t in tasks], filters=[t for t in FILTERS if t in tasks],
                  min_chars=min_chars, text_key=text_key)


def _fix(doc: dict) -> tuple[dict, str | None, list[str]]:
    """(document with fixed text, drop reason or None, names of the fixes that changed it)."""
    key = _state["text_key"]
    text, changed = doc[key], []
    for name in _state["fixes"]:
        new = FIXES[name](text)
        if new != text:
            changed.append(name)
        text = new
    doc = dict(doc, **{key: text})
    for name in _state["filters"]:
        if FILTERS[name](text):
            return doc, name, changed
    if len(text) < _state["min_chars"]:
        return doc, f"under_{_state['min_chars']}_chars", changed
    return doc, None, changed


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input-files", nargs="+", required=True,
                   help="loose-JSON files to clean; each is written to --output-path as <name>_cleaned.json.")
    p.add_argument("--output-path", required=True, help="directory for the outputs (created if missing).")
    p.add_argument("--tasks", nargs="+", default=["ftfy_fix_text", "general_cleaning"], choices=TASKS,
                   metavar="TASK",
                   help=f"tasks to run, from: {', '.join(TASKS)} (see above; default: "
                        "ftfy_fix_text general_cleaning).")
    p.add_argument("--min-chars", type=int, default=0,
                   help="after the tasks, drop documents with fewer characters than this (default 0: off).")
    p.add_argument("--write-dropped", action="store_true",
                   help="also write the dropped documents, with a 'drop_reason' field, to <name>_dropped.json.")
    p.add_argument("--text-key", default="text", help="JSON key holding the text (default 'text').")
    add_common_args(p)
    return p


def clean_file(path: str, args) -> Summary:
    summary, reading = Summary(f"cleanup_fix_dataset {Path(path).name}"), Summary("")
    out_dir = Path(args.output_path)
    stem = Path(path).name.rsplit(".", 1)[0]
    docs = read_documents(path, reading, args.text_key, progress=False)
    with ExitStack() as stack:
        out = stack.enter_context(atomic_output(out_dir / f"{stem}_cleaned.json"))
        rej = stack.enter_context(atomic_output(out_dir / f"{stem}_dropped.json")) if args.write_dropped else None
        for doc, reason, changed in parallel_map(_fix, docs, args.workers, _init_worker,
                                                 (args.tasks, args.min_chars, args.text_key),
                                                 progress=not args.no_progress, desc=summary.name):
            for name in changed:
                summary.note(f"changed_by_{name}")
            if reason is None:
                out.write(dump_line(doc))
                summary.keep()
            else:
                if rej is not None:
                    rej.write(dump_line(dict(doc, drop_reason=reason)))
                summary.drop(reason)
    summary.merge(reading)
    return summary


def main(argv=None) -> dict:
    parser = build_parser()
    args = parse_checked(parser, argv)
    total = Summary("cleanup_fix_dataset")
    for path in args.input_files:
        part = clean_file(path, args)
        if len(args.input_files) > 1:
            part.report()
        total.merge(part)
    return total.finish(args.summary_json)


if __name__ == "__main__":
    main()
