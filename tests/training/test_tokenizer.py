"""Tokenizers: round trips, EOD, the Hugging Face export/import path, and flag/file errors."""

import json
import os
import pickle

import pytest

from megatron.training.data.tokenizer import (
    GPT2_EOD,
    TokenizerSpec,
    build_tokenizer,
    validate_tokenizer_args,
    vocab_size_with_padding,
)

SAMPLE_TEXTS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "  leading spaces, trailing spaces  \n\nand blank lines\n",
    "unicode: naïve café — 数据并行 🚀",
    "literal <|endoftext|> inside a document stays text",
    "",
]


def write_tiny_gpt2_tokenizer(directory, vocab_size=400):
    """Train a small GPT-2-format BPE (vocab.json, merges.txt) in `directory`; shared by tool tests."""
    from tokenizers import ByteLevelBPETokenizer

    texts = [
        "the cat sat on the mat while the dog ran in the park",
        "data parallel tensor parallel pipeline parallel compression",
        "def forward(self, x): return self.linear(x)",
    ] * 50
    tok = ByteLevelBPETokenizer(add_prefix_space=False)
    tok.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2,
                            show_progress=False, special_tokens=[GPT2_EOD])
    os.makedirs(directory, exist_ok=True)
    tok.save_model(str(directory))
    return os.path.join(directory, "vocab.json"), os.path.join(directory, "merges.txt")


@pytest.fixture(scope="module")
def gpt2_files(tmp_path_factory):
    return write_tiny_gpt2_tokenizer(str(tmp_path_factory.mktemp("gpt2")))


@pytest.fixture(scope="module")
def gpt2(gpt2_files):
    vocab, merges = gpt2_files
    return build_tokenizer("GPT2BPETokenizer", vocab_file=vocab, merge_file=merges)


@pytest.mark.parametrize("text", SAMPLE_TEXTS)
def test_gpt2_round_trip(gpt2, text):
    ids = gpt2.tokenize(text)
    assert all(isinstance(i, int) and 0 <= i < gpt2.vocab_size for i in ids)
    assert gpt2.detokenize(ids) == text


def test_gpt2_vocab_and_eod(gpt2, gpt2_files):
    with open(gpt2_files[0]) as f:
        vocab = json.load(f)
    assert gpt2.vocab_size == len(vocab)
    assert gpt2.eod == vocab[GPT2_EOD] == gpt2.eos
    assert gpt2.detokenize([gpt2.eod]) == GPT2_EOD
    assert gpt2.inv_vocab[gpt2.eod] == GPT2_EOD
    # Only --append-eod may put EOD into the data: the literal string is ordinary text.
    assert gpt2.eod not in gpt2.tokenize("a <|endoftext|> b")
    assert not hasattr(gpt2, "pad")  # GPTDataset then uses its own pad id


def test_gpt2_batch_matches_single(gpt2):
    assert gpt2.tokenize_batch(SAMPLE_TEXTS) == [gpt2.tokenize(t) for t in SAMPLE_TEXTS]


def test_spec_rebuilds_same_tokenizer(gpt2):
    spec = pickle.loads(pickle.dumps(gpt2.spec))
    assert isinstance(spec, TokenizerSpec)
    again = spec.build()
    assert again.tokenize(SAMPLE_TEXTS[0]) == gpt2.tokenize(SAMPLE_TEXTS[0])
    assert set(gpt2.files) == {"--vocab-file", "--merge-file"}


def test_hf_export_and_import(gpt2, tmp_path):
    """save_pretrained gives a directory that HuggingFaceTokenizer loads offline with the same ids."""
    written = gpt2.save_pretrained(str(tmp_path / "hf"))
    assert any(p.endswith("tokenizer_config.json") for p in written)
    hf = build_tokenizer("HuggingFaceTokenizer", tokenizer_model=str(tmp_path / "hf"))
    assert hf.vocab_size == gpt2.vocab_size
    assert hf.eod == gpt2.eod
    text = SAMPLE_TEXTS[0]
    assert hf.tokenize(text) == gpt2.tokenize(text)
    assert hf.detokenize(hf.tokenize(text)) == text
    assert hf.tokenize_batch([text, "x"]) == [hf.tokenize(text), hf.tokenize("x")]
    assert hf.spec.build().eod == hf.eod


