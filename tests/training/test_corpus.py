"""The embedded default corpus: exact vocab size, loadable data, cache hits, locking, determinism.

The build is exercised on a reduced text budget (SMALL bytes) in a temporary cache directory;
the full-size build runs the same code with a larger cap.
"""

import hashlib
import json
import multiprocessing
import os
import time

import numpy as np
import pytest

from megatron.training.data import corpus
from megatron.training.data.corpus import (
    VOCAB_SIZE,
    build_cached,
    default_assets,
    docstring_text,
    gather_documents,
    looks_like_prose,
    split_chunks,
    train_tokenizer,
    write_jsonl,
)
from megatron.training.data.tokenizer import vocab_size_with_padding

SMALL = 300_000  # bytes of text: enough for a 4096-entry BPE, builds in a few seconds


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("corpus_cache"))


@pytest.fixture(scope="module")
def assets(cache_dir):
    return default_assets(cache_dir, max_bytes=SMALL)


def test_vocab_is_exactly_4096(assets):
    with open(assets.vocab_file, encoding="utf-8") as f:
        assert len(json.load(f)) == VOCAB_SIZE == 4096
    tok = assets.tokenizer()
    assert tok.vocab_size == assets.vocab_size == 4096
    assert tok.detokenize([tok.eod]) == "<|endoftext|>"
    for tp in (1, 2, 4, 8):  # Megatron pads nothing at these TP degrees
        assert vocab_size_with_padding(tok.vocab_size, tp) == 4096


def test_files_exist_and_data_loads(assets):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    for path in (assets.jsonl, assets.vocab_file, assets.merge_file,
                 assets.data_prefix + ".bin", assets.data_prefix + ".idx"):
        assert os.path.isfile(path), path
    ds = IndexedDataset(assets.data_prefix)
    assert len(ds) == assets.num_documents > 0
    assert int(ds.sequence_lengths.sum()) == assets.num_tokens
    assert ds.index.dtype == np.uint16
    tok = assets.tokenizer()
    with open(assets.jsonl, encoding="utf-8") as f:
        first = json.loads(f.readline())
        rows = 1 + sum(1 for _ in f)
    assert rows == assets.num_documents
    assert first["url"].startswith("file://")
    assert ds[0].tolist() == tok.tokenize(first["text"]) + [tok.eod]
    assert all(ds[i][-1] == tok.eod for i in range(0, len(ds), 7))


def test_second_call_hits_cache(assets, cache_dir, monkeypatch):
    def no_build(*args, **kwargs):
        raise AssertionError("rebuilt although cached")

    monkeypatch.setattr(corpus, "build_assets", no_build)
    start = time.time()
    again = default_assets(cache_dir, max_bytes=SMALL)
    assert time.time() - start < 0.5
    assert again == assets


def _sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_build_is_deterministic(assets, tmp_path):
    """A fresh gather reproduces the cached corpus byte for byte."""
    docs = gather_documents(SMALL)
    write_jsonl(docs, str(tmp_path / "again.jsonl"))
    assert _sha256(tmp_path / "again.jsonl") == _sha256(assets.jsonl)
    assert len({d["url"] for d in docs}) == len(docs)
    assert len({d["text"] for d in docs}) == len(docs)  # exact duplicates removed


def test_tokenizer_training_is_repeatable(tmp_path):
    texts = [d["text"] for d in gather_documents(200_000)]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = train_tokenizer(texts, str(tmp_path / "a"))
    b = train_tokenizer(texts, str(tmp_path / "b"))
    assert [_sha256(x) for x in a] == [_sha256(y) for y in b]


def test_cli_prints_paths(assets, cache_dir, capsys):
    from tools import corpus as cli

    assert cli.main(["--cache-dir", cache_dir, "--max-bytes", str(SMALL)]) == 0
    out = capsys.readouterr().out
    assert assets.data_prefix in out and assets.vocab_file in out


# ----------------------------------------------------------------------------- cache mechanics


def _slow_build(tmp):
    """A stand-in build that counts its runs in a file next to the cache (spawned processes)."""
    parent = os.path.dirname(tmp)
    with open(os.path.join(parent, "runs.txt"), "a") as f:
        f.write("x")
    time.sleep(0.5)
    with open(os.path.join(tmp, "payload"), "w") as f:
        f.write("ok")
    return {"version": corpus.VERSION, "jsonl": "payload", "vocab_file": "payload",
            "merge_file": "payload", "data_prefix": "payload"}


def _build_with_data(tmp):
    m = _slow_build(tmp)
    for ext in (".bin", ".idx"):  # the files a manifest's data_prefix promises
        open(os.path.join(tmp, "payload" + ext), "w").close()
    return m


def test_concurrent_callers_build_once(tmp_path):
    final = str(tmp_path / "entry")
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        results = pool.starmap(build_cached, [(final, _build_with_data)] * 4)
    assert (tmp_path / "runs.txt").read_text() == "x"
    assert all(r == results[0] for r in results)
    assert sorted(os.listdir(tmp_path)) == ["entry", "entry.lock", "runs.txt"]  # no temp dirs left


def test_failed_build_leaves_nothing_and_retry_works(tmp_path):
    final = str(tmp_path / "entry")

    def broken(tmp):
        open(os.path.join(tmp, "half"), "w").close()
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        build_cached(final, broken)
    assert sorted(os.listdir(tmp_path)) == ["entry.lock"]
    assert build_cached(final, _build_with_data)["jsonl"] == "payload"


def test_incomplete_cache_is_rebuilt(tmp_path):
    final = str(tmp_path / "entry")
    build_cached(final, _build_with_data)
    os.remove(os.path.join(final, "payload.bin"))  # e.g. a user deleted a file
    build_cached(final, _build_with_data)
    assert (tmp_path / "runs.txt").read_text() == "xx"
    assert os.path.isfile(os.path.join(final, "payload.bin"))


# ----------------------------------------------------------------------------- text helpers


def test_split_chunks_respects_limit_and_keeps_text():
    text = "\n\n".join(f"paragraph {i} " + "word " * (i * 37 % 300) for i in range(60))
    text += "\n\n" + "x" * 9000  # one unbreakable run
    chunks = split_chunks(text, max_chars=1000)
    assert all(0 < len(c) <= 1000 for c in chunks)
    assert "".join(chunks).replace("\n", "").replace(" ", "") == text.replace("\n", "").replace(" ", "")


def test_docstring_text_and_prose_filter():
    src = b'"""Module doc."""\nclass A:\n    """Class doc."""\n    def f(self, x=1):\n        """Method doc."""\n'
    assert docstring_text(src) == "Module doc.\n\nclass A\nClass doc.\n\ndef A.f(self, x=1)\nMethod doc."
    assert looks_like_prose("Permission is hereby granted, free of charge, to any person obtaining a copy. " * 5)
    assert not looks_like_prose("\n".join(f"{i} {i * 0.5:.4f} {i * 3.25:.4f}" for i in range(200)))
