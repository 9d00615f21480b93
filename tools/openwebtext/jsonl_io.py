"""Loose-JSON plumbing shared by the openwebtext scripts.

A loose-JSON file holds one JSON object per line, e.g. ``{"text": ..., "url": ...}``.
Everything a script needs around its own filter lives here:

- ``read_documents``: tolerant reader. A line that is not valid UTF-8, not valid JSON,
  not an object, or lacks a string under the text key is counted in the summary,
  its location remembered for the report, and skipped; a run never dies on it.
- ``atomic_output``: write to a temporary file beside the target, fsync, then
  ``os.replace``. A crashed or interrupted run leaves the old output (or none), never
  a truncated one.
- ``Summary``: kept/dropped counts with a reason per drop, printed at the end of a run
  and optionally saved as JSON (``--summary-json``).
- ``parallel_map``: ordered ``imap`` over a process pool (or plain ``map`` for one
  worker) with a progress bar.
- ``add_common_args``: ``--workers``, ``--no-progress`` and ``--summary-json``, which
  every script takes.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from tqdm import tqdm

MAX_REPORTED_PROBLEMS = 10  # locations of bad lines printed in a summary; the rest are only counted


@dataclass
class Summary:
    """What a run kept and dropped, and why."""

    name: str
    kept: int = 0
    dropped: Counter = field(default_factory=Counter)  # reason -> documents dropped
    notes: Counter = field(default_factory=Counter)  # counted events that drop nothing (e.g. "ftfy_fixed")
    problems: list = field(default_factory=list)  # "file:line: what was wrong", first few only

    def keep(self, n: int = 1) -> None:
        self.kept += n

    def drop(self, reason: str, n: int = 1) -> None:
        self.dropped[reason] += n

    def note(self, what: str, n: int = 1) -> None:
        self.notes[what] += n

    def problem(self, where: str, what: str) -> None:
        if len(self.problems) < MAX_REPORTED_PROBLEMS:
            self.problems.append(f"{where}: {what}")

    def merge(self, other: "Summary") -> None:
        self.kept += other.kept
        self.dropped.update(other.dropped)
        self.notes.update(other.notes)
        room = MAX_REPORTED_PROBLEMS - len(self.problems)
        self.problems.extend(other.problems[:max(room, 0)])

    def absorb_as_notes(self, other: "Summary", prefix: str) -> None:
        """Fold in the drops of a side input (e.g. a groups file) as notes, not as drops of
        this step's own documents."""
        for reason, n in other.dropped.items():
            self.note(f"{prefix}{reason}", n)
        room = MAX_REPORTED_PROBLEMS - len(self.problems)
        self.problems.extend(other.problems[:max(room, 0)])

    @property
    def seen(self) -> int:
        return self.kept + sum(self.dropped.values())

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "seen": self.seen,
            "kept": self.kept,
            "dropped": dict(sorted(self.dropped.items())),
            "notes": dict(sorted(self.notes.items())),
            "problems": list(self.problems),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Summary":
        return cls(d["name"], d["kept"], Counter(d["dropped"]), Counter(d["notes"]), list(d["problems"]))

    def report(self, stream=None) -> None:
        stream = stream or sys.stderr
        total_dropped = sum(self.dropped.values())
        print(f"[{self.name}] seen {self.seen}, kept {self.kept}, dropped {total_dropped}", file=stream)
        for reason, n in sorted(self.dropped.items(), key=lambda kv: (-kv[1], kv[0])):
            print(f"[{self.name}]   dropped {n:>9d}  {reason}", file=stream)
        for what, n in sorted(self.notes.items()):
            print(f"[{self.name}]   note    {n:>9d}  {what}", file=stream)
        if self.problems:
            print(f"[{self.name}] first bad lines (all counted above, all skipped):", file=stream)
            for p in self.problems:
                print(f"[{self.name}]   {p}", file=stream)

    def finish(self, summary_json: str | None) -> dict:
        """Print the report and, if asked, save it; returns the dict form."""
        self.report()
        d = self.as_dict()
        if summary_json:
            with atomic_output(summary_json) as f:
                json.dump(d, f, indent=1)
                f.write("\n")
        return d


# ----------------------------------------------------------------------------- reading