@pytest.mark.parametrize("tp,expected", [(1, 4096), (2, 4096), (4, 4096), (8, 4096), (3, 4224)])
def test_vocab_padding(tp, expected):
    assert vocab_size_with_padding(4096, tp) == expected
    assert vocab_size_with_padding(50257, 1) == 50304  # GPT-2, as in Megatron-LM


# ----------------------------------------------------------------------------- errors


def _write(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return str(path)


def _gpt2_case(case, tmp, vocab, merges):
    """Returns (kwargs, expected message fragment) for one broken GPT-2 setup."""
    missing = str(tmp / "nope" / "vocab.json")
    if case == "vocab-missing":
        return dict(vocab_file=missing, merge_file=merges), f"--vocab-file {missing} does not exist"
    if case == "merges-missing":
        m = str(tmp / "merges-missing.txt")
        return dict(vocab_file=vocab, merge_file=m), f"--merge-file {m} does not exist"
    if case == "vocab-not-json":
        bad = _write(tmp / "bad.json", '{"a": 0,\n"b": 1,\n"c" 2}')
        return dict(vocab_file=bad, merge_file=merges), f"--vocab-file {bad} is not valid JSON (line 3"
    if case == "vocab-is-list":
        bad = _write(tmp / "list.json", "[1, 2]")
        return dict(vocab_file=bad, merge_file=merges), "must hold a non-empty JSON object"
    if case == "vocab-no-eod":
        bad = _write(tmp / "noeod.json", '{"a": 0, "b": 1}')
        return dict(vocab_file=bad, merge_file=merges), f"--vocab-file {bad} has no '<|endoftext|>'"
    if case == "vocab-is-dir":
        return dict(vocab_file=str(tmp), merge_file=merges), "is a directory"
    if case == "merges-bad-line":
        with open(merges, encoding="utf-8") as f:
            first_merge = f.read().split("\n")[1]  # a valid line
        bad = _write(tmp / "m1.txt", f"#version: 0.2\n{first_merge}\nthree parts here\n")
        return dict(vocab_file=vocab, merge_file=bad), f"--merge-file {bad} line 3: expected two"
    if case == "merges-unknown-token":
        bad = _write(tmp / "m2.txt", "#version: 0.2\nzzzq qqqz\n")
        return dict(vocab_file=vocab, merge_file=bad), "line 2: 'zzzq qqqz' needs token 'zzzq'"
    if case == "no-vocab-flag":
        return dict(merge_file=merges), "--tokenizer-type GPT2BPETokenizer needs --vocab-file"
    raise AssertionError(case)


@pytest.mark.parametrize("case", [
    "vocab-missing", "merges-missing", "vocab-not-json", "vocab-is-list", "vocab-no-eod",
    "vocab-is-dir", "merges-bad-line", "merges-unknown-token", "no-vocab-flag",
])
def test_gpt2_errors_name_flag_and_file(case, tmp_path, gpt2_files):
    kwargs, message = _gpt2_case(case, tmp_path, *gpt2_files)
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(ValueError) as e:
        validate_tokenizer_args("GPT2BPETokenizer", **kwargs)
    assert message in str(e.value)
    assert sorted(os.listdir(tmp_path)) == before  # no side effects
    with pytest.raises(ValueError, match="--"):
        build_tokenizer("GPT2BPETokenizer", **kwargs)


def test_hf_errors(tmp_path):
    missing = str(tmp_path / "missing")
    with pytest.raises(ValueError, match=f"--tokenizer-model {missing} does not exist"):
        validate_tokenizer_args("HuggingFaceTokenizer", tokenizer_model=missing)
    with pytest.raises(ValueError, match="needs --tokenizer-model"):
        validate_tokenizer_args("HuggingFaceTokenizer")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="holds no tokenizer files"):
        validate_tokenizer_args("HuggingFaceTokenizer", tokenizer_model=str(empty))
    _write(empty / "tokenizer.json", "{not json")
    with pytest.raises(ValueError, match="tokenizer.json is not valid JSON"):
        build_tokenizer("HuggingFaceTokenizer", tokenizer_model=str(empty))
    with pytest.raises(ValueError, match="is not a directory"):
        validate_tokenizer_args("HuggingFaceTokenizer", tokenizer_model=str(empty / "tokenizer.json"))


def test_unknown_type():
    with pytest.raises(ValueError, match="--tokenizer-type BertWordPiece is not supported"):
        validate_tokenizer_args("BertWordPiece")
