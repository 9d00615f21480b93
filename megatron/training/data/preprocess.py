"""Tokenise a loose-JSON corpus into Megatron's indexed dataset (.bin/.idx), the library part
of tools/preprocess_data.py (its command line), which --task-name and the embedded corpus
builder call too. See the tool's docstring for the format and the handling of bad lines.
"""
from __future__ import annotations

import collections
import json
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from megatron.training.data.tokenizer import TokenizerSpec

# Why a line was skipped -> how the report names it. "empty" lines are skipped but not bad.
BAD_REASONS = {
    "utf8": "not UTF-8",
    "json": "malformed JSON",
    "object": "not a JSON object",
    "key": "missing key",
    "type": "non-string value",
}
MAX_EXAMPLES = 5  # line numbers kept per reason for the report


class PreprocessError(RuntimeError):
    """The input produced no documents (every line bad, or an empty file)."""


@dataclass
class PreprocessStats:
    """What one run read and wrote."""

    lines: int = 0
    """Lines read, blank ones included."""
    documents: int = 0
    """Documents written (the same for every key)."""
    tokens: dict = field(default_factory=dict)
    """Key -> tokens written, EOD included."""
    blank_lines: int = 0
    """Whitespace-only lines (skipped silently)."""
    empty_documents: int = 0
    """Valid lines whose text tokenized to nothing (skipped, not bad)."""
    bad: dict = field(default_factory=dict)
    """Reason (see BAD_REASONS) -> number of skipped lines."""
    bad_examples: dict = field(default_factory=dict)
    """Reason -> the first MAX_EXAMPLES line numbers (1-based)."""
    outputs: dict = field(default_factory=dict)
    """Key -> output path prefix (without .bin/.idx)."""
    input_bytes: int = 0
    seconds: float = 0.0

    def count_skipped(self, status: str, lineno: int) -> None:
        if status == "blank":
            self.blank_lines += 1
        elif status == "empty":
            self.empty_documents += 1
        else:
            self.bad[status] = self.bad.get(status, 0) + 1
            examples = self.bad_examples.setdefault(status, [])
            if len(examples) < MAX_EXAMPLES:
                examples.append(lineno)

    @property
    def bad_lines(self) -> int:
        return sum(self.bad.values())

    def skipped_summary(self, json_keys: Sequence[str] = ("text",)) -> str:
        """E.g. "skipped 3 bad lines: 2 malformed JSON (lines 4, 9); 1 missing key 'text' (line 7)"."""
        parts = []
        for reason, n in self.bad.items():
            name = BAD_REASONS[reason]
            if reason in ("key", "type"):
                name += f" {'/'.join(json_keys)!r}"
            shown = ", ".join(map(str, self.bad_examples[reason]))
            more = ", ..." if n > len(self.bad_examples[reason]) else ""
            parts.append(f"{n:,} {name} (line{'s' if n > 1 else ''} {shown}{more})")
        out = [f"skipped {self.bad_lines:,} bad lines: " + "; ".join(parts)] if parts else []
        if self.empty_documents or self.blank_lines:
            out.append(f"skipped {self.empty_documents:,} empty documents and {self.blank_lines:,} blank lines")
        return "\n".join(out)

    def report(self, json_keys: Sequence[str] = ("text",)) -> str:
        toks = ", ".join(f"{k}: {n:,}" for k, n in self.tokens.items())
        mb_s = self.input_bytes / 1e6 / max(self.seconds, 1e-9)
        lines = [
            f"wrote {self.documents:,} documents ({toks} tokens) from {self.lines:,} lines "
            f"in {self.seconds:.1f}s ({mb_s:.1f} MB/s)"
        ]
        skipped = self.skipped_summary(json_keys)
        if skipped:
            lines.append(skipped)
        lines += [f"  {key}: {prefix}.bin / .idx" for key, prefix in self.outputs.items()]
        return "\n".join(lines)


# ----------------------------------------------------------------------------- workers

_TOKENIZER = None  # one per worker process, built by _init_worker


def _init_worker(spec: TokenizerSpec) -> None:
    global _TOKENIZER
    _TOKENIZER = spec.build()


def _encode_lines(batch, json_keys, append_eod, dtype, tokenizer=None):
    """[(lineno, raw bytes)] -> [(lineno, status, (ids per key) or None)]; status "ok"/"blank"/"empty"/reason."""
    tok = tokenizer or _TOKENIZER
    results, texts, where = [], [], []
    for lineno, raw in batch:
        status, payload = _parse_line(raw, json_keys)
        results.append([lineno, status, None])
        if status == "ok":
            where.append(len(results) - 1)
            texts.extend(payload)
    if texts:
        encode = getattr(tok, "tokenize_batch", None)
        ids = encode(texts) if encode else [tok.tokenize(t) for t in texts]
        nk = len(json_keys)
        for j, r in enumerate(where):
            docs = ids[j * nk:(j + 1) * nk]
            if any(len(d) == 0 for d in docs):  # keep keys aligned: skip the whole line
                results[r][1] = "empty"
                continue
            if append_eod:
                docs = [list(d) + [tok.eod] for d in docs]
            results[r][2] = tuple(np.asarray(d, dtype=dtype) for d in docs)
    return results


def _parse_line(raw: bytes, json_keys):
    if not raw.strip():
        return "blank", None
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "utf8", None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        return "json", None
    if not isinstance(obj, dict):
        return "object", None
    if any(k not in obj for k in json_keys):
        return "key", None
    texts = [obj[k] for k in json_keys]
    if not all(isinstance(t, str) for t in texts):
        return "type", None
    return "ok", texts


