"""13-gram decontamination: cut with margins, split, drop short pieces and over-split documents."""

import json
import random

import pytest

from tests.tools.openwebtext.helpers import read_jsonl, write_jsonl
from tools.openwebtext import filter_ngrams
from tools.openwebtext import synthetic as syn

MARGIN = 200


@pytest.fixture()
def tasks(tmp_path):
    rng = random.Random(3)
    lambada = [syn.english_document(rng, 70) for _ in range(5)]
    squad = [{"title": "T", "context": syn.english_document(rng, 60), "question": "What did the river keeper "
              "say to the town council yesterday", "answers": {"text": ["nothing"]}} for _ in range(3)]
    d = tmp_path / "tasks"
    write_jsonl(d / "lambada.jsonl", [{"text": t} for t in lambada], extra_lines=["{broken"])
    write_jsonl(d / "squad.jsonl", squad)
    return d, lambada, squad


def _filler(rng, n_chars):
    text = syn.english_document(rng, n_chars // 4)
    assert len(text) >= n_chars
    return text[:n_chars]


def _run(tmp_path, docs, task_dir, *extra):
    src = write_jsonl(tmp_path / "train.json", docs)
    out = tmp_path / "out.json"
    res = filter_ngrams.main(["--tasks", "lambada", "squad", "--task-dir", str(task_dir), "--dedup-dataset",
                              src, "text", "--output", str(out), "--no-progress", *extra])
    return res, read_jsonl(out)


def _all_task_ngrams(lambada, squad, n=13):
    grams = set()
    for t in lambada + [s["context"] for s in squad]:
        w, _ = filter_ngrams.words_with_spans(t)
        grams.update(tuple(w[i:i + n]) for i in range(len(w) - n + 1))
    return grams


def test_planted_13gram_removed_with_margins(tmp_path, tasks):
    task_dir, lambada, squad = tasks
    rng = random.Random(9)
    snippet = " ".join(lambada[2].split(" ")[10:26])  # 16 task words: four 13-grams
    before, after = _filler(rng, 900), _filler(rng, 700)
    text = before + " " + snippet + " " + after
    start = len(before) + 1
    end = start + len(snippet)
    clean = _filler(rng, 1200)
    res, out = _run(tmp_path, [{"text": text, "url": "dirty", "extra": 1}, {"text": clean, "url": "clean"}],
                    task_dir, "--workers", "2")

    expected = [text[:start - MARGIN].strip(), text[end + MARGIN:].strip()]
    assert [d["text"] for d in out] == expected + [clean]
    assert [d["url"] for d in out] == ["dirty", "dirty", "clean"] and out[0]["extra"] == 1
    grams = _all_task_ngrams(lambada, squad)
    for d in out:
        w, _ = filter_ngrams.words_with_spans(d["text"])
        assert not grams & {tuple(w[i:i + 13]) for i in range(len(w) - 12)}
    assert res["notes"]["matches_lambada"] == 4 and res["notes"]["documents_contaminated"] == 1
    assert res["notes"]["task_files_malformed_json"] == 1


def test_short_pieces_dropped_and_margins_are_flags(tmp_path, tasks):
    task_dir, lambada, _ = tasks
    rng = random.Random(4)
    snippet = " ".join(lambada[0].split(" ")[:14])
    before, after = _filler(rng, 350), _filler(rng, 1000)  # 350 - 200 = 150 chars left before: too short
    text = before + " " + snippet + " " + after
    res, out = _run(tmp_path, [{"text": text, "url": "u"}], task_dir)
    end = len(before) + 1 + len(snippet)
    assert [d["text"] for d in out] == [text[end + MARGIN:].strip()]
    assert res["notes"]["pieces_dropped_short"] == 1

    res, out = _run(tmp_path, [{"text": text, "url": "u"}], task_dir, "--remove-char-each-side", "50",
                    "--filter-text-char-len", "100")
    assert [d["text"] for d in out] == [text[:len(before) + 1 - 50].strip(), text[end + 50:].strip()]

    # nothing long enough left: the document goes
    res, out = _run(tmp_path, [{"text": before[:150] + " " + snippet + " " + after[:150], "url": "u"}], task_dir)
    assert out == [] and res["dropped"] == {"all_pieces_short": 1}


@pytest.mark.parametrize("n_snippets, splits_count, dropped", [(11, 10, True), (10, 10, False), (4, 3, True)])
def test_documents_split_too_often_are_dropped(tmp_path, tasks, n_snippets, splits_count, dropped):
    task_dir, lambada, _ = tasks
    rng = random.Random(n_snippets)
    parts = [_filler(rng, 700)]
    for k in range(n_snippets):  # 700 filler chars between matches: cuts do not merge
        parts += [" ".join(lambada[k % 5].split(" ")[k:k + 13]), _filler(rng, 700)]
    res, out = _run(tmp_path, [{"text": " ".join(parts), "url": "u"}], task_dir,
                    "--splits-count", str(splits_count))
    if dropped:
        assert out == [] and res["dropped"] == {f"split_more_than_{splits_count}_times": 1}
    else:
        assert len(out) == n_snippets + 1 and all(len(d["text"]) >= 200 for d in out)


def test_overlapping_cuts_merge():
    matches = [(100, 150, "t"), (300, 320, "t"), (1000, 1100, "t")]
    assert filter_ngrams.cut_intervals(matches, 1200, 200) == [(0, 520), (800, 1200)]
    assert filter_ngrams.cut_intervals(matches, 1200, 10) == [(90, 160), (290, 330), (990, 1110)]


def test_short_task_texts_match_whole_and_keys_select_fields(tmp_path, tasks):
    task_dir, _, _ = tasks
    rng = random.Random(1)
    question = "What did the river keeper say to the town council yesterday"  # 11 words < 13
    text = _filler(rng, 800) + " " + question.upper() + "! " + _filler(rng, 800)
    res, out = _run(tmp_path, [{"text": text, "url": "q"}], task_dir)
    assert len(out) == 2 and res["notes"]["matches_squad"] == 1
    assert all("RIVER KEEPER" not in d["text"] for d in out)  # matched case- and punctuation-blind

    # --task-keys context: questions are no longer task text
    src = write_jsonl(tmp_path / "t.json", [{"text": text, "url": "q"}])
    res = filter_ngrams.main(["--task-files", str(task_dir / "squad.jsonl"), "--task-keys", "context",
                              "--dedup-dataset", src, "text", "--output", str(tmp_path / "o.json"),
                              "--no-progress"])
    assert "documents_contaminated" not in res["notes"] and res["kept"] == 1
    # --min-ngram-size above the question's length: not matched either
    res = filter_ngrams.main(["--task-files", str(task_dir / "squad.jsonl"), "--min-ngram-size", "12",
                              "--dedup-dataset", src, "text", "--output", str(tmp_path / "o.json"),
                              "--no-progress"])
    assert "documents_contaminated" not in res["notes"]


def test_plain_text_task_file_and_missing_task(tmp_path):
    words = "one two three four five six seven eight nine ten eleven twelve thirteen".split()
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "lines.txt").write_text(" ".join(words) + "\n\nunrelated line\n")
    text = "x" * 400 + " " + " ".join(words) + " " + "y" * 400
    src = write_jsonl(tmp_path / "d.json", [{"body": text}], extra_lines=["not json"])
    res = filter_ngrams.main(["--tasks", "lines", "--task-dir", str(tmp_path / "tasks"), "--dedup-dataset", src,
                              "body", "--output", str(tmp_path / "o.json"), "--no-progress"])
    assert [d["body"] for d in read_jsonl(tmp_path / "o.json")] == ["x" * 201, "y" * 201]
    assert res["dropped"] == {"malformed_json": 1}
    with pytest.raises(SystemExit):
        filter_ngrams.main(["--tasks", "squad", "--task-dir", str(tmp_path / "tasks"), "--dedup-dataset", src,
                            "body", "--output", str(tmp_path / "o.json")])
    assert json.loads((tmp_path / "o.json").read_text().splitlines()[0])  # earlier output untouched
    # the seed's --lambada-path: a local file read as the task "lambada"
    res = filter_ngrams.main(["--lambada-path", str(tmp_path / "tasks" / "lines.txt"), "--dedup-dataset", src,
                              "body", "--output", str(tmp_path / "o2.json"), "--no-progress"])
    assert res["notes"]["matches_lambada"] == 1
