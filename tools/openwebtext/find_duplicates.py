"""Find candidate near-duplicate documents with MinHash LSH (datasketch).

Each document's shingles (character 5-grams of the normalized text by default) are
reduced to a MinHash signature of --num-seeds values in worker processes; the main
process indexes the signatures in a datasketch MinHashLSH with --num-bands bands of
(--num-seeds / --num-bands) rows, and queries each document against everything indexed
before it. Two documents become a candidate pair when all rows of at least one band
agree; with the defaults (128 seeds, 16 bands of 8 rows) a pair at Jaccard 0.9 is found
with probability 1 - (1 - 0.9^8)^16 > 0.9998, one at 0.5 with about 0.06.

Candidates are only candidates: group_duplicate_urls.py verifies them with the exact
Jaccard and groups them. The output is loose JSON: a first line {"meta": {...}} with the
settings (and how many loaded fingerprints come first), then one line per pair
{"a", "b", "a_rank", "b_rank", "estimate"} where a comes before b (loaded fingerprints
first, then the inputs in order) and "estimate" is the MinHash Jaccard estimate.

Fingerprints (keys and signatures) can be saved, and loaded by a later run, so a new
shard is deduplicated against old ones without re-reading them:

    python tools/openwebtext/find_duplicates.py --inputs shard0.json url \\
        --output pairs0.json --save-fingerprints fp0.npz --workers 2
    python tools/openwebtext/find_duplicates.py --inputs shard1.json url \\
        --load-fingerprints fp0.npz --output pairs1.json --save-fingerprints fp01.npz
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tools.openwebtext` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np
from datasketch import MinHashLSH

from tools.openwebtext.jsonl_io import (Summary, add_common_args, atomic_output, parse_checked,
                                        dump_line, parallel_map, read_documents)
from tools.openwebtext.shingling import add_shingle_args, ShingleConfig, Signer, estimated_jaccard, shingle_hashes

FINGERPRINT_VERSION = 1


# ----------------------------------------------------------------------------- fingerprints

def save_fingerprints(path: str, keys: list[str], signatures: np.ndarray, meta: dict) -> None:
    """Keys as one UTF-8 blob plus offsets (no pickle), signatures as (N, num_seeds) uint32."""
    encoded = [k.encode("utf-8") for k in keys]
    offsets = np.cumsum([0] + [len(e) for e in encoded]).astype(np.int64)
    blob = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    meta_bytes = np.frombuffer(json.dumps(dict(meta, version=FINGERPRINT_VERSION)).encode(), np.uint8)
    with atomic_output(path, "wb") as f:
        np.savez(f, keys_blob=blob, keys_offsets=offsets, signatures=signatures, meta=meta_bytes)


def load_fingerprints(path: str) -> tuple[list[str], np.ndarray, dict]:
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(z["meta"].tobytes().decode())
        blob, offsets = z["keys_blob"].tobytes(), z["keys_offsets"]
        keys = [blob[offsets[i]:offsets[i + 1]].decode("utf-8") for i in range(len(offsets) - 1)]
        return keys, z["signatures"], meta


def fingerprint_meta(args) -> dict:
    """Settings a loaded fingerprint file must share with this run to be comparable."""
    return {"num_seeds": args.num_seeds, "seed": args.seed, "scheme": Signer.scheme,
            "shingle_size": args.shingle_size, "shingle_unit": args.shingle_unit}


def check_meta(path: str, found: dict, wanted: dict) -> None:
    diff = {k: (found.get(k), v) for k, v in wanted.items() if found.get(k) != v}
    if diff:
        flags = ", ".join(f"--{k.replace('_', '-')}: file has {a!r}, run has {b!r}" for k, (a, b) in diff.items())
        raise SystemExit(f"find_duplicates: fingerprints {path} were made with other settings ({flags})")


# ----------------------------------------------------------------------------- workers

_signer: Signer | None = None
_config: ShingleConfig | None = None


def _init_worker(num_seeds: int, seed: int, config: ShingleConfig) -> None:
    global _signer, _config
    _signer, _config = Signer(num_seeds, seed), config


def _sign(item: tuple[str, str]) -> tuple[str, np.ndarray | None]:
    key, text = item
    hashes = shingle_hashes(text, _config)
    return key, (_signer.signature(hashes) if hashes.size else None)


def _sign_keep(item: tuple[str, str]):
    """_sign plus the shingle hashes themselves (for --jaccard's exact similarity)."""
    key, text = item
    hashes = shingle_hashes(text, _config)
    return key, (_signer.signature(hashes) if hashes.size else None), hashes


def similarity(a: np.ndarray, b: np.ndarray, kind: str) -> float:
    """Megatron-LM's --jaccard kinds over two sorted unique shingle-hash arrays:
    |A & B| / |A | B| (union), / min(|A|, |B|) (min), / ((|A| + |B|) / 2) (avg)."""
    inter = np.intersect1d(a, b, assume_unique=True).size
    denom = {"union": a.size + b.size - inter, "min": min(a.size, b.size),
             "avg": (a.size + b.size) / 2}[kind]
    return inter / denom if denom else 1.0


# ----------------------------------------------------------------------------- main

def index_fingerprints(paths, meta: dict, signer: Signer, lsh, summary: Summary):
    """Insert loaded fingerprints into ``lsh`` with ranks 0..; returns (keys, signatures, rank_of)."""
    keys, signatures, rank_of = [], [], {}
    for path in paths:
        old_keys, old_sigs, old_meta = load_fingerprints(path)
        check_meta(path, old_meta, meta)
        with lsh.insertion_session() as session:
            for key, sig in zip(old_keys, old_sigs):
                if key in rank_of:
                    summary.drop("repeated_key_in_fingerprints")
                    continue
                rank_of[key] = len(keys)
                session.insert(len(keys), signer.minhash(sig))
                keys.append(key)
                signatures.append(sig)
    return keys, signatures, rank_of


def keyed_texts(inputs: list[str], text_key: str, summary: Summary):
    """(key, text) of each document of the FILE KEY pairs; documents without a key are counted."""
    for path, key_name in zip(inputs[::2], inputs[1::2]):
        for doc in read_documents(path, summary, text_key, progress=False):
            key = doc.get(key_name)
            if isinstance(key, str):
                yield key, doc[text_key]
            else:
                summary.drop("missing_key")
                summary.problem(path, f"document without a string under {key_name!r}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inputs", nargs="+", required=True, metavar="FILE KEY",
                   help="pairs of loose-JSON file and the JSON key that names each document "
                        "(e.g. 'clean.json url'); keys must be unique across all inputs and "
                        "loaded fingerprints (a repeated key is reported and skipped).")
    p.add_argument("--output", required=True,
                   help="loose-JSON file of candidate pairs (see above).")
    p.add_argument("--save-fingerprints", default=None, metavar="PATH",
                   help="save keys and MinHash signatures of the loaded fingerprints plus "
                        "these inputs to PATH (.npz) for later runs.")
    p.add_argument("--load-fingerprints", nargs="+", default=[], metavar="PATH",
                   help="fingerprint files of earlier runs; their documents are indexed "
                        "first, and new documents are matched against them.")
    p.add_argument("--num-seeds", type=int, default=128,
                   help="MinHash permutations per signature (default 128).")
    p.add_argument("--num-bands", type=int, default=16,
                   help="LSH bands; must divide --num-seeds. More bands find pairs of lower "
                        "similarity and more false candidates (default 16, i.e. 8 rows each).")
    p.add_argument("--seed", type=int, default=1234,
                   help="seed of the MinHash permutations; runs sharing fingerprints must "
                        "use the same one (default 1234).")
    add_shingle_args(p)
    p.add_argument("--text-key", default="text", help="JSON key holding the text (default 'text').")
    g = p.add_argument_group("Megatron-LM / Optimus-CC flags")
    g.add_argument("--jaccard", choices=["union", "min", "avg"], default=None,
                   help="also compute each candidate's exact similarity of this kind (shingle "
                        "sets; union is Jaccard) into its 'jaccard' field, and drop candidates "
                        "below --jaccard-threshold. Keeps every document's shingles in memory, "
                        "as the seed does. Pairs with a loaded fingerprint get null.")
    g.add_argument("--jaccard-threshold", type=float, default=0.5,
                   help="with --jaccard: smallest similarity written (Megatron-LM: 0.5).")
    g.add_argument("--heuristic-iter", type=int, default=-1,
                   help="the seed's number of bucket-sampling rounds (-1: compare every "
                        "candidate). Accepted: every LSH candidate is compared here.")
    g.add_argument("--jaccard-parallel", action="store_true",
                   help="the seed computes --jaccard in worker processes; accepted (shingling "
                        "already runs in --workers processes, the comparison in the main one).")
    add_common_args(p)
    return p


def main(argv=None) -> dict:
    parser = build_parser()
    args = parse_checked(parser, argv)
    if len(args.inputs) % 2:
        parser.error("--inputs takes FILE KEY pairs, got an odd number of values")
    if args.num_bands < 1 or args.num_seeds % args.num_bands:
        parser.error(f"--num-bands ({args.num_bands}) must divide --num-seeds ({args.num_seeds})")
    try:
        config = ShingleConfig(args.shingle_size, args.shingle_unit)
    except ValueError as e:
        parser.error(str(e))
    meta = fingerprint_meta(args)
    signer = Signer(args.num_seeds, args.seed)
    lsh = MinHashLSH(num_perm=args.num_seeds, params=(args.num_bands, args.num_seeds // args.num_bands))
    summary, reading = Summary("find_duplicates"), Summary("find_duplicates")
    progress = not args.no_progress

    keys, signatures, rank_of = index_fingerprints(args.load_fingerprints, meta, signer, lsh, summary)
    n_loaded = len(keys)
    summary.note("fingerprints_loaded", n_loaded)
    texts = keyed_texts(args.inputs, args.text_key, reading)

    start = time.perf_counter()
    n_pairs = 0
    with atomic_output(args.output) as out:
        out.write(dump_line({"meta": dict(meta, num_bands=args.num_bands, fingerprints_loaded=n_loaded)}))
        shingles: dict[int, np.ndarray] = {}      # rank -> shingle hashes (--jaccard only)
        sign = _sign_keep if args.jaccard else _sign
        for item in parallel_map(sign, texts, args.workers, _init_worker,
                                 (args.num_seeds, args.seed, config), chunksize=64,
                                 progress=progress, desc="minhash"):
            key, sig = item[0], item[1]
            if key in rank_of:
                summary.drop("repeated_key")
                continue
            if sig is None:
                summary.drop("empty_text")
                continue
            rank = len(keys)
            mh = signer.minhash(sig)
            for other in sorted(lsh.query(mh)):
                est = estimated_jaccard(signatures[other], sig)
                pair = {"a": keys[other], "b": key, "a_rank": other, "b_rank": rank,
                        "estimate": round(est, 4)}
                if args.jaccard:
                    exact = (similarity(shingles[other], item[2], args.jaccard)
                             if other in shingles else None)
                    if exact is not None and exact < args.jaccard_threshold:
                        summary.note("candidates_below_jaccard_threshold")
                        continue
                    pair["jaccard"] = None if exact is None else round(exact, 4)
                out.write(dump_line(pair))
                n_pairs += 1
            if args.jaccard:
                shingles[rank] = item[2]
            lsh.insert(rank, mh)
            rank_of[key] = rank
            keys.append(key)
            signatures.append(sig)
            summary.keep()
    elapsed = time.perf_counter() - start
    summary.merge(reading)
    summary.note("candidate_pairs", n_pairs)
    print(f"[find_duplicates] {summary.kept} documents fingerprinted in {elapsed:.1f} s "
          f"({summary.kept / max(elapsed, 1e-9):.0f} docs/s, {args.workers} workers)", file=sys.stderr)
    if args.save_fingerprints:
        sigs = np.stack(signatures) if signatures else np.zeros((0, args.num_seeds), np.uint32)
        save_fingerprints(args.save_fingerprints, keys, sigs, meta)
    result = summary.finish(args.summary_json)
    result["seconds"] = elapsed
    return result


if __name__ == "__main__":
    main()
