"""Corpora of different kinds for the quality protocol, each built offline from a seed.

  embedded  tools/corpus.py's default corpus, as it is (its tokenizer, its .bin/.idx, split
            969,30,1): the text every tuned setting of this repository was tuned on. Its BPE
            saw the validation documents too, as the tuned runs' did.
  code      source code of the running Python's standard library (its tests, IDLE and
            site-packages left out): .py files, comments kept, docstrings cut out (the
            embedded corpus is made of docstrings and prose, so the two share almost no text),
            exact duplicate files dropped, at most PACKAGE_CODE_BYTES from a package so no one
            package fills it. The standard library, not the installed packages: it is the same
            on every machine with the same Python, whatever pip resolved there.
  markov    a random first-order Markov chain over a vocabulary of random letter words, words
            separated by spaces: its entropy rate is computed exactly, so the lowest reachable
            validation loss (the floor) is known and stored in the manifest.

The code and markov corpora hold out their validation documents: the BPE (VOCAB_SIZE entries,
byte level, <|endoftext|>) is trained on the training documents alone, the .bin/.idx lists the
training documents first and the held-out ones last, and the manifest's `split`
("<train docs>,<valid docs>,0") makes --split put exactly the held-out ones in the validation
split. Documents are assigned to validation by a seeded shuffle; the build is deterministic
for a (corpus, seed, max_bytes) and a Python version (the manifest's `fingerprint` tells two
builds apart; each run's result records it) and cached under
.cache/quality_corpora/, built once under a lock (tools/corpus.py's build_cached).

Markov units. The chain's entropy rate H_w (nats per word, stationary) and the mean word
length L (characters, the separating space included) give H_c = H_w / L nats per character
(spaces make the text uniquely decodable into words). The tokenizer is a bijection on text,
so the floor per token is the text's entropy over its token count: the manifest stores
`entropy_nats_per_char`, `chars_per_token` (held-out text, EOD excluded) and
`floor_nats_per_token` = (H(first word) + (n - 1) H_w) / tokens per document, EOD counted
as a token of zero entropy: a lower bound on any model's validation loss.

    python bench/quality_corpora.py [--corpora code,markov] [--seed 1] [--max-bytes N]
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import math
import os
import random
import sys
import sysconfig
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from megatron.training.data import corpus as embedded_corpus  # noqa: E402

CORPORA = ("embedded", "code", "markov")
# bump a corpus's version when anything below changes what gets built for it
BUILD_VERSIONS = {"code": "q2", "markov": "q1"}
DEFAULT_MAX_BYTES = embedded_corpus.DEFAULT_MAX_BYTES
DEFAULT_SEED = 1
VALID_FRACTION = 0.03
PACKAGE_CODE_BYTES = 400_000
MAX_SOURCE_BYTES = 400_000     # larger .py files are generated tables, not code
# the chain: WORDS words of 1..MAX_WORD_LETTERS letters, BRANCHING successors per word
WORDS, BRANCHING, MAX_WORD_LETTERS, DIRICHLET = 2048, 16, 8, 0.5
WORDS_PER_DOC = 256


def default_cache_dir() -> str:
    """$MEGATRON_CC_QUALITY_CACHE, else <repo>/.cache/quality_corpora."""
    return os.environ.get("MEGATRON_CC_QUALITY_CACHE") or os.path.join(ROOT, ".cache",
                                                                        "quality_corpora")


def _sorted_walk(root: str):
    """Files under root in sorted order, caches, tests and hidden directories skipped."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("__pycache__", "test", "tests")
                             and not d.startswith("."))
        for name in sorted(filenames):
            yield os.path.join(dirpath, name)


