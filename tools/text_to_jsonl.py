"""Turn raw text (e.g. a wikitext-style file) into loose JSON lines for tools/preprocess_data.py.

    python tools/text_to_jsonl.py wiki.train.raw --output wiki.jsonl --split heading
    python tools/preprocess_data.py --input wiki.jsonl --output-prefix data/wiki \\
        --tokenizer-type HuggingFaceTokenizer --tokenizer-model hf/gpt2 --append-eod
    # -> data/wiki_text_document.bin/.idx: pass data/wiki_text_document as --data-path

Documents (--split):
  paragraph  one document per block of text between blank lines (default);
  heading    one document per article of a wikitext file: a new document starts at every
             top-level heading line ' = Title = ' (sub-headings ' = = Part = = ' stay inside);
             the heading is kept as the document's first line;
  line       one document per non-blank line (one example per line).
Lines keep their text; a document's lines are joined with newlines, blank lines inside a
'heading' document are kept. Each output line is {"text": ...}, in input order.
"""
import argparse
import json
import re
import sys
from typing import Iterable, Iterator, List

_TOP_HEADING = re.compile(r"^ ?= [^=].*[^=] = ?$")
# wikitext's tokenised punctuation inside numbers and compounds: "1 @,@ 000", "state @-@ of"
_WIKITEXT_ESCAPES = ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."))


def documents(lines: Iterable[str], split: str = "paragraph") -> Iterator[str]:
    """Documents of a text given as lines (newlines stripped or not)."""
    doc: List[str] = []

    def flush():
        text = "\n".join(doc).strip("\n")
        doc.clear()
        return text

    for raw in lines:
        line = raw.rstrip("\r\n")
        blank = not line.strip()
        if split == "line":
            if not blank:
                yield line
            continue
        if split == "paragraph" and blank:
            if doc:
                yield flush()
            continue
        if split == "heading" and _TOP_HEADING.match(line) and any(l.strip() for l in doc):
            yield flush()
        if not (blank and not doc):  # no leading blank lines
            doc.append(line)
    if any(l.strip() for l in doc):
        yield flush()


def detokenize_wikitext(text: str) -> str:
    for a, b in _WIKITEXT_ESCAPES:
        text = text.replace(a, b)
    return text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n", 2)[2])
    p.add_argument("inputs", nargs="+", help="Text files to read, in order ('-' = stdin).")
    p.add_argument("--output", default="-", help="JSON-lines file to write (default stdout).")
    p.add_argument("--split", default="paragraph", choices=["paragraph", "heading", "line"],
                   help="How the text is cut into documents (see above).")
    p.add_argument("--min-chars", type=int, default=1,
                   help="Drop documents shorter than this many characters (default 1).")
    p.add_argument("--wikitext-detokenize", action="store_true",
                   help="Undo wikitext's ' @-@ ', ' @,@ ', ' @.@ ' escapes.")
    return p


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    out = sys.stdout if a.output == "-" else open(a.output, "w", encoding="utf-8")
    n = 0
    try:
        for path in a.inputs:
            f = sys.stdin if path == "-" else open(path, encoding="utf-8", errors="replace")
            with f:
                for doc in documents(f, a.split):
                    if a.wikitext_detokenize:
                        doc = detokenize_wikitext(doc)
                    if len(doc) >= a.min_chars:
                        out.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")
                        n += 1
    finally:
        if out is not sys.stdout:
            out.close()
    print(f"wrote {n} documents", file=sys.stderr)
    return 0 if n else 1


if __name__ == "__main__":
    sys.exit(main())
