"""Write the data of the shipped offline lm-eval tasks (run once; the .jsonl files are committed).

    python tools/checkpoint/eval_tasks/make_data.py     # from the repository root

Held out: the text is the docstrings of this repository's tools/, tests/ and bench/, which no
training corpus here contains (megatron/training/data/corpus.py reads only the Python install, and
those directories are never part of the installed package), extracted the way the corpus
extracts docstrings (megatron.training.data.corpus.docstring_text), so it is the training text's
kind of prose.

  heldout_continuation.jsonl  {"context", "choices", "label", "source"}: a docstring (its
      def/class line, then its text) cut before one of its sentences; the choices are that
      sentence and three sentences of similar length from other files (chance 25%)
  heldout_text.jsonl          {"text", "source"}: docstring passages for rolling perplexity

Deterministic for a given tree (sorted files, seeded choices); rerun after those directories
change and the items change with them.
"""
import glob
import json
import os
import random
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from megatron.training.data.corpus import docstring_text  # noqa: E402

SOURCES = ("tools", "tests", "bench")
SEED = 20240601
MC_ITEMS = 200
MC_CONTEXT_CHARS = 400          # the passage before the cut, at most (whole sentences)
SENTENCE_CHARS = (30, 220)      # length of an answer or a distractor
TEXT_DOCS = 50
TEXT_CHARS = (500, 1500)        # a perplexity passage
_ABBREV = re.compile(r"(\b(e\.g|i\.e|vs|etc|cf|Fig|Eq|No)\.|\.\.\.)$")
_HEAD = re.compile(r"^(def|class) \S")


def source_files():
    files = set()
    for d in SOURCES:
        files.update(glob.glob(os.path.join(ROOT, d, "**", "*.py"), recursive=True))
    return sorted(os.path.relpath(f, ROOT) for f in files)


def is_prose(lines) -> bool:
    if not lines or any(ln[:1].isspace() or ln.lstrip()[:1] in "|#>*-" for ln in lines):
        return False   # code, tables, lists
    text = " ".join(lines)
    return sum(c.isalpha() for c in text) >= 0.6 * len(text)


def units(text: str):
    """(head line or '', [its leading prose paragraphs, whitespace collapsed]) for the module
    docstring and each def/class docstring of docstring_text's output."""
    head, paras, prose = "", [], True
    for block in re.split(r"\n\s*\n", text):
        lines = block.strip("\n").splitlines()
        if lines and _HEAD.match(lines[0]):
            if paras:
                yield head, paras
            head, paras, prose, lines = lines[0], [], True, lines[1:]
        prose = prose and is_prose(lines)
        if prose:   # up to the first code block, table or list
            paras.append(" ".join(" ".join(lines).split()))
    if paras:
        yield head, paras


def sentences(para: str):
    out = []
    for piece in re.split(r"(?<=[.!?])\s+", para):
        if out and (piece[:1].islower() or _ABBREV.search(out[-1])):
            out[-1] += " " + piece   # "e.g. x", "1.5 x": not a sentence end
        else:
            out.append(piece)
    return out


def in_range(s: str, bounds) -> bool:
    return bounds[0] <= len(s) <= bounds[1]


def mc_items(docs, rng):
    """Every cut of a docstring before one of its sentences of fitting length (the answer),
    with its def/class line and the sentences before it (at most MC_CONTEXT_CHARS) as the
    context; MC_ITEMS of them, drawn at random, at most half with the def/class line alone
    as the context (a docstring's first sentence)."""
    pool, candidates, head_only = [], [], []
    for src, text in docs:
        for head, paras in units(text):
            sents = [s for p in paras for s in sentences(p)]
            pool += [(src, s) for s in sents if in_range(s, SENTENCE_CHARS)]
            for k in range(len(sents)):
                if not in_range(sents[k], SENTENCE_CHARS):
                    continue
                before = []
                for s in reversed(sents[:k]):
                    if len(" ".join([s] + before)) > MC_CONTEXT_CHARS:
                        break
                    before.insert(0, s)
                context = "\n".join(x for x in (head, " ".join(before)) if x)
                if len(context) >= 20:
                    (candidates if before else head_only).append((src, context, sents[k]))
    rng.shuffle(candidates)
    rng.shuffle(head_only)
    items = []
    for src, context, answer in candidates[:MC_ITEMS // 2] + head_only:
        near = sorted({s for other, s in pool if other != src and s != answer
                       and abs(len(s) - len(answer)) <= 0.3 * len(answer)})
        if len(near) < 3:
            continue
        choices = rng.sample(near, 3) + [answer]
        rng.shuffle(choices)
        items.append({"context": context, "choices": choices,
                      "label": choices.index(answer), "source": src})
        if len(items) == MC_ITEMS:
            break
    return items


def text_docs(docs, rng):
    """Passages of whole docstrings (as the corpus holds them), cut at blank lines."""
    passages = []
    for src, text in docs:
        cur = ""
        for part in text.split("\n\n"):
            joined = f"{cur}\n\n{part}" if cur else part
            if len(joined) > TEXT_CHARS[1]:
                if in_range(cur, TEXT_CHARS):
                    passages.append((src, cur))
                cur = part if len(part) <= TEXT_CHARS[1] else ""
            else:
                cur = joined
        if in_range(cur, TEXT_CHARS):
            passages.append((src, cur))
    rng.shuffle(passages)
    return [{"text": t, "source": s} for s, t in passages[:TEXT_DOCS]]


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} rows, {os.path.getsize(path)} bytes: {os.path.relpath(path)}")


def main() -> int:
    docs = []
    for src in source_files():
        with open(os.path.join(ROOT, src), "rb") as f:
            text = docstring_text(f.read())
        if text:
            docs.append((src, text))
    write_jsonl(os.path.join(HERE, "heldout_continuation.jsonl"),
                mc_items(docs, random.Random(SEED)))
    write_jsonl(os.path.join(HERE, "heldout_text.jsonl"), text_docs(docs, random.Random(SEED)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
