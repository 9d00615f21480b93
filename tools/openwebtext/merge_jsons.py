"""Merge loose-JSON files into one, skipping (and counting) malformed lines.

Takes every .json/.jsonl file of --json_path in name order, and/or the files given with
--inputs, and writes their valid lines, byte for byte, to --output_file. With
--workers N, N files are checked at once, each into a part file that is then appended
in order, so the result does not depend on N.

    python tools/openwebtext/merge_jsons.py --json_path shards/ --output_file merged.json
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tools.openwebtext` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.openwebtext.jsonl_io import (Summary, add_common_args, atomic_output, parse_checked,
                                        parallel_map, read_documents_parallel)


def _check_file(item: tuple[str, str, str]) -> tuple[str, dict]:
    """Copy the valid lines of one file to a part file in ``tmp_dir``; (part path, summary)."""
    path, tmp_dir, text_key = item
    summary = Summary(Path(path).name)
    fd, part = tempfile.mkstemp(dir=tmp_dir, suffix=".part")
    with os.fdopen(fd, "wb") as out:
        for _, raw in read_documents_parallel(path, summary, text_key or None, workers=1, progress=False):
            out.write(raw if raw.endswith(b"\n") else raw + b"\n")
            summary.keep()
    return part, summary.as_dict()


def list_inputs(args) -> list[Path]:
    files = []
    if args.json_path:
        files += sorted(p for p in Path(args.json_path).iterdir()
                        if p.is_file() and p.suffix.lower() in (".json", ".jsonl"))
    files += [Path(p) for p in args.inputs]
    out = Path(args.output_file).resolve()
    return [f for f in files if f.resolve() != out]  # never read what we are writing


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json_path", "--json-path", dest="json_path", default=None,
                   help="directory whose .json/.jsonl files are merged, in name order.")
    p.add_argument("--inputs", nargs="*", default=[], help="more files to merge, after those of --json_path.")
    p.add_argument("--output_file", "--output-file", dest="output_file", required=True,
                   help="merged loose-JSON output.")
    p.add_argument("--text-key", default="text",
                   help="a line must hold a string under this key to be kept (default 'text'; "
                        "'' accepts any JSON object).")
    add_common_args(p)
    return p


def main(argv=None) -> dict:
    parser = build_parser()
    args = parse_checked(parser, argv)
    files = list_inputs(args)
    if not files:
        parser.error("nothing to merge: give --json_path with .json/.jsonl files and/or --inputs")
    summary = Summary("merge_jsons")
    out_path = Path(args.output_file)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = tempfile.mkdtemp(prefix=f".{out_path.name}.", dir=out_path.parent)
    try:
        items = [(str(f), tmp_dir, args.text_key) for f in files]
        parts = list(parallel_map(_check_file, items, args.workers, chunksize=1,
                                  progress=not args.no_progress, desc="merge_jsons", total=len(items)))
        with atomic_output(out_path, "wb") as out:
            for part, part_summary in parts:
                with open(part, "rb") as f:
                    shutil.copyfileobj(f, out)
                summary.merge(Summary.from_dict(part_summary))
        summary.note("files_merged", len(files))
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return summary.finish(args.summary_json)


if __name__ == "__main__":
    main()
