"""Keep one document per group of near-duplicates.

Reads the groups written by group_duplicate_urls.py and copies the data file to the
output without every document listed under "remove" (each group's "keep" document
stays). A key seen a second time in the data file is dropped too, so the output has
unique keys. Kept lines are copied byte for byte.

    python tools/openwebtext/remove_group_duplicates.py groups.json clean.json deduped.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tools.openwebtext` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.openwebtext.jsonl_io import (Summary, add_common_args, atomic_output, parse_checked,
                                        read_documents, read_documents_parallel)


def read_removals(path: str, summary: Summary) -> set[str]:
    remove = set()
    for group in read_documents(path, summary, text_key=None, progress=False):
        keys = group.get("remove")
        if isinstance(keys, list) and all(isinstance(k, str) for k in keys):
            remove.update(keys)
        else:
            summary.drop("malformed_group")
            summary.problem(path, "group line without a list of keys under 'remove'")
    return remove


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("groups", help="groups of similar documents written by group_duplicate_urls.py.")
    p.add_argument("input", help="loose-JSON data file to deduplicate (the one given to find_duplicates.py).")
    p.add_argument("output", help="loose-JSON output without the removed documents.")
    p.add_argument("--key", default="url",
                   help="JSON key naming each document, as given to find_duplicates.py (default 'url'). "
                        "Documents without it are kept.")
    p.add_argument("--text-key", default="text", help="JSON key holding the text (default 'text').")
    add_common_args(p)
    return p


def main(argv=None) -> dict:
    parser = build_parser()
    args = parse_checked(parser, argv)
    group_summary = Summary("remove_group_duplicates")
    remove = read_removals(args.groups, group_summary)
    summary = Summary("remove_group_duplicates")
    seen = set()
    with atomic_output(args.output, "wb") as out:
        for doc, raw in read_documents_parallel(args.input, summary, args.text_key, args.workers,
                                                progress=not args.no_progress):
            key = doc.get(args.key)
            if not isinstance(key, str):
                summary.note("kept_without_key")
            elif key in remove:
                summary.drop("near_duplicate")
                continue
            elif key in seen:
                summary.drop("repeated_key")
                continue
            else:
                seen.add(key)
            out.write(raw if raw.endswith(b"\n") else raw + b"\n")
            summary.keep()
    summary.note("keys_listed_for_removal", len(remove))
    summary.absorb_as_notes(group_summary, "groups_file_")
    return summary.finish(args.summary_json)


if __name__ == "__main__":
    main()
