"""Pieces the checkpoint tools share: tokenizer flags, atomic directory replacement."""
import argparse
import os
import shutil
import sys
from typing import Optional

from tools.checkpoint.errors import CheckpointError


def add_tokenizer_flags(p: argparse.ArgumentParser, purpose: str) -> None:
    g = p.add_argument_group(f"tokenizer ({purpose})")
    g.add_argument("--tokenizer-type", default=None,
                   choices=["GPT2BPETokenizer", "HuggingFaceTokenizer"],
                   help="Default: GPT2BPETokenizer with --vocab-file/--merge-file, "
                        "HuggingFaceTokenizer with --tokenizer-model.")
    g.add_argument("--vocab-file", default=None, help="GPT-2 vocab.json.")
    g.add_argument("--merge-file", default=None, help="GPT-2 merges.txt.")
    g.add_argument("--tokenizer-model", default=None,
                   help="Local Hugging Face tokenizer directory.")


def _flags_given(cli) -> bool:
    return bool(getattr(cli, "vocab_file", None) or getattr(cli, "merge_file", None)
                or getattr(cli, "tokenizer_model", None))


def build_tokenizer_from(cli, ckpt_args: Optional[dict], required: bool):
    """The tokenizer the flags name, else the one the checkpoint was trained with.

    Returns None when neither is available and `required` is False; the checkpoint's own
    files are used only if they still exist at the recorded paths.
    """
    from megatron.training.data.tokenizer import build_tokenizer
    if _flags_given(cli):
        ttype = cli.tokenizer_type or ("HuggingFaceTokenizer" if cli.tokenizer_model
                                       else "GPT2BPETokenizer")
        return build_tokenizer(ttype, cli.vocab_file, cli.merge_file, cli.tokenizer_model)
    d = (ckpt_args or {}).get("data", {})
    paths = [d.get("vocab_file"), d.get("merge_file")] \
        if d.get("tokenizer_type") == "GPT2BPETokenizer" else [d.get("tokenizer_model")]
    if paths and all(x and os.path.exists(x) for x in paths):
        return build_tokenizer(d["tokenizer_type"], d.get("vocab_file"), d.get("merge_file"),
                               d.get("tokenizer_model"))
    if required:
        raise CheckpointError(
            "no tokenizer: the checkpoint's tokenizer files "
            f"({', '.join(str(x) for x in paths)}) are not here; pass --vocab-file and "
            "--merge-file, or --tokenizer-model")
    return None


def tokenizer_vocab_size(cli, ckpt_args: Optional[dict] = None) -> Optional[int]:
    tok = build_tokenizer_from(cli, ckpt_args, required=False)
    return None if tok is None else tok.vocab_size


def replace_dir(tmp: str, final: str) -> None:
    """Move a finished directory into place; an existing `final` is replaced only afterwards."""
    old = None
    if os.path.exists(final):
        old = f"{final}.old-{os.getpid()}"
        os.replace(final, old)
    os.replace(tmp, final)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def set_offline() -> None:
    """Never reach the Hugging Face hub (set before transformers/datasets are imported)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"


def fail(msg: str, prog: Optional[str] = None) -> int:
    """Print one `[prog: ]error: msg` line on stderr; returns the exit status 2."""
    print(f"{prog + ': ' if prog else ''}error: {msg}", file=sys.stderr, flush=True)
    return 2
