"""Every link in the README and docs/ resolves: relative targets exist, and a `#section`
points at a heading of the target page (GitHub's anchor rules). Paths written in backquotes
that name a file of the repository (`megatron/cc/...py`, `bench/...`) must exist too."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_PATH = re.compile(r"`((?:megatron|tools|bench|tests|docs|examples|ASPLOS23)/[\w./-]+)`")


def _anchors(page: Path) -> set:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens,
    repeats numbered."""
    seen, out = {}, set()
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        text = line.lstrip("#").strip().lower()
        text = re.sub(r"[`*]", "", re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text))
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _links(page: Path):
    in_code = False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        for m in LINK.finditer(line):
            yield number, m.group(1)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(page):
    broken = []
    for number, target in _links(page):
        if re.match(r"[a-z]+:", target):   # http(s), mailto: not checked offline
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{page.name}:{number}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{page.name}:{number}: {target} (no heading #{anchor})")
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_code_paths_exist(page):
    missing = []
    for number, line in enumerate(page.read_text().splitlines(), 1):
        for m in CODE_PATH.finditer(line):
            path = m.group(1).rstrip(".")
            if not (ROOT / path).exists():
                missing.append(f"{page.name}:{number}: {path}")
    assert not missing, "paths named in the text that do not exist:\n" + "\n".join(missing)


def test_anchor_rules():
    """The slug rules on a known heading shape (the checker itself can fail)."""
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".md", delete=False) as f:
        f.write("# The CPU shim\n## `--dp-mode` and 1F1B (pp 2)\n## The CPU shim\n")
    assert _anchors(Path(f.name)) == {"the-cpu-shim", "--dp-mode-and-1f1b-pp-2",
                                      "the-cpu-shim-1"}