def _clean(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return "\n".join(line.rstrip() for line in text.split("\n"))


# ----------------------------------------------------------------------------- code corpus
def strip_docstrings(source: str) -> str:
    """The source without its docstrings (the lines they occupy), comments and code kept."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ""
    drop = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                drop.update(range(body[0].lineno, body[0].end_lineno + 1))
    lines = source.splitlines()
    return "\n".join(ln for i, ln in enumerate(lines, 1) if i not in drop)


SKIPPED_STDLIB = ("site-packages", "dist-packages", "idlelib", "test", "tests", "lib2to3")


def gather_code(max_bytes: int, roots=None) -> list:
    """[{"text", "url"}] of the standard library's Python sources (or of `roots`' packages
    and modules), deterministic for a Python version."""
    docs, seen, total = [], set(), 0
    for root in roots or [sysconfig.get_paths()["stdlib"]]:
        try:
            entries = sorted(os.listdir(root))
        except OSError:
            continue
        for entry in entries:
            top = os.path.join(root, entry)
            if (entry.startswith((".", "_")) or entry in SKIPPED_STDLIB
                    or entry.endswith((".dist-info", ".egg-info"))
                    or not (os.path.isdir(top) or entry.endswith(".py"))):
                continue
            used = 0
            for path in (_sorted_walk(top) if os.path.isdir(top) else [top]):
                if total >= max_bytes or used >= PACKAGE_CODE_BYTES:
                    break
                if not path.endswith(".py"):
                    continue
                try:
                    if os.path.getsize(path) > MAX_SOURCE_BYTES:
                        continue
                    with open(path, encoding="utf-8") as f:
                        raw = f.read()
                except (OSError, UnicodeDecodeError):
                    continue
                digest = hashlib.sha1(raw.encode("utf-8")).digest()
                if digest in seen:
                    continue
                seen.add(digest)
                text = _clean(strip_docstrings(raw)).strip("\n")
                for i, chunk in enumerate(embedded_corpus.split_chunks(text)):
                    if len(chunk.strip()) < embedded_corpus.MIN_CHUNK_CHARS:
                        continue
                    size = len(chunk.encode("utf-8"))
                    docs.append({"text": chunk,
                                 "url": f"file://stdlib/{os.path.relpath(path, root)}#{i}"})
                    used += size
                    total += size
            if total >= max_bytes:
                return docs
    return docs


# ----------------------------------------------------------------------------- Markov corpus
def markov_entropy(successors: list) -> tuple:
    """(stationary distribution, entropy rate in nats per step) of a first-order chain given
    as successors[i] = [(j, p), ...]; the chain must be irreducible and aperiodic."""
    import numpy as np
    n = len(successors)
    T = np.zeros((n, n))
    for i, row in enumerate(successors):
        for j, p in row:
            T[i, j] += p
    if not np.allclose(T.sum(1), 1.0):
        raise ValueError("every row of the chain must sum to 1")
    pi = np.full(n, 1.0 / n)
    for _ in range(100_000):
        nxt = pi @ T
        if np.abs(nxt - pi).max() < 1e-15:
            pi = nxt
            break
        pi = nxt
    pi = pi / pi.sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        h_row = -np.where(T > 0, T * np.log(T), 0.0).sum(1)
    return pi, float(pi @ h_row)


def markov_chain(seed: int, words: int = WORDS, branching: int = BRANCHING):
    """(vocabulary, successors) of the seeded chain. Every word's successors include the next
    two words of a ring (irreducible; cycles of lengths n and n - 1: aperiodic)."""
    rng = random.Random(seed)
    vocab, seen = [], set()
    while len(vocab) < words:
        w = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz")
                    for _ in range(rng.randint(1, MAX_WORD_LETTERS)))
        if w not in seen:
            seen.add(w)
            vocab.append(w)
    successors = []
    for i in range(words):
        nxt = {(i + 1) % words, (i + 2) % words}
        while len(nxt) < min(branching, words):
            nxt.add(rng.randrange(words))
        nxt = sorted(nxt)
        weights = [rng.gammavariate(DIRICHLET, 1.0) + 1e-12 for _ in nxt]
        s = sum(weights)
        successors.append([(j, w / s) for j, w in zip(nxt, weights)])
    return vocab, successors


def markov_documents(vocab, successors, pi, count: int, words_per_doc: int, seed: int) -> list:
    """`count` documents of words_per_doc words each, the first drawn from pi (stationary)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    cum = [np.cumsum([p for _, p in row]) for row in successors]
    nxt = [[j for j, _ in row] for row in successors]
    pi_cum = np.cumsum(pi)
    docs = []
    for d in range(count):
        u = rng.random(words_per_doc)
        w = min(int(np.searchsorted(pi_cum, u[0] * pi_cum[-1], side="right")), len(vocab) - 1)
        out = [vocab[w]]
        for k in range(1, words_per_doc):
            c = cum[w]
            w = nxt[w][min(int(np.searchsorted(c, u[k] * c[-1], side="right")), len(c) - 1)]
            out.append(vocab[w])
        docs.append({"text": " ".join(out), "url": f"markov://seed{seed}/{d}"})
    return docs


