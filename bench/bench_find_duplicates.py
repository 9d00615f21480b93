"""Benchmark: MinHash LSH near-duplicate search vs the exact all-pairs Jaccard check.

Generates a corpus of --docs documents (10% of them near-duplicates: 1-4 words edited),
then times, on the same file:
  - tools/openwebtext/find_duplicates.py at each --workers count (documents/s), plus the
    exact verification of its candidates (group_duplicate_urls.py);
  - the exact all-pairs Jaccard over every pair (tools/openwebtext/exact_all_pairs.py),
and prints them side by side with the recall and precision of the verified LSH pairs
against the exact pairs at --threshold.

    python bench/bench_find_duplicates.py                     # 20k documents, a few minutes on 2 cores
    python bench/bench_find_duplicates.py --docs 2000         # quick look
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.openwebtext import find_duplicates, group_duplicate_urls  # noqa: E402
from tools.openwebtext.exact_all_pairs import all_pairs_jaccard  # noqa: E402
from tools.openwebtext.shingling import shingle_hashes  # noqa: E402
from tools.openwebtext.synthetic import make_dedup_corpus  # noqa: E402


def write_corpus(path: Path, n_docs: int, dup_fraction: float, seed: int):
    n_dups = int(n_docs * dup_fraction)
    corpus = make_dedup_corpus(n_docs - n_dups, n_dups, seed=seed)
    with open(path, "w", encoding="utf-8") as f:
        for d in corpus.docs:
            f.write(json.dumps(d) + "\n")
    return corpus


def run_lsh(data: Path, work: Path, workers: int, threshold: float):
    pairs, groups = work / f"pairs_w{workers}.json", work / f"groups_w{workers}.json"
    start = time.perf_counter()
    fd = find_duplicates.main(["--inputs", str(data), "url", "--output", str(pairs),
                               "--workers", str(workers), "--no-progress"])
    lsh_s = time.perf_counter() - start
    start = time.perf_counter()
    group_duplicate_urls.main([str(pairs), str(groups), "--inputs", str(data), "url", "--workers", str(workers),
                               "--jaccard-threshold", str(threshold), "--no-progress"])
    verify_s = time.perf_counter() - start
    return fd, lsh_s, verify_s, pairs


def read_pairs(pairs_file: Path) -> set:
    """Candidate pairs of a find_duplicates output, as sorted (url, url)."""
    out = set()
    with open(pairs_file, encoding="utf-8") as f:
        for line in f:
            p = json.loads(line)
            if "meta" not in p:
                out.add(tuple(sorted((p["a"], p["b"]))))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=int, default=20_000, help="documents in the generated corpus (default 20000).")
    p.add_argument("--dup-fraction", type=float, default=0.1,
                   help="fraction of documents that are planted near-duplicates (default 0.1).")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2],
                   help="worker counts to time find_duplicates at (default 1 2).")
    p.add_argument("--threshold", type=float, default=0.9, help="Jaccard threshold of a duplicate (default 0.9).")
    p.add_argument("--seed", type=int, default=0, help="corpus seed (default 0).")
    p.add_argument("--skip-exact", action="store_true", help="do not run the exact all-pairs check.")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench_find_duplicates.") as tmp:
        work = Path(tmp)
        data = work / "docs.json"
        t0 = time.perf_counter()
        write_corpus(data, args.docs, args.dup_fraction, args.seed)
        print(f"corpus: {args.docs} documents ({data.stat().st_size / 1e6:.1f} MB) generated in "
              f"{time.perf_counter() - t0:.1f}s; cpus: {os.cpu_count()}", file=sys.stderr)

        rows = []
        for w in args.workers:
            fd, lsh_s, verify_s, pairs = run_lsh(data, work, w, args.threshold)
            rows.append((w, fd["notes"].get("candidate_pairs", 0), lsh_s, verify_s, read_pairs(pairs)))

        exact_s = exact = None
        if not args.skip_exact:
            t0 = time.perf_counter()
            urls, hashes = [], []
            with open(data, encoding="utf-8") as f:
                for line in f:
                    d = json.loads(line)
                    urls.append(d["url"])
                    hashes.append(shingle_hashes(d["text"]))
            found = all_pairs_jaccard(hashes, args.threshold)
            exact_s = time.perf_counter() - t0
            exact = {tuple(sorted((urls[i], urls[j]))) for i, j, _ in found}

    n = args.docs
    print()
    print(f"near-duplicate search on {n:,} documents ({n * (n - 1) // 2:,} pairs), Jaccard >= {args.threshold}"
          + (f": {len(exact):,} pairs by the exact check" if exact is not None else ""))
    print(f"{'method':32s} {'workers':>7s} {'seconds':>8s} {'docs/s':>8s} {'pairs out':>10s} {'recall':>7s}")
    for w, n_cands, lsh_s, verify_s, cands in rows:
        recall = f"{len(cands & exact) / max(len(exact), 1):7.4f}" if exact is not None else f"{'-':>7s}"
        print(f"{'find_duplicates (MinHash LSH)':32s} {w:>7d} {lsh_s:>8.1f} {n / lsh_s:>8.0f} {n_cands:>10,d} {recall}")
        print(f"{'  + group_duplicate_urls (exact)':32s} {w:>7d} {lsh_s + verify_s:>8.1f} "
              f"{n / (lsh_s + verify_s):>8.0f} {'':>10s} {recall}")
    if exact_s is not None:
        print(f"{'exact all-pairs Jaccard':32s} {1:>7d} {exact_s:>8.1f} {n / exact_s:>8.0f} "
              f"{len(exact):>10,d} {1.0:7.4f}")
    print("(recall: share of the exact pairs >= threshold that the LSH candidates contain; the exact "
          "check runs in one process, its BLAS may use every core)")
    return rows, exact_s


if __name__ == "__main__":
    main()
