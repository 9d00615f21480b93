"""Tokenizers for GPT training: GPT-2 BPE files and local Hugging Face tokenizer directories.

    tok = build_tokenizer("GPT2BPETokenizer", vocab_file="vocab.json", merge_file="merges.txt")
    ids = tok.tokenize("Hello world")          # list[int]
    text = tok.detokenize(ids)                 # "Hello world"
    tok.vocab_size, tok.eod                    # ints, what GPTDataset and the model need

Both are duck-type compatible with megatron-core's dataset code and define no `pad`.
`validate_tokenizer_args` checks flags and files without building anything (ValueErrors naming
the flag and file). The literal text "<|endoftext|>" is not the EOD token for GPT-2 BPE: the
only EOD ids in a dataset are those `--append-eod` adds.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

GPT2_EOD = "<|endoftext|>"
TOKENIZER_TYPES = ("GPT2BPETokenizer", "HuggingFaceTokenizer")

# Files that mark a directory as a Hugging Face tokenizer (any one is enough).
_HF_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "tokenizer.model",
    "vocab.txt",
)


@dataclass(frozen=True)
class TokenizerSpec:
    """Everything needed to rebuild a tokenizer in another process (picklable)."""

    tokenizer_type: str
    """GPT2BPETokenizer or HuggingFaceTokenizer (--tokenizer-type)."""
    vocab_file: Optional[str] = None
    """GPT-2 vocab.json (--vocab-file); GPT2BPETokenizer only."""
    merge_file: Optional[str] = None
    """GPT-2 merges.txt (--merge-file); GPT2BPETokenizer only."""
    tokenizer_model: Optional[str] = None
    """Local Hugging Face tokenizer directory (--tokenizer-model); HuggingFaceTokenizer only."""

    def build(self):
        return build_tokenizer(**asdict(self))


def vocab_size_with_padding(
    orig_vocab_size: int, tensor_model_parallel_size: int, make_vocab_size_divisible_by: int = 128
) -> int:
    """Megatron's padded vocabulary: the next multiple of divisible_by * tp (embedding rows)."""
    multiple = make_vocab_size_divisible_by * tensor_model_parallel_size
    return -(-orig_vocab_size // multiple) * multiple


# ----------------------------------------------------------------------------- validation


def _check_file(flag: str, path: Optional[str], needed_by: str) -> str:
    if not path:
        raise ValueError(f"--tokenizer-type {needed_by} needs {flag}")
    if not os.path.exists(path):
        raise ValueError(f"{flag} {path} does not exist")
    if os.path.isdir(path):
        raise ValueError(f"{flag} {path} is a directory, expected a file")
    return path


def _read_gpt2_vocab(vocab_file: str) -> dict:
    """Load and check a GPT-2 vocab.json; errors name --vocab-file and the line."""
    try:
        with open(vocab_file, encoding="utf-8") as f:
            vocab = json.load(f)
    except UnicodeDecodeError as e:
        raise ValueError(f"--vocab-file {vocab_file} is not valid UTF-8 (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ValueError(
            f"--vocab-file {vocab_file} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})"
        ) from None
    if not isinstance(vocab, dict) or not vocab:
        raise ValueError(
            f"--vocab-file {vocab_file} must hold a non-empty JSON object mapping tokens to ids, "
            f"got {type(vocab).__name__}"
        )
    bad = next((k for k, v in vocab.items() if not isinstance(v, int) or v < 0), None)
    if bad is not None:
        raise ValueError(
            f"--vocab-file {vocab_file}: token {bad!r} has id {vocab[bad]!r}, expected an integer >= 0"
        )
    if len(set(vocab.values())) != len(vocab):
        raise ValueError(f"--vocab-file {vocab_file}: two tokens share an id")
    if GPT2_EOD not in vocab:
        raise ValueError(
            f"--vocab-file {vocab_file} has no {GPT2_EOD!r} entry "
            f"(the end-of-document token GPT2BPETokenizer needs)"
        )
    return vocab


def _check_gpt2_merges(merge_file: str, vocab: dict, vocab_file: str) -> None:
    """Every merge line is 'a b' with a, b and ab in the vocabulary ('#' lines are comments)."""
    try:
        with open(merge_file, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except UnicodeDecodeError as e:
        raise ValueError(f"--merge-file {merge_file} is not valid UTF-8 (byte {e.start})") from None
    for lineno, line in enumerate(lines, start=1):
        if not line or line.startswith("#"):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            raise ValueError(
                f"--merge-file {merge_file} line {lineno}: expected two space-separated tokens, "
                f"got {line[:80]!r}"
            )
        for token in (parts[0], parts[1], parts[0] + parts[1]):
            if token not in vocab:
                raise ValueError(
                    f"--merge-file {merge_file} line {lineno}: {line!r} needs token {token!r}, "
                    f"which is not in --vocab-file {vocab_file} (mismatched vocab and merges?)"
                )


def _check_hf_dir(tokenizer_model: Optional[str]) -> str:
    if not tokenizer_model:
        raise ValueError("--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model (a local directory)")
    if not os.path.exists(tokenizer_model):
        raise ValueError(f"--tokenizer-model {tokenizer_model} does not exist")
    if not os.path.isdir(tokenizer_model):
        raise ValueError(f"--tokenizer-model {tokenizer_model} is not a directory")
    present = [n for n in _HF_TOKENIZER_FILES if os.path.isfile(os.path.join(tokenizer_model, n))]
    if not present:
        raise ValueError(
            f"--tokenizer-model {tokenizer_model} holds no tokenizer files "
            f"(expected one of {', '.join(_HF_TOKENIZER_FILES)})"
        )
    for name in ("tokenizer.json", "tokenizer_config.json"):
        path = os.path.join(tokenizer_model, name)
        if name in present:
            try:
                with open(path, encoding="utf-8") as f:
                    json.load(f)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                where = f"line {e.lineno}" if isinstance(e, json.JSONDecodeError) else f"byte {e.start}"
                raise ValueError(
                    f"--tokenizer-model {tokenizer_model}: {name} is not valid JSON ({where})"
                ) from None
    return tokenizer_model


def validate_tokenizer_args(
    tokenizer_type: str,
    vocab_file: Optional[str] = None,
    merge_file: Optional[str] = None,
    tokenizer_model: Optional[str] = None,
) -> None:
    """Raise ValueError naming the flag and file if the tokenizer cannot be built. No side effects."""
    if tokenizer_type == "GPT2BPETokenizer":
        _check_file("--vocab-file", vocab_file, tokenizer_type)
        _check_file("--merge-file", merge_file, tokenizer_type)
        vocab = _read_gpt2_vocab(vocab_file)
        _check_gpt2_merges(merge_file, vocab, vocab_file)
    elif tokenizer_type == "HuggingFaceTokenizer":
        _check_hf_dir(tokenizer_model)
    else:
        raise ValueError(
            f"--tokenizer-type {tokenizer_type} is not supported; choose from {', '.join(TOKENIZER_TYPES)}"
        )


# ----------------------------------------------------------------------------- tokenizers


class GPT2BPETokenizer:
    """GPT-2 byte-level BPE from vocab.json + merges.txt, run by the `tokenizers` library."""

    tokenizer_type = "GPT2BPETokenizer"

    def __init__(self, vocab_file: str, merge_file: str):
        from tokenizers import ByteLevelBPETokenizer

        self.vocab_file, self.merge_file = vocab_file, merge_file
        vocab = _read_gpt2_vocab(vocab_file)
        try:
            # add_prefix_space=False: "Hello" and " Hello" stay distinct, as in GPT-2.
            self._tok = ByteLevelBPETokenizer(vocab_file, merge_file, add_prefix_space=False)
        except Exception as e:  # the Rust error does not say which file; say it here
            raise ValueError(
                f"cannot build GPT2BPETokenizer from --vocab-file {vocab_file} "
                f"and --merge-file {merge_file}: {e}"
            ) from None
        self._vocab = vocab
        self._eod = vocab[GPT2_EOD]

    @property
    def vocab_size(self) -> int:
        return len(self._vocab)

    @property
    def vocab(self) -> dict:
        return self._vocab

    @property
    def inv_vocab(self) -> dict:
        return {i: t for t, i in self._vocab.items()}

    @property
    def eod(self) -> int:
        return self._eod

    eos = eod

    def tokenize(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def tokenize_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Many texts at once (the Rust side runs them in parallel)."""
        return [e.ids for e in self._tok.encode_batch(list(texts))]

    def detokenize(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    @property
    def files(self) -> dict:
        """Flag -> path of the files this tokenizer was built from."""
        return {"--vocab-file": self.vocab_file, "--merge-file": self.merge_file}

    @property
    def spec(self) -> TokenizerSpec:
        return TokenizerSpec(self.tokenizer_type, vocab_file=self.vocab_file, merge_file=self.merge_file)

    def save_pretrained(self, directory: str) -> list[str]:
        """Write a Hugging Face tokenizer directory (GPT2Tokenizer) for export; returns the files."""
        from transformers import GPT2Tokenizer

        hf = GPT2Tokenizer(vocab=self.vocab_file, merges=self.merge_file)
        return list(hf.save_pretrained(directory))


class HuggingFaceTokenizer:
    """A tokenizer saved in a local directory, loaded with AutoTokenizer (never downloads).

    Like Megatron-LM, `tokenize` uses the tokenizer's default special tokens (e.g. a BOS for
    Llama-style tokenizers); EOD is the tokenizer's eos token (or <|endoftext|> if it has none).
    """

    tokenizer_type = "HuggingFaceTokenizer"

    def __init__(self, tokenizer_model: str):
        from transformers import AutoTokenizer

        self.tokenizer_model = tokenizer_model
        try:
            # A huge model_max_length silences "sequence longer than max length" on whole documents.
            self._tok = AutoTokenizer.from_pretrained(
                tokenizer_model, local_files_only=True, model_max_length=1 << 60
            )
        except Exception as e:
            raise ValueError(f"cannot load --tokenizer-model {tokenizer_model}: {e}") from None
        eod = self._tok.eos_token_id
        if eod is None:
            eod = self._tok.get_vocab().get(GPT2_EOD)
        if eod is None:
            raise ValueError(
                f"--tokenizer-model {tokenizer_model} has no eos token and no {GPT2_EOD!r}; "
                f"set eos_token in its tokenizer_config.json"
            )
        self._eod = int(eod)

    @property
    def vocab_size(self) -> int:
        return len(self._tok)  # includes added tokens, like Megatron-LM

    @property
    def vocab(self) -> dict:
        return self._tok.get_vocab()

    @property
    def inv_vocab(self) -> dict:
        return {i: t for t, i in self._tok.get_vocab().items()}

    @property
    def eod(self) -> int:
        return self._eod

    eos = eod

    def tokenize(self, text: str) -> list[int]:
        return list(self._tok(text)["input_ids"])

    def tokenize_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(ids) for ids in self._tok(list(texts))["input_ids"]]

    def detokenize(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids])

    @property
    def files(self) -> dict:
        return {"--tokenizer-model": self.tokenizer_model}

    @property
    def spec(self) -> TokenizerSpec:
        return TokenizerSpec(self.tokenizer_type, tokenizer_model=self.tokenizer_model)

    def save_pretrained(self, directory: str) -> list[str]:
        return list(self._tok.save_pretrained(directory))


def build_tokenizer(
    tokenizer_type: str,
    vocab_file: Optional[str] = None,
    merge_file: Optional[str] = None,
    tokenizer_model: Optional[str] = None,
):
    """Validate the flags, then build the tokenizer; ValueError (naming flag and file) on failure."""
    validate_tokenizer_args(tokenizer_type, vocab_file, merge_file, tokenizer_model)
    if tokenizer_type == "GPT2BPETokenizer":
        return GPT2BPETokenizer(vocab_file, merge_file)
    return HuggingFaceTokenizer(tokenizer_model)