def _batches(path: str, size: int) -> Iterator[list]:
    with open(path, "rb") as f:
        batch = []
        for lineno, raw in enumerate(f, start=1):
            batch.append((lineno, raw))
            if len(batch) == size:
                yield batch
                batch = []
        if batch:
            yield batch


def _ordered_results(batches, encode, spec, workers: int):
    """Yield encoded batches in input order; at most 4*workers batches in flight (bounded memory)."""
    if workers <= 1:
        for batch in batches:
            yield batch, encode(batch)
        return
    # spawn, not fork: the parent may hold torch / tokenizers thread pools that fork would copy.
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(workers, initializer=_init_worker, initargs=(spec,)) as pool:
        pending = collections.deque()
        for batch in batches:
            pending.append((batch, pool.apply_async(encode, (batch,))))
            if len(pending) >= 4 * workers:
                b, r = pending.popleft()
                yield b, r.get()
        while pending:
            b, r = pending.popleft()
            yield b, r.get()


# ----------------------------------------------------------------------------- driver


def output_prefix_for(output_prefix: str, key: str) -> str:
    """Megatron's naming: <output-prefix>_<key>_document."""
    return f"{output_prefix}_{key}_document"


def preprocess(
    input: str,
    output_prefix: str,
    tokenizer,
    json_keys: Sequence[str] = ("text",),
    append_eod: bool = True,
    workers: int = 1,
    log_interval: int = 10000,
    chunk_size: int = 64,
    progress: bool = False,
) -> PreprocessStats:
    """Tokenize `input` (loose JSON) into <output_prefix>_<key>_document.bin/.idx per key.

    tokenizer: a built tokenizer or a TokenizerSpec; with workers > 1 each worker builds its
    own from `tokenizer.spec`. Raises PreprocessError if no line yields a document.
    """
    from functools import partial

    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    if not os.path.isfile(input):
        raise FileNotFoundError(f"--input {input} does not exist")
    json_keys = tuple(json_keys)
    spec = tokenizer if isinstance(tokenizer, TokenizerSpec) else getattr(tokenizer, "spec", None)
    if workers > 1 and spec is None:
        raise ValueError("workers > 1 needs a tokenizer with a .spec (or a TokenizerSpec) to rebuild per worker")
    tok = spec.build() if isinstance(tokenizer, TokenizerSpec) else tokenizer
    dtype = DType.optimal_dtype(tok.vocab_size)  # uint16 below 65500 ids, else int32
    encode = partial(
        _encode_lines, json_keys=json_keys, append_eod=append_eod, dtype=dtype,
        tokenizer=tok if workers <= 1 else None,
    )

    out_dir = os.path.dirname(os.path.abspath(output_prefix))
    os.makedirs(out_dir, exist_ok=True)
    final = {k: output_prefix_for(output_prefix, k) for k in json_keys}
    tmp = {k: f"{p}.tmp{os.getpid()}" for k, p in final.items()}
    builders = {k: IndexedDatasetBuilder(tmp[k] + ".bin", dtype=dtype) for k in json_keys}

    stats = PreprocessStats(tokens={k: 0 for k in json_keys})
    total_bytes = os.path.getsize(input)
    bar = _progress_bar(total_bytes, progress)
    start = time.time()
    try:
        for batch, results in _ordered_results(_batches(input, chunk_size), encode, spec, workers):
            for (lineno, raw), (_, status, docs) in zip(batch, results):
                stats.lines += 1
                stats.input_bytes += len(raw)
                if status == "ok":
                    for key, ids in zip(json_keys, docs):
                        builders[key].add_document(ids, [ids.size])
                        stats.tokens[key] += int(ids.size)
                    stats.documents += 1
                    if not bar and log_interval and stats.documents % log_interval == 0:
                        _log_line(stats, start, total_bytes)
                else:
                    stats.count_skipped(status, lineno)
            if bar:
                bar.update(sum(len(raw) for _, raw in batch))
        if bar:
            bar.close()
        stats.seconds = time.time() - start
        if stats.documents == 0:
            if stats.bad_lines and not stats.empty_documents:
                what = f"all {stats.bad_lines:,} non-blank lines are bad"
            elif not stats.bad_lines and not stats.empty_documents:
                what = "it has no non-blank lines"
            else:
                what = f"{stats.bad_lines:,} bad lines, {stats.empty_documents:,} empty documents"
            raise PreprocessError(
                f"--input {input} produced no documents: {what}\n{stats.skipped_summary(json_keys)}"
            )
        for key in json_keys:
            builders[key].finalize(tmp[key] + ".idx")
        for key in json_keys:  # .bin first, .idx last: the index appears once the data is in place
            os.replace(tmp[key] + ".bin", final[key] + ".bin")
            os.replace(tmp[key] + ".idx", final[key] + ".idx")
        stats.outputs = dict(final)
        return stats
    finally:
        for key in json_keys:
            builders[key].data_file.close()
            for ext in (".bin", ".idx"):
                if os.path.exists(tmp[key] + ext):
                    os.remove(tmp[key] + ext)


def _progress_bar(total_bytes: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total_bytes, unit="B", unit_scale=True, desc="tokenizing", file=sys.stderr)


def _log_line(stats: PreprocessStats, start: float, total_bytes: int) -> None:
    dt = max(time.time() - start, 1e-9)
    print(
        f"processed {stats.documents:,} documents ({stats.documents / dt:.0f} docs/s, "
        f"{stats.input_bytes / 1e6 / dt:.1f} MB/s, {100 * stats.input_bytes / max(total_bytes, 1):.0f}%)",
        file=sys.stderr, flush=True,
    )
