"""Small helpers shared by the openwebtext tests."""

import json
from pathlib import Path


def write_jsonl(path, docs, extra_lines=()):
    """Write documents as loose JSON, then any raw (possibly malformed) lines."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
        for line in extra_lines:
            f.write(line + "\n")
    return str(path)


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def train_tiny_bpe(texts, out_dir, vocab_size=600):
    """GPT-2-format vocab.json/merges.txt trained here (no download)."""
    from tools.openwebtext.make_demo_corpus import train_tokenizer
    return train_tokenizer(texts, out_dir, vocab_size)
