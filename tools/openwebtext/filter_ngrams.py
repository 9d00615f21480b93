"""Decontaminate training data against downstream tasks by 13-gram matching.

Task data is read from local files (nothing is downloaded): loose JSON, whose string
fields (all of them, or --task-keys) are task texts, or plain text, one example per
line. Words are runs of letters/digits, compared lowercased. Every --max-ngram-size
(13) word window of a task text is a contaminating n-gram; a task text shorter than
that but at least --min-ngram-size words long counts whole.

Each training document containing such an n-gram has the match cut out together with
--remove-char-each-side (200) characters on either side; overlapping cuts merge. The
pieces left between cuts become separate documents (other fields copied), pieces under
--filter-text-char-len (200) characters are dropped, and a document needing more than
--splits-count (10) cuts is dropped whole.

    python tools/openwebtext/filter_ngrams.py --tasks lambada squad --task-dir tasks/ \\
        --dedup-dataset deduped.json text --output decontaminated.json --workers 2
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tools.openwebtext` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import regex

from tools.openwebtext.jsonl_io import (Summary, add_common_args, atomic_output, parse_checked,
                                        dump_line, parallel_map, read_documents)

WORD = regex.compile(r"[\p{L}\p{N}]+")
TASK_SUFFIXES = (".jsonl", ".json", ".txt")


def words_with_spans(text: str) -> tuple[list[str], list[tuple[int, int]]]:
    words, spans = [], []
    for m in WORD.finditer(text):
        words.append(m.group().lower())
        spans.append(m.span())
    return words, spans


# ----------------------------------------------------------------------------- task side

def _strings(value, keys: set[str] | None):
    """All strings inside a JSON value; with ``keys``, only those under one of those keys."""
    if isinstance(value, str):
        if keys is None:
            yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, None if keys is not None and k in keys else keys)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v, keys)


def read_task_texts(path: Path, keys: set[str] | None, summary: Summary):
    if path.suffix == ".txt":
        with open(path, encoding="utf-8", errors="replace") as f:
            yield from (line.strip() for line in f if line.strip())
        return
    for record in read_documents(path, summary, text_key=None, progress=False):
        yield from _strings(record, keys)


def resolve_task_files(args, parser) -> dict[str, Path]:
    files = {}
    # --lambada-path names lambada's file itself (the seed's command gives both
    # `--tasks lambada ...` and `--lambada-path P`): it is not looked up in --task-dir.
    for name in [t for t in args.tasks if not (t == "lambada" and args.lambada_path)]:
        found = [Path(args.task_dir) / f"{name}{s}" for s in TASK_SUFFIXES] if args.task_dir else []
        found = [p for p in found if p.exists()]
        if not found:
            parser.error(f"--tasks {name}: no {name}.jsonl/.json/.txt in --task-dir {args.task_dir!r}; "
                         "task data is read from local files only")
        files[name] = found[0]
    named = [(p.stem, p) for p in map(Path, args.task_files)]
    if args.lambada_path:
        named.append(("lambada", Path(args.lambada_path)))
    for name, path in named:
        if not path.exists():
            parser.error(f"task file {path}: no such file")
        files[name] = path
    if not files and not args.load_dictionary:
        parser.error("give task data with --tasks NAME... --task-dir DIR and/or --task-files "
                     "PATH..., or --load-dictionary PATH")
    return files


def build_ngram_table(task_files: dict[str, Path], max_n: int, min_n: int, keys: set[str] | None,
                      summary: Summary) -> dict[int, dict[tuple, str]]:
    """{n: {n-gram: task name}}; n is max_n, or the length of a short task text."""
    table: dict[int, dict[tuple, str]] = {}
    for name, path in task_files.items():
        before = sum(len(t) for t in table.values())
        for text in read_task_texts(path, keys, summary):
            words, _ = words_with_spans(text)
            if len(words) >= max_n:
                grams = table.setdefault(max_n, {})
                for i in range(len(words) - max_n + 1):
                    grams.setdefault(tuple(words[i:i + max_n]), name)
            elif len(words) >= min_n:
                table.setdefault(len(words), {}).setdefault(tuple(words), name)
        summary.note(f"task_ngrams_{name}", sum(len(t) for t in table.values()) - before)
    return table


# ----------------------------------------------------------------------------- training side

def find_matches(text: str, table: dict[int, dict[tuple, str]]) -> list[tuple[int, int, str]]:
    """(start char, end char, task) of every task n-gram occurring in ``text``."""
    words, spans = words_with_spans(text)
    out = []
    for n, grams in table.items():
        for i in range(len(words) - n + 1):
            task = grams.get(tuple(words[i:i + n]))
            if task is not None:
                out.append((spans[i][0], spans[i + n - 1][1], task))
    return out


def cut_intervals(matches, length: int, margin: int) -> list[tuple[int, int]]:
    """Matches widened by ``margin`` on each side, clipped to the text, overlaps merged."""
    cuts = []
    for start, end in sorted((max(0, s - margin), min(length, e + margin)) for s, e, _ in matches):
        if cuts and start <= cuts[-1][1]:
            cuts[-1] = (cuts[-1][0], max(cuts[-1][1], end))
        else:
            cuts.append((start, end))
    return cuts


def split_document(text: str, cuts: list[tuple[int, int]], min_chars: int) -> tuple[list[str], int]:
    """(pieces of at least ``min_chars`` characters left between cuts, pieces dropped as short)."""
    pieces, prev = [], 0
    for start, end in cuts:
        pieces.append(text[prev:start])
        prev = end
    pieces.append(text[prev:])
    pieces = [p.strip() for p in pieces if p.strip()]
    kept = [p for p in pieces if len(p) >= min_chars]
    return kept, len(pieces) - len(kept)


_state: dict = {}


def _init_worker(table, margin, min_chars, max_splits, text_key) -> None:
    _state.update(table=table, margin=margin, min_chars=min_chars, max_splits=max_splits, text_key=text_key)


def _decontaminate(doc: dict):
    """(document, pieces to write, drop reason or None, short pieces dropped, task hit counts)."""
    text = doc[_state["text_key"]]
    matches = find_matches(text, _state["table"])
    if not matches:
        return doc, [text], None, 0, {}
    hits = dict(Counter(task for _, _, task in matches))
    cuts = cut_intervals(matches, len(text), _state["margin"])
    if len(cuts) > _state["max_splits"]:
        return doc, [], f"split_more_than_{_state['max_splits']}_times", 0, hits
    pieces, n_short = split_document(text, cuts, _state["min_chars"])
    return doc, pieces, (None if pieces else "all_pieces_short"), n_short, hits


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="*", default=[], metavar="NAME",
                   help="task names (e.g. lambada squad), each read from --task-dir as "
                        "NAME.jsonl, NAME.json or NAME.txt.")
    p.add_argument("--task-dir", default=None, help="directory holding the files named by --tasks.")
    p.add_argument("--task-files", nargs="*", default=[], metavar="PATH",
                   help="more task files, each named after its file stem.")
    p.add_argument("--lambada-path", default=None, metavar="PATH",
                   help="a local LAMBADA file (loose JSON or text), read as the task 'lambada'.")
    p.add_argument("--task-keys", nargs="*", default=None, metavar="KEY",
                   help="read task text only from these JSON fields (default: every string field).")
    p.add_argument("--dedup-dataset", nargs=2, required=True, metavar=("FILE", "TEXT_KEY"),
                   help="the training data (loose JSON) and the JSON key of its text.")
    p.add_argument("--output", required=True, help="loose-JSON output of the decontaminated documents.")
    p.add_argument("--max-ngram-size", type=int, default=13,
                   help="words per contaminating n-gram (default 13).")
    p.add_argument("--min-ngram-size", type=int, default=8,
                   help="task texts shorter than --max-ngram-size but at least this many words "
                        "are matched whole (default 8).")
    p.add_argument("--remove-char-each-side", type=int, default=200,
                   help="characters removed on each side of a match (default 200).")
    p.add_argument("--filter-text-char-len", type=int, default=200,
                   help="pieces of a split document shorter than this many characters are dropped (default 200).")
    p.add_argument("--splits-count", type=int, default=10,
                   help="a document needing more cuts than this is dropped whole (default 10).")
    # Megatron-LM / Optimus-CC spellings and features (their README's "save and load dictionary")
    p.add_argument("--save-dictionary", default=None, metavar="PATH",
                   help="save the task n-gram table to PATH (JSON) for later runs.")
    p.add_argument("--load-dictionary", default=None, metavar="PATH",
                   help="use a table saved by --save-dictionary (task files then optional; "
                        "given ones are added).")
    p.add_argument("--key-threshold", type=int, default=None, metavar="K",
                   help="n-grams found in more than K training documents are common phrases, not "
                        "contamination, and are not cut (a first pass counts them). Megatron-LM's "
                        "default is 10; default here: no threshold.")
    add_common_args(p)
    p.add_argument("--num-threads", dest="workers", type=int, default=argparse.SUPPRESS,
                   help="Megatron-LM's name for --workers (processes here).")
    return p


def save_table(path: str, table: dict[int, dict[tuple, str]]) -> None:
    import json
    rows = [[" ".join(g), task] for grams in table.values() for g, task in grams.items()]
    with atomic_output(path) as f:
        f.write(json.dumps({"version": 1, "ngrams": rows}))


def load_table(path: str, parser) -> dict[int, dict[tuple, str]]:
    import json
    try:
        rows = json.load(open(path))["ngrams"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        parser.error(f"--load-dictionary {path}: not a table written by --save-dictionary ({e})")
    table: dict[int, dict[tuple, str]] = {}
    for gram, task in rows:
        words = tuple(gram.split(" "))
        table.setdefault(len(words), {})[words] = task
    return table


def _count_documents(doc: dict):
    """The distinct task n-grams one training document contains (first pass of --key-threshold)."""
    words, _ = words_with_spans(doc[_state["text_key"]])
    found = set()
    for n, grams in _state["table"].items():
        for i in range(len(words) - n + 1):
            g = tuple(words[i:i + n])
            if g in grams:
                found.add(g)
    return found


def drop_common_ngrams(table, args, text_key, summary) -> None:
    """--key-threshold: remove n-grams present in more than K training documents."""
    counts: Counter = Counter()
    docs = read_documents(args.dedup_dataset[0], Summary("filter_ngrams"), text_key, progress=False)
    init = (table, 0, 0, 0, text_key)
    for found in parallel_map(_count_documents, docs, args.workers, _init_worker, init,
                              progress=not args.no_progress, desc="count n-grams"):
        counts.update(found)
    common = [g for g, c in counts.items() if c > args.key_threshold]
    for g in common:
        table[len(g)].pop(g, None)
    summary.note("ngrams_above_key_threshold", len(common))


def main(argv=None) -> dict:
    parser = build_parser()
    args = parse_checked(parser, argv)
    if not 1 <= args.min_ngram_size <= args.max_ngram_size:
        parser.error(f"need 1 <= --min-ngram-size ({args.min_ngram_size}) <= --max-ngram-size ({args.max_ngram_size})")
    task_files = resolve_task_files(args, parser)
    summary, reading, task_reading = (Summary("filter_ngrams") for _ in range(3))
    keys = set(args.task_keys) if args.task_keys else None
    table = build_ngram_table(task_files, args.max_ngram_size, args.min_ngram_size, keys, task_reading)
    if args.load_dictionary:
        for n, grams in load_table(args.load_dictionary, parser).items():
            for g, task in grams.items():
                table.setdefault(n, {}).setdefault(g, task)
    if args.save_dictionary:
        save_table(args.save_dictionary, table)
    summary.notes.update(task_reading.notes)
    summary.absorb_as_notes(task_reading, "task_files_")

    data_path, text_key = args.dedup_dataset
    if args.key_threshold is not None:
        drop_common_ngrams(table, args, text_key, summary)
    docs = read_documents(data_path, reading, text_key, progress=False)
    init = (table, args.remove_char_each_side, args.filter_text_char_len, args.splits_count, text_key)
    with atomic_output(args.output) as out:
        for doc, pieces, reason, n_short, hits in parallel_map(
                _decontaminate, docs, args.workers, _init_worker, init,
                progress=not args.no_progress, desc="filter_ngrams"):
            for task, n in hits.items():
                summary.note(f"matches_{task}", n)
            if hits:
                summary.note("documents_contaminated")
            if n_short:
                summary.note("pieces_dropped_short", n_short)
            if reason is not None:
                summary.drop(reason)
                continue
            for piece in pieces:
                out.write(dump_line(dict(doc, **{text_key: piece})))
            if hits:
                summary.note("pieces_written_from_split_documents", len(pieces))
            summary.keep()
    summary.merge(reading)
    return summary.finish(args.summary_json)


if __name__ == "__main__":
    main()
