"""bench/quality_corpora.py at tiny sizes: the entropy arithmetic, the code gatherer, and a
deterministic Markov build with a held-out split and its floor."""
import json
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import quality_corpora as qc  # noqa: E402

TINY = dict(max_bytes=60_000, vocab_size=320, words=64, branching=4)


def test_entropy_of_a_chain_computed_by_hand():
    # a -> a or b with 1/2 each, b -> a always: pi = (2/3, 1/3), H = 2/3 ln 2 per step
    pi, h = qc.markov_entropy([[(0, 0.5), (1, 0.5)], [(0, 1.0)]])
    assert pi[0] == pytest.approx(2 / 3, abs=1e-12) and pi[1] == pytest.approx(1 / 3, abs=1e-12)
    assert h == pytest.approx(2 / 3 * math.log(2), abs=1e-12)
    # deterministic cycle: zero entropy, uniform stationary distribution
    pi, h = qc.markov_entropy([[(1, 1.0)], [(2, 1.0)], [(0, 1.0)]])
    assert h == 0 and pi == pytest.approx([1 / 3] * 3)
    with pytest.raises(ValueError):
        qc.markov_entropy([[(0, 0.5)], [(0, 1.0)]])


def test_floor_units():
    # words "a" (2 chars with the space) and "bb" (3), pi = (2/3, 1/3): 7/3 chars per word
    f = qc.markov_floor(["a", "bb"], [2 / 3, 1 / 3], 2 / 3 * math.log(2), words_per_doc=10,
                        tokens_per_doc=11.0, chars_per_token=2.0)
    assert f["mean_chars_per_word"] == pytest.approx(7 / 3)
    assert f["entropy_nats_per_char"] == pytest.approx(2 / 3 * math.log(2) / (7 / 3))
    h_first = -(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3))
    assert f["floor_nats_per_token"] == pytest.approx((h_first + 9 * 2 / 3 * math.log(2)) / 11)


def test_chain_is_seeded_and_irreducible():
    v1, s1 = qc.markov_chain(5, words=32, branching=4)
    v2, s2 = qc.markov_chain(5, words=32, branching=4)
    assert v1 == v2 and s1 == s2 and len(set(v1)) == 32
    assert all({(i + 1) % 32, (i + 2) % 32} <= {j for j, _ in row} for i, row in enumerate(s1))
    assert qc.markov_chain(6, words=32, branching=4)[0] != v1


def test_code_gatherer_drops_docstrings_and_duplicates(tmp_path):
    pkg = tmp_path / "site" / "pkg"
    pkg.mkdir(parents=True)
    body = ('"""Module docstring, prose."""\nimport os\n\n\ndef f(x):\n    """Doc of f."""\n'
            '    # a comment kept\n    return os.path.join(x, "y")  # and this one\n')
    (pkg / "a.py").write_text(body)
    (pkg / "b.py").write_text(body)                       # an exact duplicate: dropped
    (pkg / "c.py").write_text("def g(:\n")                # not Python: nothing kept
    (tmp_path / "site" / "mod.py").write_text("def h(y):\n    # a module of its own\n"
                                              "    return [y, y, y, y, y, y, y, y, y, y, y, y]\n")
    (tmp_path / "site" / "test").mkdir()
    (tmp_path / "site" / "test" / "t.py").write_text(body.replace("os", "sys"))  # skipped
    docs = qc.gather_code(10_000, [str(tmp_path / "site")])
    assert [d["url"] for d in docs] == ["file://stdlib/mod.py#0", "file://stdlib/pkg/a.py#0"]
    text = docs[1]["text"]
    assert "docstring" not in text and "Doc of f" not in text
    assert "# a comment kept" in text and "return os.path.join" in text


def test_tiny_markov_build_is_deterministic_with_held_out_split(tmp_path):
    a = qc.corpus_assets("markov", str(tmp_path / "a"), seed=3, **TINY)
    b = qc.corpus_assets("markov", str(tmp_path / "b"), seed=3, **TINY)
    assert a["fingerprint"] == b["fingerprint"]
    assert qc.corpus_assets("markov", str(tmp_path / "a"), seed=3, **TINY) == a   # cached
    n_train, n_valid, zero = (int(x) for x in a["split"].split(","))
    assert zero == 0 and n_valid >= 1 and n_train + n_valid == a["num_documents"]
    with open(a["jsonl"]) as f:
        docs = [json.loads(line)["text"] for line in f]
    vocab = json.load(open(a["vocab_file"]))
    assert len(vocab) == TINY["vocab_size"]
    m = a["markov"]
    assert 0 < m["entropy_nats_per_word"] <= math.log(TINY["branching"])
    assert m["floor_nats_per_token"] == pytest.approx(
        (m["entropy_nats_first_word"] + (m["words_per_document"] - 1) * m["entropy_nats_per_word"])
        / m["tokens_per_document"])
    assert len(docs) == n_train + n_valid
    train, valid = qc.split_documents([{"text": str(i)} for i in range(len(docs))], 3)
    assert len(valid) == n_valid
    assert sorted(int(d["text"]) for d in train + valid) == list(range(len(docs)))
    flags = qc.data_flags(a)
    assert flags[flags.index("--split") + 1] == a["split"]
