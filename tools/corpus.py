"""Build (once) the embedded default corpus and tokenizer, and print their paths.

    python -m tools.corpus [--cache-dir D] [--max-bytes N]

A command line over megatron/training/data/corpus.py, which gathers the text, trains the tokenizer
and caches the result (pretrain_gpt.py uses it when no --data-path is given).
"""

import argparse
import os
import sys
import time
from dataclasses import asdict

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron.training.data.corpus import DEFAULT_MAX_BYTES, default_assets  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tools.corpus",
        description="Build (once) the embedded default corpus and tokenizer, and print their paths.",
    )
    p.add_argument("--cache-dir", default=None,
                   help="Cache directory (default: $MEGATRON_CC_CACHE or <repo>/.cache/default_corpus).")
    p.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES,
                   help="Text budget in UTF-8 bytes; each value is cached separately.")
    args = p.parse_args(argv)
    start = time.time()
    assets = default_assets(args.cache_dir, args.max_bytes)
    for key, value in asdict(assets).items():
        print(f"{key:14s} {value}")
    print(f"{'elapsed':14s} {time.time() - start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
