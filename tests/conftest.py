"""Shared fixtures: a tiny tokenizer and .bin/.idx corpus built from local text, once per session."""
import glob
import json
import os
import sysconfig

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")


def _local_texts(limit=120, max_chars=12000):
    """Real text present on any Python install: the standard library's own sources."""
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:limit]
    return [open(f, encoding="utf-8", errors="ignore").read()[:max_chars] for f in files]


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory):
    return make_tiny_corpus(tmp_path_factory.mktemp("tiny_corpus"))


def make_tiny_corpus(root):
    """vocab.json/merges.txt (1024 tokens) and a <prefix>.bin/.idx made of stdlib sources, in
    the directory `root` (a pathlib.Path)."""
    from tokenizers import ByteLevelBPETokenizer

    texts = _local_texts()
    tok = ByteLevelBPETokenizer()
    # 1024 = 128 x 8: Megatron's vocab padding is the same for every tp <= 8.
    tok.train_from_iterator(texts, vocab_size=1024, special_tokens=["<|endoftext|>"])
    tok.save_model(str(root))
    prefix = write_indexed(texts, tok, tok.token_to_id("<|endoftext|>"),
                           str(root / "text_document"))
    with open(root / "corpus.jsonl", "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    return {"vocab": str(root / "vocab.json"), "merges": str(root / "merges.txt"),
            "prefix": prefix, "jsonl": str(root / "corpus.jsonl"), "dir": str(root)}


def write_indexed(texts, tok, eod, prefix):
    """<prefix>.bin/.idx of `texts`, one document each, tokenized by `tok` and ended by eod."""
    import numpy as np
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for t in texts:
        builder.add_item(torch.tensor(tok.encode(t).ids + [eod]))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    return prefix


def tiny_gpt_argv(corpus, **overrides):
    """Flags of the small GPT used by integration tests (dropout off: deterministic)."""
    flags = {
        "num-layers": 4, "hidden-size": 32, "num-attention-heads": 4, "seq-length": 32,
        "micro-batch-size": 1, "global-batch-size": 8, "train-iters": 5, "lr": 1e-3,
        "lr-decay-style": "constant", "attention-dropout": 0.0, "hidden-dropout": 0.0,
        "log-interval": 1, "eval-interval": 1000, "eval-iters": 1, "seed": 1234,
        "data-path": corpus["prefix"], "vocab-file": corpus["vocab"],
        "merge-file": corpus["merges"], "split": "90,10,0",
    }
    flags.update(overrides)
    argv = []
    for k, v in flags.items():
        if v is True:
            argv.append(f"--{k}")
        elif v is not None and v is not False:
            argv += [f"--{k}", str(v)]
    return argv
