"""Tokenize a loose-JSON corpus into Megatron's indexed dataset (.bin/.idx).

One JSON object per line; the text under each --json-keys key becomes one document of
<output-prefix>_<key>_document.bin/.idx, the file pair megatron-core's IndexedDataset and
GPTDataset read (pass <output-prefix>_<key>_document as --data-path).

    python tools/preprocess_data.py --input corpus.jsonl --output-prefix data/my-gpt2 \\
        --tokenizer-type GPT2BPETokenizer --vocab-file vocab.json --merge-file merges.txt \\
        --append-eod --workers 2
    # -> data/my-gpt2_text_document.bin, data/my-gpt2_text_document.idx

Lines that are not valid JSON objects, or miss a key, or hold a non-string under it, are
skipped, counted, and reported with their line numbers at the end; the run fails (exit 1)
only if no line yields a document. Outputs are written under temporary names and renamed
into place, so a crashed run never leaves a half-written dataset behind.

From Python (megatron/training/data/preprocess.py, what --task-name and the embedded corpus
builder use):

    from megatron.training.data.preprocess import preprocess
    stats = preprocess("corpus.jsonl", "data/my-gpt2", tokenizer, append_eod=True)
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

if __package__ in (None, ""):  # run as a script: the checkout first (megatron-core 0.17+
    # wheels ship a megatron/training package of their own)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron.training.data.preprocess import PreprocessError, preprocess  # noqa: E402
from megatron.training.data.tokenizer import TOKENIZER_TYPES, build_tokenizer  # noqa: E402


# ----------------------------------------------------------------------------- command line


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults in the help, and the module docstring's example kept as written."""


def get_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="preprocess_data.py",
        description=__doc__.split("\n\nFrom Python")[0],
        formatter_class=_HelpFormatter,
    )
    g = p.add_argument_group("input data")
    g.add_argument("--input", required=True, help="Loose JSON file: one JSON object per line.")
    g.add_argument("--json-keys", nargs="+", default=["text"],
                   help="Keys whose string values are tokenized; each key gets its own "
                        "<output-prefix>_<key>_document.bin/.idx.")
    g = p.add_argument_group("tokenizer")
    g.add_argument("--tokenizer-type", required=True, choices=TOKENIZER_TYPES,
                   help="GPT2BPETokenizer: GPT-2 vocab.json + merges.txt. "
                        "HuggingFaceTokenizer: a local tokenizer directory (never downloaded).")
    g.add_argument("--vocab-file", default=None, help="GPT-2 vocab.json (GPT2BPETokenizer).")
    g.add_argument("--merge-file", default=None, help="GPT-2 merges.txt (GPT2BPETokenizer).")
    g.add_argument("--tokenizer-model", default=None,
                   help="Local Hugging Face tokenizer directory (HuggingFaceTokenizer).")
    g.add_argument("--append-eod", action="store_true",
                   help="Append the end-of-document token to every document (what GPT training expects).")
    g = p.add_argument_group("output data")
    g.add_argument("--output-prefix", required=True,
                   help="Path prefix of the outputs; the directory is created if missing.")
    g.add_argument("--dataset-impl", default="mmap", choices=["mmap"],
                   help="Accepted for old Megatron-LM command lines; mmap is the only format.")
    g = p.add_argument_group("runtime")
    g.add_argument("--workers", type=int, default=1,
                   help="Tokenizer processes; each builds its own tokenizer. 1 = tokenize in this process.")
    g.add_argument("--chunk-size", type=int, default=64, help="Lines sent to a worker at a time.")
    g.add_argument("--log-interval", type=int, default=10000,
                   help="Print a progress line every this many documents when stderr is not a "
                        "terminal (on a terminal a tqdm bar is shown instead); 0 = never.")
    args = p.parse_args(argv)
    if args.workers < 1:
        p.error(f"--workers must be >= 1, got {args.workers}")
    if args.chunk_size < 1:
        p.error(f"--chunk-size must be >= 1, got {args.chunk_size}")
    if not os.path.isfile(args.input):
        p.error(f"--input {args.input} does not exist")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = get_args(argv)
    try:
        tokenizer = build_tokenizer(args.tokenizer_type, args.vocab_file, args.merge_file, args.tokenizer_model)
    except ValueError as e:
        print(f"preprocess_data.py: error: {e}", file=sys.stderr)
        return 2
    try:
        stats = preprocess(
            args.input, args.output_prefix, tokenizer, json_keys=args.json_keys,
            append_eod=args.append_eod, workers=args.workers, log_interval=args.log_interval,
            chunk_size=args.chunk_size, progress=sys.stderr.isatty(),
        )
    except PreprocessError as e:
        print(f"preprocess_data.py: error: {e}", file=sys.stderr)
        return 1
    print(stats.report(args.json_keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
