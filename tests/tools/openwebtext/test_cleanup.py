"""cleanup_dataset (ftfy, English only, short documents) and cleanup_fix_dataset tasks."""

import random

import pytest

from tests.tools.openwebtext.helpers import read_jsonl, train_tiny_bpe, write_jsonl
from tools.openwebtext import cleanup_dataset, cleanup_fix_dataset
from tools.openwebtext import synthetic as syn


@pytest.fixture(scope="module")
def mixed_docs():
    rng = random.Random(5)
    english = [{"text": syn.english_document(rng, rng.randint(160, 260)), "url": f"en{i}"} for i in range(12)]
    foreign = [{"text": syn.foreign_document(rng, lang, 200), "url": f"{lang}{i}"}
               for i, lang in enumerate(["de", "fr", "es", "de", "fr", "es"])]
    short = [{"text": syn.english_document(rng, rng.randint(15, 35)), "url": f"short{i}"} for i in range(4)]
    fixed = {}
    for d in english[:4]:  # plant mojibake: accented words, then UTF-8 read as cp1252
        words = d["text"].split(" ")
        for w in syn.ACCENTED[:4]:
            words.insert(rng.randrange(len(words)), w)
        fixed[d["url"]] = " ".join(words)
        d["text"] = syn.mojibake(fixed[d["url"]])
        assert "Ã" in d["text"]
    return english, foreign, short, fixed


@pytest.mark.parametrize("tokenizer", ["words", "bpe"])
def test_drops_non_english_and_short_and_repairs_mojibake(tmp_path, mixed_docs, tokenizer):
    english, foreign, short, fixed = mixed_docs
    docs = english + foreign + short + [{"text": "1234 5678 !!!", "url": "digits"}]
    src = write_jsonl(tmp_path / "raw.json", docs, extra_lines=["{broken", '{"url": "no-text"}'])
    out = tmp_path / "clean.json"
    argv = [src, str(out), "--min-tokens", "128", "--workers", "2", "--no-progress"]
    if tokenizer == "bpe":
        vocab, merges = train_tiny_bpe([d["text"] for d in english], tmp_path / "tok")
        argv += ["--vocab-file", vocab, "--merge-file", merges]
    res = cleanup_dataset.main(argv)
    kept = read_jsonl(out)

    assert [d["url"] for d in kept] == [d["url"] for d in english]
    for d in kept:
        if d["url"] in fixed:
            assert d["text"] == fixed[d["url"]]  # ftfy restored every accented word
        assert "Ã" not in d["text"]
    unit = "bpe_tokens" if tokenizer == "bpe" else "words"
    assert res["dropped"] == {"not_en (de)": 2, "not_en (fr)": 2, "not_en (es)": 2,
                              f"under_128_{unit}": 4, "language_undetected": 1,
                              "malformed_json": 1, "missing_text": 1}
    assert res["notes"]["ftfy_fixed_text"] == 4 and res["kept"] == len(english)


def test_token_threshold_counts_bpe_tokens_not_words(tmp_path, mixed_docs):
    english = mixed_docs[0]
    vocab, merges = train_tiny_bpe([d["text"] for d in english], tmp_path / "tok", vocab_size=300)
    counter = cleanup_dataset.TokenCounter(vocab, merges)
    text = english[5]["text"]
    n_words, n_tokens = len(text.split()), counter(text)
    assert counter.unit == "bpe_tokens" and n_tokens > n_words  # a 300-entry BPE splits words
    doc = write_jsonl(tmp_path / "one.json", [english[5]])
    between = str((n_words + n_tokens) // 2)
    base = [doc, str(tmp_path / "o.json"), "--min-tokens", between, "--no-progress"]
    assert cleanup_dataset.main(base)["kept"] == 0  # too few words ...
    with_bpe = base + ["--vocab-file", vocab, "--merge-file", merges]
    assert cleanup_dataset.main(with_bpe)["kept"] == 1  # ... but enough tokens


def test_vocab_without_merges_is_an_error(tmp_path):
    with pytest.raises(SystemExit):
        cleanup_dataset.main(["a.json", "b.json", "--vocab-file", "v.json"])


def test_cleanup_fix_tasks(tmp_path):
    long_en = "This is a plain English sentence about the river and the town. " * 10
    docs = [
        {"text": "Caf\u00c3\u00a9 \t\t and   spaces\r\n\n\n\nline two  \x07", "url": "fix"},
        {"text": "Please enable JavaScript to view this page.", "url": "js"},
        {"text": "Der Hund und die Katze sind heute nicht zu Hause.", "url": "short_de"},
        {"text": "A short English note about the weather today.", "url": "short_en"},
        {"text": long_en, "url": "long_en"},
    ]
    src = write_jsonl(tmp_path / "in.json", docs)
    out_dir = tmp_path / "out"

    res = cleanup_fix_dataset.main(["--input-files", src, "--output-path", str(out_dir), "--tasks",
                                    "ftfy_fix_text", "general_cleaning", "--no-progress"])
    first = read_jsonl(out_dir / "in_cleaned.json")[0]
    assert first["text"] == "Café and spaces\n\nline two"
    assert res["kept"] == 5 and res["notes"] == {"changed_by_ftfy_fix_text": 1, "changed_by_general_cleaning": 2}

    res = cleanup_fix_dataset.main(["--input-files", src, "--output-path", str(out_dir), "--tasks",
                                    "remove_256_javascript", "remove_512_non_english", "--write-dropped",
                                    "--no-progress"])
    assert [d["url"] for d in read_jsonl(out_dir / "in_cleaned.json")] == ["fix", "short_en", "long_en"]
    assert {d["url"]: d["drop_reason"] for d in read_jsonl(out_dir / "in_dropped.json")} == \
        {"js": "remove_256_javascript", "short_de": "remove_512_non_english"}

    res = cleanup_fix_dataset.main(["--input-files", src, "--output-path", str(out_dir), "--tasks",
                                    "remove_512", "--no-progress"])
    assert [d["url"] for d in read_jsonl(out_dir / "in_cleaned.json")] == ["long_en"]
    res = cleanup_fix_dataset.main(["--input-files", src, "--output-path", str(out_dir), "--min-chars", "45",
                                    "--no-progress"])
    assert res["dropped"] == {"under_45_chars": 2}


def test_cleanup_fix_help_explains_every_task(capsys):
    with pytest.raises(SystemExit):
        cleanup_fix_dataset.main(["--help"])
    text = capsys.readouterr().out
    for task in cleanup_fix_dataset.TASKS:
        assert text.count(task) >= 2, task  # listed, and described in the task table
