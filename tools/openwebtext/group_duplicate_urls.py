"""Verify candidate pairs by exact Jaccard and group the near-duplicates.

Reads the candidate pairs of find_duplicates.py, computes the exact Jaccard similarity of
each pair's shingle sets from the documents given with --inputs (same shingles as
find_duplicates, read from the pairs file's meta line), keeps pairs at or above
--jaccard-threshold, and joins them into groups (connected components). Each group is
written as one line {"keep": key, "remove": [keys], "size": n, "min_jaccard": x}; the
kept document is the one that came first (loaded fingerprints, then input order), so a
new shard never displaces a document already in an older one, and documents of loaded
fingerprints are never listed for removal (their own run deduplicated them).

A pair whose text is not in --inputs (e.g. the old side of a pair found through loaded
fingerprints) cannot be verified exactly; --unverified says whether to trust its MinHash
estimate or drop it.

The summary counts candidate pairs: "kept" are the pairs confirmed as duplicates.

    python tools/openwebtext/group_duplicate_urls.py pairs.json groups.json --inputs clean.json url
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tools.openwebtext` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.openwebtext.jsonl_io import (Summary, add_common_args, atomic_output, parse_checked,
                                        dump_line, parallel_map, read_documents)
from tools.openwebtext.shingling import ShingleConfig, jaccard, shingle_hashes


class DisjointSets:
    """Union-find over document ranks; the root of a set is its smallest rank."""

    def __init__(self):
        self.parent: dict[int, int] = {}

    def find(self, x: int) -> int:
        self.parent.setdefault(x, x)
        root = x
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[x] != root:  # path compression
            self.parent[x], x = root, self.parent[x]
        return root

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            lo, hi = min(ra, rb), max(ra, rb)
            self.parent[hi] = lo


def read_pairs(path: str, summary: Summary) -> tuple[dict, list[dict]]:
    """(meta, pairs) of a find_duplicates output; malformed lines counted and skipped."""
    meta, pairs = {}, []
    for doc in read_documents(path, summary, text_key=None, progress=False):
        if "meta" in doc:
            meta = doc["meta"]
        elif all(isinstance(doc.get(k), str) for k in ("a", "b")) and \
                all(isinstance(doc.get(k), int) for k in ("a_rank", "b_rank")):
            pairs.append(doc)
        else:
            summary.drop("malformed_pair")
            summary.problem(path, f"not a pair line: {json.dumps(doc)[:80]}")
    return meta, pairs


_config: ShingleConfig | None = None


def _init_worker(config: ShingleConfig) -> None:
    global _config
    _config = config


def _hash_doc(item: tuple[str, str]):
    key, text = item
    return key, shingle_hashes(text, _config)


def read_texts(inputs: list[str], text_key: str, needed: set, summary: Summary) -> dict[str, str]:
    """Texts of the ``needed`` keys from the FILE KEY pairs (first occurrence wins)."""
    texts, inputs_summary = {}, Summary(summary.name)
    for path, key_name in zip(inputs[::2], inputs[1::2]):
        for doc in read_documents(path, inputs_summary, text_key, progress=False):
            key = doc.get(key_name)
            if key in needed and key not in texts:
                texts[key] = doc[text_key]
    summary.absorb_as_notes(inputs_summary, "inputs_")
    return texts


def confirm_pairs(pairs: list[dict], hashes: dict, threshold: float, unverified: str,
                  summary: Summary) -> dict[tuple[int, int], float]:
    """{(a_rank, b_rank): similarity} of the pairs at or above ``threshold``."""
    confirmed = {}
    for p in pairs:
        if p["a"] in hashes and p["b"] in hashes:
            sim = jaccard(hashes[p["a"]], hashes[p["b"]])
            summary.note("pairs_verified_exactly")
        elif unverified == "estimate" and isinstance(p.get("estimate"), (int, float)):
            sim = float(p["estimate"])
            summary.note("pairs_judged_by_estimate")
        else:
            summary.drop("pair_unverifiable")
            continue
        if sim >= threshold:
            summary.keep()  # this step's summary counts pairs: kept = confirmed duplicates
            confirmed[(p["a_rank"], p["b_rank"])] = sim
        else:
            summary.drop("pair_below_threshold")
    return confirmed


def write_groups(path: str, confirmed: dict, key_of: dict[int, str], n_loaded: int, summary: Summary) -> None:
    """Connected components of the confirmed pairs, one line each, earliest member kept."""
    sets = DisjointSets()
    for a, b in confirmed:
        sets.union(a, b)
    groups: dict[int, list[int]] = {}
    for rank in {r for edge in confirmed for r in edge}:
        groups.setdefault(sets.find(rank), []).append(rank)
    lowest: dict[int, float] = {}  # root -> smallest confirmed similarity inside the group
    for (a, _), sim in confirmed.items():
        root = sets.find(a)
        lowest[root] = min(sim, lowest.get(root, 1.0))
    n_removed = 0
    with atomic_output(path) as out:
        for root in sorted(groups):
            members = sorted(groups[root])  # the root is the smallest rank: members[0]
            # documents of loaded fingerprints were deduplicated by their own run: never listed
            remove = [key_of[r] for r in members[1:] if r >= n_loaded]
            out.write(dump_line({"keep": key_of[members[0]], "remove": remove,
                                 "size": len(members), "min_jaccard": round(lowest[root], 6)}))
            n_removed += len(remove)
    summary.note("groups", len(groups))
    summary.note("documents_to_remove", n_removed)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pairs", help="candidate pairs written by find_duplicates.py.")
    p.add_argument("output", help="loose-JSON file of groups, one per line (see above).")
    p.add_argument("--inputs", nargs="+", default=[], metavar="FILE KEY",
                   help="pairs of loose-JSON file and key, as given to find_duplicates.py; the "
                        "texts used for the exact Jaccard check.")
    p.add_argument("--jaccard-threshold", type=float, default=0.9,
                   help="a pair is a duplicate when its Jaccard similarity is >= this (default 0.9).")
    p.add_argument("--unverified", choices=["estimate", "drop"], default="estimate",
                   help="for pairs whose texts are not all in --inputs: judge by the MinHash "
                        "estimate ('estimate', default) or ignore the pair ('drop').")
    p.add_argument("--shingle-size", type=int, default=None,
                   help="override the shingle size recorded in the pairs file (default: as recorded, else 5).")
    p.add_argument("--shingle-unit", choices=["char", "word"], default=None,
                   help="override the shingle unit recorded in the pairs file (default: as recorded, else char).")
    p.add_argument("--text-key", default="text", help="JSON key holding the text (default 'text').")
    add_common_args(p)
    return p


def main(argv=None) -> dict:
    parser = build_parser()
    args = parse_checked(parser, argv)
    if len(args.inputs) % 2:
        parser.error("--inputs takes FILE KEY pairs, got an odd number of values")
    if not 0.0 < args.jaccard_threshold <= 1.0:
        parser.error(f"--jaccard-threshold must be in (0, 1], got {args.jaccard_threshold}")
    summary = Summary("group_duplicate_urls")
    meta, pairs = read_pairs(args.pairs, summary)
    try:
        config = ShingleConfig(args.shingle_size or meta.get("shingle_size", 5),
                               args.shingle_unit or meta.get("shingle_unit", "char"))
    except ValueError as e:
        parser.error(str(e))

    needed = {p["a"] for p in pairs} | {p["b"] for p in pairs}
    texts = read_texts(args.inputs, args.text_key, needed, summary)
    hashes = dict(parallel_map(_hash_doc, texts.items(), args.workers, _init_worker, (config,),
                               progress=not args.no_progress, desc="shingling", total=len(texts)))
    confirmed = confirm_pairs(pairs, hashes, args.jaccard_threshold, args.unverified, summary)
    key_of = {p["a_rank"]: p["a"] for p in pairs} | {p["b_rank"]: p["b"] for p in pairs}
    write_groups(args.output, confirmed, key_of, int(meta.get("fingerprints_loaded", 0)), summary)
    return summary.finish(args.summary_json)

if __name__ == "__main__":
    main()