def markov_floor(vocab, pi, h_rate: float, words_per_doc: int, tokens_per_doc: float,
                 chars_per_token: float) -> dict:
    """The entropy figures of the manifest (see the module docstring)."""
    h_first = -sum(p * math.log(p) for p in pi if p > 0)
    mean_chars = sum(p * (len(w) + 1) for p, w in zip(pi, vocab))   # the space included
    return {"entropy_nats_per_word": h_rate, "entropy_nats_first_word": h_first,
            "mean_chars_per_word": mean_chars, "entropy_nats_per_char": h_rate / mean_chars,
            "chars_per_token": chars_per_token, "tokens_per_document": tokens_per_doc,
            "floor_nats_per_token": (h_first + (words_per_doc - 1) * h_rate) / tokens_per_doc,
            "rate_floor_nats_per_token": h_rate / mean_chars * chars_per_token}


# ----------------------------------------------------------------------------- build
def split_documents(docs: list, seed: int, valid_fraction: float = VALID_FRACTION) -> tuple:
    """(train, valid): a seeded shuffle's first ceil(fraction x n) documents held out (>= 1)."""
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    n_valid = max(1, math.ceil(valid_fraction * len(docs)))
    held = set(order[:n_valid])
    return ([d for i, d in enumerate(docs) if i not in held],
            [d for i, d in enumerate(docs) if i in held])


def build_corpus(name: str, out_dir: str, seed: int = DEFAULT_SEED,
                 max_bytes: int = DEFAULT_MAX_BYTES, vocab_size: int = embedded_corpus.VOCAB_SIZE,
                 words_per_doc: int = WORDS_PER_DOC, words: int = WORDS,
                 branching: int = BRANCHING) -> dict:
    """Build one of code / markov into out_dir (no cache, no lock); returns the manifest."""
    from tokenizers import ByteLevelBPETokenizer

    from megatron.training.data.preprocess import preprocess
    from megatron.training.data.tokenizer import build_tokenizer
    t0 = time.time()
    extra = {}
    if name == "code":
        docs = gather_code(max_bytes)
    elif name == "markov":
        vocab, successors = markov_chain(seed, words, branching)
        pi, h_rate = markov_entropy(successors)
        mean_chars = sum(p * (len(w) + 1) for p, w in zip(pi, vocab))
        count = max(2, int(max_bytes / (mean_chars * words_per_doc)))
        docs = markov_documents(vocab, successors, pi, count, words_per_doc, seed)
    else:
        raise ValueError(f"unknown corpus {name!r}: one of code, markov")
    train, valid = split_documents(docs, seed)
    jsonl = os.path.join(out_dir, "corpus.jsonl")
    embedded_corpus.write_jsonl(train + valid, jsonl)
    vocab_file, merge_file = embedded_corpus.train_tokenizer([d["text"] for d in train], out_dir,
                                                             vocab_size)
    tokenizer = build_tokenizer("GPT2BPETokenizer", vocab_file=vocab_file, merge_file=merge_file)
    stats = preprocess(jsonl, os.path.join(out_dir, "corpus"), tokenizer, append_eod=True)
    prefix = stats.outputs["text"]
    bpe = ByteLevelBPETokenizer(vocab_file, merge_file, add_prefix_space=False)
    valid_tokens = sum(len(e.ids) for e in bpe.encode_batch([d["text"] for d in valid]))
    valid_chars = sum(len(d["text"]) for d in valid)
    if name == "markov":
        extra["markov"] = {
            "words": words, "branching": branching, "dirichlet": DIRICHLET,
            "words_per_document": words_per_doc,
            **markov_floor(vocab, pi, h_rate, words_per_doc,
                           (valid_tokens + len(valid)) / len(valid), valid_chars / valid_tokens)}
    files = [vocab_file, merge_file, prefix + ".bin", prefix + ".idx"]
    return {
        "version": embedded_corpus.VERSION, "build_version": BUILD_VERSIONS[name], "corpus": name,
        "seed": seed, "max_bytes": max_bytes, "jsonl": "corpus.jsonl",
        "vocab_file": "vocab.json", "merge_file": "merges.txt",
        "data_prefix": os.path.basename(prefix), "num_documents": stats.documents,
        "train_documents": len(train), "valid_documents": len(valid),
        "split": f"{len(train)},{len(valid)},0", "num_tokens": stats.tokens["text"],
        "text_bytes": sum(len(d["text"].encode("utf-8")) for d in docs),
        "chars_per_token_valid": valid_chars / valid_tokens,
        "vocab_size": tokenizer.vocab_size, "fingerprint": embedded_corpus._sha256(files),
        "python": sys.version.split()[0], "seconds": round(time.time() - t0, 2), **extra}


