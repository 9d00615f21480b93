"""Exact all-pairs Jaccard: the ground truth that MinHash LSH is checked against.

Every pair of documents is compared; nothing is estimated or pruned. The shingle sets
become rows of a binary matrix X (documents x distinct shingles) and X @ X.T gives every
pairwise intersection size, computed in row blocks so memory stays at one block of the
(N x N) result. Columns are split by document frequency: frequent shingles ("the c",
" and ") go to a dense float32 block multiplied by BLAS, rare ones stay sparse (scipy),
which keeps the dense part small and the sparse part cheap. Counts are integers below
2^24, so float32 is exact.

Usage (ground truth for a small corpus; slow past tens of thousands of documents):

    python tools/openwebtext/exact_all_pairs.py --inputs docs.json url --output exact_pairs.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tools.openwebtext` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np
from scipy import sparse

from tools.openwebtext.jsonl_io import (Summary, add_common_args, atomic_output, parse_checked,
                                        dump_line, parallel_map, read_documents)
from tools.openwebtext.shingling import add_shingle_args, ShingleConfig, shingle_hashes

DENSE_MIN_DF = 0.01  # shingles in >= 1% of documents go to the dense BLAS block


def all_pairs_jaccard(hash_sets: list[np.ndarray], threshold: float = 0.9, block: int = 1024,
                      dense_min_df: float = DENSE_MIN_DF) -> list[tuple[int, int, float]]:
    """All (i, j, J) with i < j and exact Jaccard J >= threshold, sorted by (i, j).

    Two empty sets have Jaccard 1.0 here, as in ``shingling.jaccard``.
    """
    n = len(hash_sets)
    if n < 2:
        return []
    sizes = np.array([h.size for h in hash_sets], dtype=np.float64)
    flat = np.concatenate(hash_sets) if sizes.sum() else np.zeros(0, np.uint64)
    _, cols = np.unique(flat, return_inverse=True)
    rows = np.repeat(np.arange(n), sizes.astype(np.int64))
    ncols = int(cols.max()) + 1 if cols.size else 0
    x = sparse.csr_matrix((np.ones(cols.size, np.float32), (rows, cols.ravel())), shape=(n, ncols))
    df = np.asarray(x.sum(axis=0)).ravel()
    dense_cols = np.flatnonzero(df >= max(2.0, dense_min_df * n))
    sparse_cols = np.setdiff1d(np.flatnonzero(df >= 2), dense_cols)  # df 1 never intersects
    xd = x[:, dense_cols].toarray()  # (N, F) float32
    xs = x[:, sparse_cols].tocsr()  # (N, R)
    xs_t = xs.T.tocsr()  # (R, N)

    out = []
    for start in range(0, n, block):
        stop = min(start + block, n)
        inter = xd[start:stop] @ xd.T  # (B, N) dense part of |A ∩ B|
        inter += (xs[start:stop] @ xs_t).toarray()  # (B, N) sparse part
        union = sizes[start:stop, None] + sizes[None, :] - inter
        with np.errstate(divide="ignore", invalid="ignore"):
            jac = np.where(union > 0, inter / np.maximum(union, 1), 1.0)
        jac[np.arange(stop - start)[:, None] >= np.arange(n)[None, :] - start] = -1.0  # keep j > i
        bi, bj = np.nonzero(jac >= threshold)
        out.extend((start + int(i), int(j), float(jac[i, j])) for i, j in zip(bi, bj))
    return out


def _hash_doc(item):
    key, text, config = item
    return key, shingle_hashes(text, config)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inputs", nargs="+", required=True, metavar="FILE KEY",
                   help="pairs of loose-JSON file and the JSON key naming each document "
                        "(e.g. 'docs.json url'), as for find_duplicates.py.")
    p.add_argument("--output", required=True,
                   help="loose-JSON file of pairs {'a', 'b', 'jaccard'} at or above the threshold.")
    p.add_argument("--jaccard-threshold", type=float, default=0.9,
                   help="report pairs with exact Jaccard >= this (default 0.9).")
    add_shingle_args(p)
    p.add_argument("--text-key", default="text", help="JSON key holding the text (default 'text').")
    add_common_args(p)
    return p


def main(argv=None) -> dict:
    parser = build_parser()
    args = parse_checked(parser, argv)
    if len(args.inputs) % 2:
        parser.error("--inputs takes FILE KEY pairs, got an odd number of values")
    try:
        config = ShingleConfig(args.shingle_size, args.shingle_unit)
    except ValueError as e:
        parser.error(str(e))
    summary = Summary("exact_all_pairs")
    items = []
    for path, key in zip(args.inputs[::2], args.inputs[1::2]):
        for doc in read_documents(path, summary, args.text_key, progress=not args.no_progress):
            if not isinstance(doc.get(key), str):
                summary.drop("missing_key")
                continue
            items.append((doc[key], doc[args.text_key], config))
    hashed = list(parallel_map(_hash_doc, items, args.workers, progress=not args.no_progress,
                               desc="shingling", total=len(items)))
    summary.keep(len(hashed))
    pairs = all_pairs_jaccard([h for _, h in hashed], args.jaccard_threshold)
    summary.note("pairs_at_or_above_threshold", len(pairs))
    with atomic_output(args.output) as f:
        for i, j, jac in pairs:
            f.write(dump_line({"a": hashed[i][0], "b": hashed[j][0], "jaccard": round(jac, 6)}))
    return summary.finish(args.summary_json)


if __name__ == "__main__":
    main()
