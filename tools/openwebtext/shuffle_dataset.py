"""Shuffle loose-JSON documents with a seed, skipping (and counting) malformed lines.

With --buckets 1 (default) all valid lines are shuffled in memory. For inputs larger
than memory, --buckets B scatters each line to one of B temporary files chosen at
random, shuffles each file in memory (--workers at a time) and concatenates them: a
uniform random permutation that needs memory for only one bucket per worker. The
result depends on --seed and --buckets only, not on --workers.

    python tools/openwebtext/shuffle_dataset.py --input decontaminated.json --output train.json --seed 1234
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tools.openwebtext` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.openwebtext.jsonl_io import (Summary, add_common_args, atomic_output, parse_checked,
                                        parallel_map, read_documents_parallel)


def _shuffle_bucket(item: tuple[str, int]) -> str:
    path, seed = item
    with open(path, "rb") as f:
        lines = f.readlines()
    random.Random(seed).shuffle(lines)
    with open(path, "wb") as f:
        f.writelines(lines)
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", required=True, help="loose-JSON file(s) to shuffle together.")
    p.add_argument("--output", required=True, help="shuffled loose-JSON output.")
    p.add_argument("--seed", type=int, default=1234, help="random seed (default 1234).")
    p.add_argument("--buckets", type=int, default=1,
                   help="temporary bucket files for out-of-memory shuffling (default 1: in memory).")
    p.add_argument("--text-key", default="text",
                   help="a line must hold a string under this key to be kept (default 'text'; "
                        "'' accepts any JSON object).")
    add_common_args(p)
    return p


def main(argv=None) -> dict:
    parser = build_parser()
    args = parse_checked(parser, argv)
    if args.buckets < 1:
        parser.error(f"--buckets must be >= 1, got {args.buckets}")
    summary = Summary("shuffle_dataset")
    lines = read_documents_parallel(args.input, summary, args.text_key or None, args.workers,
                                    progress=not args.no_progress)
    rng = random.Random(args.seed)
    if args.buckets == 1:
        kept = [raw if raw.endswith(b"\n") else raw + b"\n" for _, raw in lines]
        rng.shuffle(kept)
        with atomic_output(args.output, "wb") as out:
            out.writelines(kept)
        summary.keep(len(kept))
        return summary.finish(args.summary_json)

    out_path = Path(args.output)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = tempfile.mkdtemp(prefix=f".{out_path.name}.", dir=out_path.parent)
    try:
        paths = [str(Path(tmp_dir) / f"bucket{b:05d}") for b in range(args.buckets)]
        with ExitStack() as stack:
            files = [stack.enter_context(open(p, "wb")) for p in paths]
            for _, raw in lines:
                files[rng.randrange(args.buckets)].write(raw if raw.endswith(b"\n") else raw + b"\n")
                summary.keep()
        items = [(p, args.seed * 1_000_003 + b) for b, p in enumerate(paths)]
        done = parallel_map(_shuffle_bucket, items, args.workers, chunksize=1, progress=False)
        with atomic_output(out_path, "wb") as out:
            for path in done:
                with open(path, "rb") as f:
                    shutil.copyfileobj(f, out)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return summary.finish(args.summary_json)


if __name__ == "__main__":
    main()
