"""The embedded default corpus: real text and a tokenizer built from this Python install, offline.

Gathers docstrings and documentation files already on disk (stdlib, then site-packages) as
loose JSON lines, trains a byte-level BPE of VOCAB_SIZE entries on them and tokenizes the text
into <dir>/corpus_text_document.bin/.idx, so training runs without a download. Built once
under <cache_dir>/<VERSION>-<max_bytes>/, atomically and under a lock; the text depends only
on the Python install (ranks on different machines compare `DefaultAssets.fingerprint`).
Used by pretrain_gpt.py without --data-path; `python -m tools.corpus` builds it. See
docs/data_tools.md.
"""

from __future__ import annotations

import ast
import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

VERSION = "v1"  # bump when anything below changes what gets built
VOCAB_SIZE = 4096  # a multiple of 128 * tp for tp in 1, 2, 4, 8: no padding rows
EOD_TOKEN = "<|endoftext|>"
DEFAULT_MAX_BYTES = 8_000_000  # total UTF-8 bytes of text
CHUNK_CHARS = 4000  # longest document (~1k tokens); longer texts split at blank lines
MIN_CHUNK_CHARS = 64  # shorter leftovers are dropped
MAX_FILE_BYTES = 64_000  # text taken from any one source file
PACKAGE_DOCFILE_BYTES = 128_000  # documentation files taken from one site-packages entry
PACKAGE_DOCSTRING_BYTES = 160_000  # docstrings taken from one site-packages package
DEDUP_PARAGRAPH_CHARS = 200  # paragraphs this long are kept once (license boilerplate)
MANIFEST = "manifest.json"

_DOC_NAME = re.compile(
    r"(?i)^(readme|license|licence|copying|notice|authors|contributors|changelog|changes|history)"
    r"([._-].*)?$|.*\.(rst|md|txt)$"
)
_NOT_PROSE_NAMES = {
    "top_level.txt", "entry_points.txt", "dependency_links.txt", "sources.txt",
    "namespace_packages.txt", "cmakelists.txt", "api_tests.txt",
}
_SKIP_DIRS = {"__pycache__", "test", "tests", "idle_test", "site-packages", "dist-packages"}


@dataclass(frozen=True)
class DefaultAssets:
    """Paths and sizes of the built default corpus (what `--data-path` and the tokenizer flags take)."""

    jsonl: str
    """Loose JSON corpus, one {"text", "url"} object per line."""
    vocab_file: str
    """GPT-2 format vocab.json (--vocab-file)."""
    merge_file: str
    """GPT-2 format merges.txt (--merge-file)."""
    data_prefix: str
    """Prefix of the .bin/.idx pair, no extension (--data-path)."""
    num_documents: int
    """Documents in the .bin/.idx (one per JSON line)."""
    num_tokens: int
    """Tokens in the .bin, one EOD per document included."""
    vocab_size: int = VOCAB_SIZE
    tokenizer_type: str = "GPT2BPETokenizer"
    fingerprint: str = ""
    """sha256 over vocab, merges, .bin and .idx: equal on every rank iff the data is."""
    directory: str = ""
    """The cache directory holding all of the above."""

    def tokenizer(self):
        from megatron.training.data.tokenizer import build_tokenizer

        return build_tokenizer(self.tokenizer_type, vocab_file=self.vocab_file, merge_file=self.merge_file)


# ----------------------------------------------------------------------------- gathering text