def corpus_assets(name: str, cache_dir=None, seed: int = DEFAULT_SEED,
                  max_bytes: int = DEFAULT_MAX_BYTES, **kw) -> dict:
    """The manifest of corpus `name` (built once, cached) with absolute paths: data_prefix,
    vocab_file, merge_file, and split (what --split takes)."""
    if name == "embedded":
        a = embedded_corpus.default_assets(max_bytes=max_bytes)
        return {"corpus": name, "data_prefix": a.data_prefix, "vocab_file": a.vocab_file,
                "merge_file": a.merge_file, "split": "969,30,1", "num_documents": a.num_documents,
                "num_tokens": a.num_tokens, "fingerprint": a.fingerprint,
                "directory": a.directory}
    tag = "-".join([name, BUILD_VERSIONS[name], f"s{seed}", str(max_bytes)]
                   + [f"{k}{v}" for k, v in sorted(kw.items())])
    final = os.path.join(os.path.abspath(cache_dir or default_cache_dir()), tag)

    def build(tmp):
        print(f"quality corpora: building {name} in {final} (once)...", file=sys.stderr,
              flush=True)
        return build_corpus(name, tmp, seed, max_bytes, **kw)

    m = dict(embedded_corpus.build_cached(final, build))
    for key in ("jsonl", "vocab_file", "merge_file", "data_prefix"):
        m[key] = os.path.join(final, m[key])
    m["directory"] = final
    return m


def subset_assets(assets: dict, train_docs: int) -> dict:
    """Corpus `assets` (code or markov) cut to its first `train_docs` training documents, its
    held-out ones kept: a training split small enough to be seen several times in a short run
    (what per-sample activation caches need to be exercised). Built once beside the corpus,
    with its tokenizer; `fingerprint` stays the corpus's (the cut is a function of it)."""
    if "train_documents" not in assets:
        raise ValueError(f"corpus {assets['corpus']!r}: only the code and markov corpora list "
                         f"their held-out documents, so only they can be cut")
    n = max(1, min(int(train_docs), assets["train_documents"]))
    valid = assets["valid_documents"]
    final = os.path.join(assets["directory"], f"train-{n}")

    def build(tmp):
        from megatron.training.data.preprocess import preprocess
        from megatron.training.data.tokenizer import build_tokenizer
        with open(assets["jsonl"], encoding="utf-8") as f:
            lines = f.readlines()
        jsonl = os.path.join(tmp, "corpus.jsonl")
        with open(jsonl, "w", encoding="utf-8") as f:
            f.writelines(lines[:n] + lines[assets["train_documents"]:])
        tokenizer = build_tokenizer("GPT2BPETokenizer", vocab_file=assets["vocab_file"],
                                    merge_file=assets["merge_file"])
        stats = preprocess(jsonl, os.path.join(tmp, "corpus"), tokenizer, append_eod=True)
        return {"data_prefix": os.path.basename(stats.outputs["text"]),
                "train_documents": n, "valid_documents": valid, "split": f"{n},{valid},0",
                "num_tokens": stats.tokens["text"], "num_documents": stats.documents}

    m = dict(embedded_corpus.build_cached(final, build))
    return {**assets, **m, "data_prefix": os.path.join(final, m["data_prefix"]),
            "directory": final}


def data_flags(assets: dict) -> list:
    """The pretrain_gpt.py flags that train on a corpus and validate on its held-out split."""
    return ["--data-path", assets["data_prefix"], "--vocab-file", assets["vocab_file"],
            "--merge-file", assets["merge_file"], "--split", assets["split"]]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpora", default=",".join(CORPORA), help="comma-separated subset")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED)
    p.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES)
    p.add_argument("--cache-dir", default=None)
    a = p.parse_args(argv)
    for name in a.corpora.split(","):
        m = corpus_assets(name, a.cache_dir, a.seed, a.max_bytes)
        print(json.dumps({k: v for k, v in m.items() if k not in ("seconds",)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