def parse_line(raw: bytes, text_key: str | None = "text") -> tuple[dict | None, str | None]:
    """Decode one loose-JSON line. Returns (document, None) or (None, problem)."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"malformed_utf8 ({e.reason} at byte {e.start})"
    try:
        doc = json.loads(line)
    except json.JSONDecodeError as e:
        return None, f"malformed_json ({e.msg})"
    if not isinstance(doc, dict):
        return None, f"malformed_json (a {type(doc).__name__}, not an object)"
    if text_key is not None and not isinstance(doc.get(text_key), str):
        return None, f"missing_text (no string under {text_key!r})"
    return doc, None


def iter_raw_lines(paths: Iterable[str | os.PathLike]) -> Iterator[tuple[str, int, bytes]]:
    """(path, 1-based line number, raw line) for each non-blank line of each file."""
    for path in paths:
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                if raw.strip():
                    yield str(path), lineno, raw


def read_documents(paths, summary: Summary, text_key: str | None = "text",
                   progress: bool = True, desc: str | None = None) -> Iterator[dict]:
    """Yield the well-formed documents of ``paths``; count and skip the rest.

    The drop reason is the problem's first word (``malformed_json``, ``malformed_utf8``,
    ``missing_text``), so the summary groups them.
    """
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    bar = tqdm(iter_raw_lines(paths), desc=desc or summary.name, unit=" lines",
               disable=not progress, file=sys.stderr, mininterval=0.5)
    for path, lineno, raw in bar:
        doc, problem = parse_line(raw, text_key)
        if doc is None:
            summary.drop(problem.split(" ", 1)[0])
            summary.problem(f"{path}:{lineno}", problem)
            continue
        yield doc


def _parse_item(item: tuple[str, int, bytes, str | None]):
    path, lineno, raw, text_key = item
    doc, problem = parse_line(raw, text_key)
    return path, lineno, raw, doc, problem


def read_documents_parallel(paths, summary: Summary, text_key: str | None = "text", workers: int = 1,
                            progress: bool = True, desc: str | None = None) -> Iterator[tuple[dict, bytes]]:
    """Like ``read_documents`` but decodes in ``workers`` processes and also yields the raw
    line, for steps whose whole work is parsing (merge, shuffle, removal by key)."""
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    items = ((p, n, raw, text_key) for p, n, raw in iter_raw_lines(paths))
    for path, lineno, raw, doc, problem in parallel_map(_parse_item, items, workers, chunksize=256,
                                                         progress=progress, desc=desc or summary.name):
        if doc is None:
            summary.drop(problem.split(" ", 1)[0])
            summary.problem(f"{path}:{lineno}", problem)
            continue
        yield doc, raw


# ----------------------------------------------------------------------------- writing

@contextmanager
def atomic_output(path: str | os.PathLike, mode: str = "w"):
    """Open a temporary file next to ``path``; on success fsync it and rename it over ``path``.

    On any exception the temporary file is removed and ``path`` is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        kwargs = {} if "b" in mode else {"encoding": "utf-8", "newline": "\n"}
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; outputs are ordinary data files
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def dump_line(doc: dict) -> str:
    """One loose-JSON line (UTF-8 kept as is, not \\u-escaped)."""
    return json.dumps(doc, ensure_ascii=False) + "\n"


# ----------------------------------------------------------------------------- workers

def _pool_context():
    # forkserver: workers fork from a clean server process, not from this one, which may hold
    # threads and native state (torch's pools, a test's fake CUDA guard) that a forked child
    # inherits half-done (seen: a worker segfaulting in its first garbage collection). Every
    # worker function here is spawn-safe; spawn where forkserver is missing.
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def parallel_map(fn: Callable, items: Iterable, workers: int = 1, initializer: Callable | None = None,
                 initargs: tuple = (), chunksize: int = 32, progress: bool = True,
                 desc: str = "", total: int | None = None) -> Iterator:
    """Ordered ``map(fn, items)``, over ``workers`` processes when ``workers > 1``.

    ``initializer(*initargs)`` runs once per worker (or once in this process for one
    worker), which is where per-worker state such as a tokenizer is built.
    """
    bar_args = dict(desc=desc, total=total, disable=not progress, file=sys.stderr, mininterval=0.5)
    if workers <= 1:
        if initializer is not None:
            initializer(*initargs)
        yield from tqdm(map(fn, items), **bar_args)
        return
    with _pool_context().Pool(workers, initializer=initializer, initargs=initargs) as pool:
        yield from tqdm(pool.imap(fn, items, chunksize=chunksize), **bar_args)


# ----------------------------------------------------------------------------- flags

def add_common_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("run")
    g.add_argument("--workers", type=int, default=1,
                   help="worker processes for the per-document work (default 1). Output order "
                        "and content do not depend on it.")
    g.add_argument("--no-progress", action="store_true",
                   help="hide the progress bars (they go to stderr).")
    g.add_argument("--summary-json", default=None, metavar="PATH",
                   help="also write the kept/dropped summary printed at the end to PATH as JSON.")


def check_workers(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.workers < 1:
        parser.error(f"--workers must be >= 1, got {args.workers}")


def parse_checked(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """Parse a script's flags and check the common ones (every script's first step)."""
    args = parser.parse_args(argv)
    check_workers(parser, args)
    return args
