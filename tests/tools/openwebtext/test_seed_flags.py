"""The Optimus-CC README's openwebtext commands: filter_ngrams with --lambada-path and its
Megatron-LM flags (--num-threads, --save/--load-dictionary, --key-threshold), find_duplicates'
--jaccard, --heuristic-iter, --jaccard-parallel."""
import random

import pytest

from tests.tools.openwebtext.helpers import read_jsonl, write_jsonl
from tools.openwebtext import filter_ngrams
from tools.openwebtext import synthetic as syn


@pytest.fixture()
def data(tmp_path):
    rng = random.Random(5)
    lambada = [syn.english_document(rng, 70) for _ in range(4)]
    lam = write_jsonl(tmp_path / "lambada_test.jsonl", [{"text": t} for t in lambada])
    squad_dir = tmp_path / "tasks"
    write_jsonl(squad_dir / "squad.jsonl", [{"context": syn.english_document(rng, 60)}])
    snippet = " ".join(lambada[1].split(" ")[5:20])
    docs = [{"text": syn.english_document(rng, 300) + " " + snippet + " " +
             syn.english_document(rng, 300), "url": "dirty"},
            {"text": syn.english_document(rng, 400), "url": "clean"}]
    train = write_jsonl(tmp_path / "train.json", docs)
    return {"lambada": str(lam), "squad_dir": str(squad_dir), "train": train, "docs": docs}


def _run(data, tmp_path, *extra, name="out.json"):
    out = tmp_path / name
    filter_ngrams.main(["--dedup-dataset", data["train"], "text", "--output", str(out),
                        "--no-progress", *extra])
    return read_jsonl(out)


def test_readme_command_with_lambada_path(data, tmp_path):
    """`--tasks lambada squad ... --lambada-path P`: lambada from P, squad from --task-dir."""
    out = _run(data, tmp_path, "--tasks", "lambada", "squad", "--task-dir", data["squad_dir"],
               "--lambada-path", data["lambada"], "--num-threads", "2")
    clean = [d for d in out if d["url"] == "clean"]
    assert clean == [data["docs"][1]]
    dirty = [d for d in out if d["url"] == "dirty"]
    assert dirty and all(len(d["text"]) < len(data["docs"][0]["text"]) for d in dirty)
    # lambada alone, no --task-dir at all (the seed's failing case)
    assert _run(data, tmp_path, "--tasks", "lambada", "--lambada-path", data["lambada"],
                name="o2.json") == out


def test_dictionary_round_trip_gives_the_same_output(data, tmp_path):
    table = tmp_path / "ngrams.json"
    first = _run(data, tmp_path, "--tasks", "lambada", "--lambada-path", data["lambada"],
                 "--save-dictionary", str(table))
    again = _run(data, tmp_path, "--load-dictionary", str(table), name="o2.json")
    assert table.exists() and again == first


def test_key_threshold_keeps_ngrams_common_in_training_data(data, tmp_path):
    """An n-gram in more training documents than --key-threshold is a common phrase: kept."""
    dirty = data["docs"][0]
    train = write_jsonl(tmp_path / "train3.json", [dict(dirty, url=f"d{i}") for i in range(3)])
    args = ["--tasks", "lambada", "--lambada-path", data["lambada"], "--dedup-dataset", train,
            "text", "--no-progress"]
    filter_ngrams.main(args + ["--output", str(tmp_path / "a.json"), "--key-threshold", "2"])
    filter_ngrams.main(args + ["--output", str(tmp_path / "b.json"), "--key-threshold", "3"])
    assert [d["text"] for d in read_jsonl(tmp_path / "a.json")] == [dirty["text"]] * 3
    assert all(d["text"] != dirty["text"] for d in read_jsonl(tmp_path / "b.json"))


def test_find_duplicates_jaccard_kinds_match_exact_sets(tmp_path):
    """--jaccard union|min|avg: each pair's value equals the set formula on its shingles
    (checked with Python sets); pairs under --jaccard-threshold are dropped."""
    from tools.openwebtext import find_duplicates
    from tools.openwebtext.shingling import ShingleConfig, shingle_hashes
    rng = random.Random(11)
    base = syn.english_document(rng, 200)
    docs = [{"url": "a", "text": base}, {"url": "b", "text": base + " extra words at the end"},
            {"url": "c", "text": base[: len(base) * 3 // 4]},
            {"url": "d", "text": syn.english_document(rng, 200)}]
    src = write_jsonl(tmp_path / "docs.json", docs)
    sets = {d["url"]: set(shingle_hashes(d["text"], ShingleConfig()).tolist()) for d in docs}
    formulas = {"union": lambda a, b: len(a & b) / len(a | b),
                "min": lambda a, b: len(a & b) / min(len(a), len(b)),
                "avg": lambda a, b: len(a & b) / ((len(a) + len(b)) / 2)}
    for kind, f in formulas.items():
        out = tmp_path / f"pairs_{kind}.json"
        find_duplicates.main(["--inputs", src, "url", "--output", str(out), "--jaccard", kind,
                              "--heuristic-iter", "1", "--jaccard-parallel", "--no-progress"])
        pairs = [p for p in read_jsonl(out) if "a" in p]
        assert pairs, kind
        for p in pairs:
            assert p["jaccard"] == pytest.approx(f(sets[p["a"]], sets[p["b"]]), abs=1e-4)
            assert p["jaccard"] >= 0.5
        assert not any("d" in (p["a"], p["b"]) for p in pairs)
