"""Losses of the layout-equivalence, resume and interleaving tests' runs, number for number, so
that two environments (megatron-core 0.16.1 on Python 3.11, 0.19.x on 3.12) can be compared.

The runs are the tests' own workers (tests/training/test_equivalence.py, test_resume.py,
test_interleaved.py) on one fixed corpus, built once into --corpus from the first environment's
standard library and reused by the second, so both train on the same tokens.

    .venv/bin/python bench/release_losses.py --corpus /tmp/cmp_corpus --out /tmp/a.json
    .venv312/bin/python bench/release_losses.py --corpus /tmp/cmp_corpus --out /tmp/b.json
    python bench/release_losses.py --compare /tmp/a.json /tmp/b.json
"""
import argparse
import json
import os
import pathlib
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("OMP_NUM_THREADS", "1")
PARTS = ("equivalence", "resume", "interleaved")


def corpus(directory: str) -> dict:
    """The corpus of both environments: made once, from this Python's standard library."""
    info = os.path.join(directory, "corpus.json")
    if os.path.exists(info):
        with open(info) as f:
            return json.load(f)
    from tests.conftest import make_tiny_corpus   # the suite's tiny corpus, kept on disk
    os.makedirs(directory, exist_ok=True)
    c = make_tiny_corpus(pathlib.Path(directory))
    with open(info, "w") as f:
        json.dump(c, f)
    return c


def measure(c: dict, parts, out: dict, save) -> None:
    from tests.distributed import run_distributed
    work = tempfile.mkdtemp(prefix="release-losses-")
    if "equivalence" in parts:
        from tests.training import test_equivalence as te
        runs = [(1, [(1, 1, a) for a in te.ARCHS]),
                (2, [(2, 1, "gpt2"), (1, 2, "gpt2"), (1, 1, "gpt2")]), (4, [(1, 4, "gpt2")]),
                (8, [(2, 2, "gpt2"), (2, 2, "llama")])]
        for world, layouts in runs:
            res = run_distributed(te._layouts_worker, world, (c, layouts), timeout=1800)[-1]
            out.update({f"equivalence {k}": v for k, v in res.items()})
            save()
    if "resume" in parts:
        from tests.training import test_resume as tr
        res = run_distributed(tr._worker, 8, (c, os.path.join(work, "resume")), timeout=1800)
        out.update(zip(("resume straight", "resume first", "resume resumed"), res[-1]))
        save()
    if "interleaved" in parts:
        from tests.training import test_interleaved as ti
        plain, distopt, every = run_distributed(ti._composed, 8,
                                                (c, os.path.join(work, "inter")),
                                                timeout=3000)[-1]
        out["interleaved plain"] = plain
        out["interleaved distopt straight"], out["interleaved distopt resumed"] = distopt
        out["interleaved every straight"], out["interleaved every resumed"] = every
        save()


def compare(a: dict, b: dict) -> int:
    keys = [k for k in a if k not in ("megatron_core", "python")]
    same = [k for k in keys if a[k] == b.get(k)]
    print(f"{a['megatron_core']} / Python {a['python']} against {b['megatron_core']} / "
          f"Python {b['python']}: {len(same)} of {len(keys)} runs bit-identical")
    for k in keys:
        if a[k] != b.get(k):
            print(f"  {k}: {a[k]} | {b.get(k)}")
    return 0 if len(same) == len(keys) else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", default=os.path.join(tempfile.gettempdir(), "release_corpus"))
    p.add_argument("--out", help="the losses of this environment, as JSON")
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    p.add_argument("--compare", nargs=2, metavar=("A", "B"))
    a = p.parse_args(argv)
    if a.compare:
        with open(a.compare[0]) as f, open(a.compare[1]) as g:
            return compare(json.load(f), json.load(g))
    if not a.out:
        p.error("give --out (or --compare A B)")
    import megatron.core
    out = {"megatron_core": megatron.core.__version__, "python": sys.version.split()[0]}

    def save():
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    measure(corpus(a.corpus), a.parts, out, save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