def _sorted_walk(root: str) -> Iterator[str]:
    """Files under root in sorted order, skipping caches and test directories."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        for name in sorted(filenames):
            yield os.path.join(dirpath, name)


def docstring_text(source: bytes) -> str:
    """The docstrings of a Python file, in source order, each under a `def`/`class` line."""
    tree = ast.parse(source)
    parts = []

    def visit(node, prefix: str) -> None:
        for child in node.body:
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                doc = ast.get_docstring(child)
                if doc:
                    if isinstance(child, ast.ClassDef):
                        head = f"class {name}"
                    else:
                        head = f"def {name}({ast.unparse(child.args)})"
                    parts.append(f"{head}\n{doc}")
                visit(child, name + ".")

    doc = ast.get_docstring(tree)
    if doc:
        parts.append(doc)
    visit(tree, "")
    return "\n\n".join(parts)


def _read_text(path: str) -> Optional[str]:
    try:
        if os.path.getsize(path) > 2_000_000:
            return None
        with open(path, "rb") as f:
            data = f.read()
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if "\x00" in text:
        return None
    if os.path.basename(path) == "METADATA":  # RFC 822 headers, then the long description
        _, _, text = text.partition("\n\n")
    return text


def looks_like_prose(text: str) -> bool:
    """Cheap filter against data tables and word lists shipped as .txt."""
    sample = text[:20000]
    if len(sample) < MIN_CHUNK_CHARS:
        return False
    letters = sum(c.isalpha() for c in sample)
    lines = [ln for ln in sample.splitlines() if ln.strip()]
    words = sample.split()
    if not lines or not words or letters < 0.55 * len(sample):
        return False
    mean_word = sum(map(len, words)) / len(words)
    mean_line = sum(map(len, lines)) / len(lines)
    return 2.5 <= mean_word <= 12 and mean_line >= 25


def _package_group(entry: str) -> str:
    """Site-packages entry -> package name: 'torch-2.13.0.dist-info' and 'torch' -> 'torch'."""
    return re.split(r"[-.]", entry, maxsplit=1)[0].lower()


def _stdlib_sources(stdlib: str):
    for path in _sorted_walk(stdlib):
        if path.endswith(".py"):
            yield "stdlib", os.path.relpath(path, stdlib), path, "docstrings"


def _site_sources(site: str, kind: str):
    """(group, relpath, path, kind) for one kind ("docfiles" or "docstrings"), grouped by package."""
    try:
        entries = sorted(os.listdir(site))
    except OSError:
        return
    for entry in entries:
        top = os.path.join(site, entry)
        if not os.path.isdir(top) or entry in _SKIP_DIRS or entry.startswith((".", "_")):
            continue
        if kind == "docstrings" and entry.endswith((".dist-info", ".egg-info")):
            continue
        for path in _sorted_walk(top):
            name = os.path.basename(path)
            if kind == "docstrings":
                ok = name.endswith(".py")
            elif entry.endswith(".dist-info"):
                ok = name == "METADATA" or bool(_DOC_NAME.match(name))
            else:
                ok = bool(_DOC_NAME.match(name))
            if ok and name.lower() not in _NOT_PROSE_NAMES and "requirements" not in name.lower():
                yield _package_group(entry), os.path.relpath(path, site), path, kind


def _source_text(path: str, kind: str) -> Optional[str]:
    if kind == "docstrings":
        try:
            if os.path.getsize(path) > 2_000_000:  # generated tables, not prose
                return None
            with open(path, "rb") as f:
                return docstring_text(f.read())
        except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
            return None
    text = _read_text(path)
    return text if text is not None and looks_like_prose(text) else None


def split_chunks(text: str, max_chars: int = CHUNK_CHARS) -> list[str]:
    """Pack blank-line-separated paragraphs into chunks of at most max_chars."""
    pieces = []
    for para in re.split(r"\n[ \t]*\n", text):
        para = para.strip("\n")
        if not para.strip():
            continue
        while len(para) > max_chars:  # cut an over-long paragraph at a line break or a space
            cut = para.rfind("\n", 0, max_chars)
            if cut <= 0:
                cut = para.rfind(" ", 0, max_chars)
            if cut <= 0:
                cut = max_chars
            pieces.append(para[:cut])
            para = para[cut:].lstrip("\n ")
        if para:
            pieces.append(para)
    chunks, cur, size = [], [], 0
    for piece in pieces:
        if cur and size + 2 + len(piece) > max_chars:
            chunks.append("\n\n".join(cur))
            cur, size = [], 0
        cur.append(piece)
        size += len(piece) + 2
    if cur:
        chunks.append("\n\n".join(cur))
    return chunks


def _clean(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return "\n".join(line.rstrip() for line in text.split("\n"))


def gather_documents(
    max_bytes: int = DEFAULT_MAX_BYTES,
    stdlib: Optional[str] = None,
    site_packages: Optional[list] = None,
) -> list[dict]:
    """The corpus as [{"text", "url"}], deterministic for a given Python install."""
    stdlib = stdlib or sysconfig.get_paths()["stdlib"]
    if site_packages is None:
        paths = sysconfig.get_paths()
        site_packages = sorted({paths["purelib"], paths["platlib"]})
    sources = [(_stdlib_sources(stdlib), None, "stdlib")]
    for kind, cap in (("docfiles", PACKAGE_DOCFILE_BYTES), ("docstrings", PACKAGE_DOCSTRING_BYTES)):
        sources += [(_site_sources(site, kind), cap, "site-packages") for site in site_packages]

    docs, seen_chunks, seen_paragraphs, total = [], set(), set(), 0
    for source, group_cap, root_name in sources:
        used: dict = {}
        for group, rel, path, kind in source:
            if total >= max_bytes:
                return docs
            if group_cap is not None and used.get(group, 0) >= group_cap:
                continue
            text = _source_text(path, kind)
            if not text:
                continue
            text = _dedup_paragraphs(_clean(text), seen_paragraphs)
            taken = 0
            for i, chunk in enumerate(split_chunks(text)):
                size = len(chunk.encode("utf-8"))
                if taken >= MAX_FILE_BYTES or total >= max_bytes:
                    break
                digest = hashlib.sha1(chunk.encode("utf-8")).digest()
                if len(chunk.strip()) < MIN_CHUNK_CHARS or digest in seen_chunks:
                    continue
                seen_chunks.add(digest)
                docs.append({"text": chunk, "url": f"file://{root_name}/{rel}#{i}"})
                taken += size
                total += size
            used[group] = used.get(group, 0) + taken
    return docs


def _dedup_paragraphs(text: str, seen: set) -> str:
    kept = []
    for para in re.split(r"\n\n+", text):
        if len(para) >= DEDUP_PARAGRAPH_CHARS:
            digest = hashlib.sha1(" ".join(para.split()).encode("utf-8")).digest()
            if digest in seen:
                continue
            seen.add(digest)
        kept.append(para)
    return "\n\n".join(kept)


def write_jsonl(docs: list, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for doc in docs:
            line = json.dumps(doc, ensure_ascii=False)
            # JSON allows these raw, but str.splitlines() would break a line on them.
            line = line.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029").replace("\x85", "\\u0085")
            f.write(line + "\n")


# ----------------------------------------------------------------------------- tokenizer


def train_tokenizer(texts: list, out_dir: str, vocab_size: int = VOCAB_SIZE) -> tuple[str, str]:
    """Byte-level BPE with exactly vocab_size entries; returns (vocab.json, merges.txt) paths."""
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer(add_prefix_space=False)
    tok.train_from_iterator(
        texts, vocab_size=vocab_size, min_frequency=2, show_progress=False,
        special_tokens=[EOD_TOKEN], length=len(texts),
    )
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(
            f"the corpus ({len(texts)} documents) is too small for a {vocab_size}-token BPE: "
            f"training stopped at {tok.get_vocab_size()}; raise max_bytes"
        )
    tok.save_model(out_dir)
    return os.path.join(out_dir, "vocab.json"), os.path.join(out_dir, "merges.txt")


# ----------------------------------------------------------------------------- build + cache


def _sha256(paths: list) -> str:
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def build_assets(out_dir: str, max_bytes: int = DEFAULT_MAX_BYTES) -> dict:
    """Build everything into out_dir (no caching, no locking); returns the manifest."""
    from megatron.training.data.preprocess import preprocess
    from megatron.training.data.tokenizer import build_tokenizer, vocab_size_with_padding

    t0 = time.time()
    docs = gather_documents(max_bytes)
    jsonl = os.path.join(out_dir, "corpus.jsonl")
    write_jsonl(docs, jsonl)
    t1 = time.time()
    vocab_file, merge_file = train_tokenizer([d["text"] for d in docs], out_dir)
    tokenizer = build_tokenizer("GPT2BPETokenizer", vocab_file=vocab_file, merge_file=merge_file)
    assert tokenizer.vocab_size == VOCAB_SIZE, tokenizer.vocab_size
    for tp in (1, 2, 4, 8):  # no padded embedding rows at any power-of-two TP degree
        assert vocab_size_with_padding(tokenizer.vocab_size, tp) == VOCAB_SIZE, tp
    t2 = time.time()
    stats = preprocess(jsonl, os.path.join(out_dir, "corpus"), tokenizer, append_eod=True)
    prefix = stats.outputs["text"]
    t3 = time.time()
    files = [vocab_file, merge_file, prefix + ".bin", prefix + ".idx"]
    return {
        "version": VERSION,
        "max_bytes": max_bytes,
        "jsonl": "corpus.jsonl",
        "vocab_file": "vocab.json",
        "merge_file": "merges.txt",
        "data_prefix": os.path.basename(prefix),
        "num_documents": stats.documents,
        "num_tokens": stats.tokens["text"],
        "text_bytes": sum(len(d["text"].encode("utf-8")) for d in docs),
        "vocab_size": tokenizer.vocab_size,
        "fingerprint": _sha256(files),
        "jsonl_sha256": _sha256([jsonl]),
        "python": sys.version.split()[0],
        "seconds": {"gather": round(t1 - t0, 2), "tokenizer": round(t2 - t1, 2),
                    "preprocess": round(t3 - t2, 2), "total": round(t3 - t0, 2)},
    }


def _load_manifest(directory: str) -> Optional[dict]:
    """The manifest if the build in `directory` is complete and current, else None."""
    try:
        with open(os.path.join(directory, MANIFEST), encoding="utf-8") as f:
            m = json.load(f)
        names = [m["jsonl"], m["vocab_file"], m["merge_file"], m["data_prefix"] + ".bin", m["data_prefix"] + ".idx"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if m.get("version") != VERSION or not all(os.path.isfile(os.path.join(directory, n)) for n in names):
        return None
    return m


def build_cached(final_dir: str, build: Callable[[str], dict]) -> dict:
    """Return the manifest in final_dir, running build(tmp_dir) first if there is none.

    Safe for concurrent callers: one builds under an exclusive fcntl lock; the temp directory
    is renamed into place only when complete (the manifest is its last file).
    """
    manifest = _load_manifest(final_dir)
    if manifest is not None:  # fast path: no lock
        return manifest
    parent = os.path.dirname(os.path.abspath(final_dir))
    os.makedirs(parent, exist_ok=True)
    with open(final_dir.rstrip("/") + ".lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # blocks while another process builds
        try:
            manifest = _load_manifest(final_dir)
            if manifest is not None:
                return manifest
            _remove_stale(final_dir)
            tmp = tempfile.mkdtemp(prefix=os.path.basename(final_dir) + ".tmp-", dir=parent)
            os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache may be shared
            try:
                manifest = build(tmp)
                with open(os.path.join(tmp, MANIFEST), "w", encoding="utf-8") as f:
                    json.dump(manifest, f, indent=2)
                try:
                    os.replace(tmp, final_dir)
                except OSError:  # another builder got there first (a lock that did not hold, e.g. NFS)
                    manifest = _load_manifest(final_dir)
                    if manifest is None:
                        raise
            finally:
                if os.path.isdir(tmp):
                    shutil.rmtree(tmp, ignore_errors=True)
            return manifest
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _remove_stale(final_dir: str, min_age_s: float = 3600) -> None:
    """Remove an incomplete final_dir and temp dirs left by builds that died over an hour ago."""
    if os.path.isdir(final_dir):
        shutil.rmtree(final_dir, ignore_errors=True)
    parent, base = os.path.split(os.path.abspath(final_dir))
    for name in os.listdir(parent):
        path = os.path.join(parent, name)
        if name.startswith(base + ".tmp-") and time.time() - os.path.getmtime(path) > min_age_s:
            shutil.rmtree(path, ignore_errors=True)


def default_cache_dir() -> str:
    """$MEGATRON_CC_CACHE, else <repo>/.cache/default_corpus, else ~/.cache/megatron-cc/default_corpus."""
    env = os.environ.get("MEGATRON_CC_CACHE")
    if env:
        return env
    repo = Path(__file__).resolve().parents[2]   # megatron/training/data/corpus.py -> the checkout
    if (repo / "pyproject.toml").is_file() and os.access(repo, os.W_OK):
        return str(repo / ".cache" / "default_corpus")
    return str(Path.home() / ".cache" / "megatron-cc" / "default_corpus")


def default_assets(cache_dir: Optional[str] = None, max_bytes: int = DEFAULT_MAX_BYTES) -> DefaultAssets:
    """Build (once) and return the embedded corpus and tokenizer; every rank may call this."""
    final_dir = os.path.join(os.path.abspath(cache_dir or default_cache_dir()), f"{VERSION}-{max_bytes}")

    def build(tmp: str) -> dict:
        print(f"megatron-cc: building the default corpus in {final_dir} (once, under a minute)...",
              file=sys.stderr, flush=True)
        m = build_assets(tmp, max_bytes)
        print(f"megatron-cc: default corpus: {m['num_documents']:,} documents, {m['num_tokens']:,} tokens, "
              f"built in {m['seconds']['total']:.0f}s", file=sys.stderr, flush=True)
        return m

    m = build_cached(final_dir, build)
    path = lambda name: os.path.join(final_dir, name)  # noqa: E731
    return DefaultAssets(
        jsonl=path(m["jsonl"]), vocab_file=path(m["vocab_file"]), merge_file=path(m["merge_file"]),
        data_prefix=path(m["data_prefix"]), num_documents=m["num_documents"], num_tokens=m["num_tokens"],
        vocab_size=m["vocab_size"], fingerprint=m["fingerprint"], directory=final_dir,
    )
