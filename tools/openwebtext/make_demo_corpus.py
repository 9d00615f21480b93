"""Write a raw demo corpus, with every problem the pipeline removes planted in it.

Base documents are either generated English prose (--base synthetic, default, instant)
or the project's embedded corpus (--base embedded: real docstrings and documentation of
this Python install, see megatron/training/data/corpus.py). On top of them are planted:
near-duplicates (a few words edited), repeated URLs, blacklisted and malformed URLs,
German/French/Spanish pages, short pages, mojibake, passages of two local "task" files
(lambada- and squad-shaped) pasted into training documents, one document pasted with
too many of them, and malformed JSON lines.

Output (in --output-dir):
  raw/shard_00.json ...   the raw loose-JSON shards {"text", "url"}
  tasks/lambada.jsonl     {"text"} passages          (decontamination targets)
  tasks/squad.jsonl       {"title", "context", "question", "answers"}
  planted.json            which URLs carry which plant (for checking the outputs)
  vocab.json, merges.txt  with --tokenizer: a byte-level BPE trained on the base text

    python tools/openwebtext/make_demo_corpus.py --output-dir demo --tokenizer
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tools.openwebtext` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.openwebtext import synthetic as syn
from tools.openwebtext.jsonl_io import Summary, atomic_output, dump_line

EOD = "<|endoftext|>"
MALFORMED_LINES = ['{"text": "unterminated', "[1, 2, 3]", '{"url": "https://no-text.example/a"}']


def embedded_texts(min_chars: int = 1500) -> list[str]:
    """Longer prose documents of the embedded corpus (built and cached on first use)."""
    from megatron.training.data.corpus import default_assets
    assets = default_assets()
    with open(assets.jsonl, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    return [t for t in texts if len(t) >= min_chars]


def _paste(text: str, snippets: list[str], rng: random.Random) -> str:
    """Insert snippets between sentences, spread evenly over the text."""
    sentences = text.split(". ")
    step = max(1, len(sentences) // (len(snippets) + 1))
    for k, snip in enumerate(reversed(snippets)):
        pos = min(len(sentences), step * (len(snippets) - k))
        sentences.insert(pos, snip)
    return ". ".join(sentences)


def build_demo(out_dir: str | Path, n_docs: int = 120, seed: int = 0, shards: int = 2,
               base_texts: list[str] | None = None) -> dict:
    """Write the demo corpus; returns the planted manifest (also saved as planted.json)."""
    rng = random.Random(seed)
    out = Path(out_dir)
    if base_texts is None:
        base_texts = [syn.english_document(rng, rng.randint(180, 320)) for _ in range(n_docs)]
    base_texts = base_texts[:n_docs]
    docs = [{"text": t, "url": syn.url_for(rng, i)} for i, t in enumerate(base_texts)]
    planted: dict[str, list] = {k: [] for k in (
        "near_duplicates", "repeated_urls", "blacklisted", "malformed_urls", "non_english", "short",
        "mojibake", "contaminated", "over_contaminated")}

    # tasks: lambada-like passages and squad-like records, made from their own vocabulary draw
    task_rng = random.Random(seed + 1)
    lambada = [syn.english_document(task_rng, task_rng.randint(60, 90)) for _ in range(20)]
    squad = [{"title": f"Topic {i}", "context": syn.english_document(task_rng, 80),
              "question": syn.english_document(task_rng, 10), "answers": {"text": ["an answer"]}}
             for i in range(10)]

    n = len(docs)
    for i in rng.sample(range(n), max(1, n // 10)):  # near-duplicates with a new URL
        dup = {"text": syn.near_duplicate(docs[i]["text"], rng, rng.randint(1, 3)), "url": syn.url_for(rng, n + i)}
        docs.append(dup)
        planted["near_duplicates"].append([docs[i]["url"], dup["url"]])
    for i in rng.sample(range(n), 3):  # the same URL again
        docs.append(dict(docs[i]))
        planted["repeated_urls"].append(docs[i]["url"])
    for url in ["https://www.youtube.com/watch?v=abc123", "https://i.imgur.com/xyz.html",
                "https://northgazette.example/files/report.pdf", "https://dailyfield.example/img/photo.JPG"]:
        docs.append({"text": syn.english_document(rng, 200), "url": url})
        planted["blacklisted"].append(url)
    for url in ["htp://broken.example/page", "no url here"]:
        docs.append({"text": syn.english_document(rng, 200), "url": url})
        planted["malformed_urls"].append(url)
    for k, lang in enumerate(["de", "fr", "es", "de", "fr", "es"]):
        docs.append({"text": syn.foreign_document(rng, lang, 200), "url": syn.url_for(rng, 10_000 + k)})
        planted["non_english"].append(docs[-1]["url"])
    for k in range(5):
        docs.append({"text": syn.english_document(rng, rng.randint(20, 60)), "url": syn.url_for(rng, 20_000 + k)})
        planted["short"].append(docs[-1]["url"])

    clean_ids = [i for i in range(n) if all(docs[i]["url"] not in p for p in planted["near_duplicates"])
                 and docs[i]["url"] not in planted["repeated_urls"]]
    chosen = rng.sample(clean_ids, 12)
    for i in chosen[:4]:  # mojibake
        words = docs[i]["text"].split(" ")
        for w in rng.sample(syn.ACCENTED, 3):
            words.insert(rng.randrange(len(words)), w)
        fixed = " ".join(words)
        docs[i]["text"] = syn.mojibake(fixed)
        planted["mojibake"].append({"url": docs[i]["url"], "fixed": fixed})
    for j, i in enumerate(chosen[4:11]):  # one task passage pasted in
        source = lambada[j] if j < 5 else squad[j - 5]["context"]
        words = source.split(" ")
        start = rng.randrange(0, len(words) - 20)
        snippet = " ".join(words[start:start + 20])
        docs[i]["text"] = _paste(docs[i]["text"], [snippet], rng)
        planted["contaminated"].append({"url": docs[i]["url"], "snippet": snippet, "text": docs[i]["text"]})
    long_text = syn.english_document(rng, 1500)  # too many task passages: dropped whole
    snippets = [" ".join(lambada[k].split(" ")[:16]) for k in range(12)]
    docs.append({"text": _paste(long_text, snippets, rng), "url": syn.url_for(rng, 30_000)})
    planted["over_contaminated"].append(docs[-1]["url"])

    rng.shuffle(docs)
    lines = [dump_line(d) for d in docs]
    for k, bad in enumerate(MALFORMED_LINES):
        lines.insert((k + 1) * len(lines) // (len(MALFORMED_LINES) + 1), bad + "\n")
    per_shard = -(-len(lines) // shards)
    for s in range(shards):
        with atomic_output(out / "raw" / f"shard_{s:02d}.json") as f:
            f.writelines(lines[s * per_shard:(s + 1) * per_shard])
    with atomic_output(out / "tasks" / "lambada.jsonl") as f:
        f.writelines(dump_line({"text": t}) for t in lambada)
    with atomic_output(out / "tasks" / "squad.jsonl") as f:
        f.writelines(dump_line(r) for r in squad)
    manifest = dict(planted, documents=len(docs), malformed_json_lines=len(MALFORMED_LINES),
                    base_documents=n, base_texts=base_texts)
    with atomic_output(out / "planted.json") as f:
        json.dump(manifest, f, ensure_ascii=False, indent=1)
    return manifest


def train_tokenizer(texts: list[str], out_dir: str | Path, vocab_size: int = 1024) -> tuple[str, str]:
    """Byte-level BPE in GPT-2's file format (vocab.json, merges.txt) with <|endoftext|>."""
    from tokenizers import ByteLevelBPETokenizer
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2, special_tokens=[EOD],
                            show_progress=False)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save_model(str(out_dir))
    return str(out_dir / "vocab.json"), str(out_dir / "merges.txt")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output-dir", required=True, help="directory to write the demo into.")
    p.add_argument("--base", choices=["synthetic", "embedded"], default="synthetic",
                   help="base documents: generated prose (default) or the embedded corpus "
                        "(built and cached on first use, about half a minute).")
    p.add_argument("--docs", type=int, default=120, help="base documents before plants (default 120).")
    p.add_argument("--shards", type=int, default=2, help="raw shards to split the corpus into (default 2).")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0).")
    p.add_argument("--tokenizer", action="store_true",
                   help="also train a byte-level BPE on the base text and save vocab.json/merges.txt.")
    p.add_argument("--vocab-size", type=int, default=1024, help="vocabulary size for --tokenizer (default 1024).")
    return p


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    base = embedded_texts() if args.base == "embedded" else None
    manifest = build_demo(args.output_dir, args.docs, args.seed, args.shards, base)
    summary = Summary("make_demo_corpus")
    summary.keep(manifest["documents"])
    for key in ("near_duplicates", "repeated_urls", "blacklisted", "malformed_urls", "non_english", "short",
                "mojibake", "contaminated", "over_contaminated"):
        summary.note(f"planted_{key}", len(manifest[key]))
    summary.note("planted_malformed_json_lines", manifest["malformed_json_lines"])
    if args.tokenizer:
        vocab, merges = train_tokenizer(manifest["base_texts"], args.output_dir, args.vocab_size)
        print(f"[make_demo_corpus] tokenizer: {vocab} {merges}", file=sys.stderr)
    summary.report()
    return summary.as_dict()


if __name__ == "__main__":
    main()
