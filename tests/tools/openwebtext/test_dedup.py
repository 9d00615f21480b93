"""find_duplicates -> group_duplicate_urls -> remove_group_duplicates, checked against
an exact all-pairs Jaccard computation on the same generated corpus."""

import itertools
import random

import numpy as np
import pytest

from tests.tools.openwebtext.helpers import read_jsonl, write_jsonl
from tools.openwebtext import find_duplicates, group_duplicate_urls, remove_group_duplicates
from tools.openwebtext.exact_all_pairs import all_pairs_jaccard
from tools.openwebtext.shingling import ShingleConfig, Signer, estimated_jaccard, jaccard, shingle_hashes
from tools.openwebtext.synthetic import make_dedup_corpus, near_duplicate

THRESHOLD = 0.9


def _components(n, edges):
    parent = list(range(n))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x
    for i, j in edges:
        parent[find(i)] = find(j)
    groups = {}
    for i in range(n):
        groups.setdefault(find(i), []).append(i)
    return list(groups.values())


@pytest.fixture(scope="module")
def corpus():
    """350 distinct documents, 60 near-duplicates (1-4 words edited) and 12 heavier edits
    (40-60 words changed: similar, but under the 0.9 threshold)."""
    c = make_dedup_corpus(350, 60, seed=7, max_edits=4)
    rng = random.Random(11)
    docs, planted = list(c.docs), list(c.planted)
    for k, src in enumerate(rng.sample(range(len(docs)), 12)):
        docs.append({"text": near_duplicate(docs[src]["text"], rng, rng.randint(40, 60)),
                     "url": f"https://far.example/{k}"})
        planted.append((src, len(docs) - 1))
    hashes = [shingle_hashes(d["text"]) for d in docs]
    exact = all_pairs_jaccard(hashes, THRESHOLD)
    return docs, planted, hashes, exact


def _run_pipeline(tmp_path, docs, workers, extra_lines=()):
    data = write_jsonl(tmp_path / "docs.json", docs, extra_lines)
    pairs, groups, out = (str(tmp_path / n) for n in ("pairs.json", "groups.json", "dedup.json"))
    fd = find_duplicates.main(["--inputs", data, "url", "--output", pairs, "--workers", str(workers),
                               "--no-progress"])
    gd = group_duplicate_urls.main([pairs, groups, "--inputs", data, "url", "--no-progress"])
    rd = remove_group_duplicates.main([groups, data, out, "--no-progress"])
    return fd, gd, rd, read_jsonl(out), read_jsonl(groups)


def test_exact_all_pairs_matches_naive_double_loop(corpus):
    docs, _, hashes, _ = corpus
    sub = hashes[:120] + hashes[-12:]  # include some of the heavier edits
    naive = [(i, j, jaccard(sub[i], sub[j])) for i, j in itertools.combinations(range(len(sub)), 2)]
    for t in (0.05, 0.5, THRESHOLD):
        fast = all_pairs_jaccard(sub, t, block=37)  # a block size that does not divide n
        want = [(i, j) for i, j, v in naive if v >= t]
        assert [(i, j) for i, j, _ in fast] == want
        assert np.allclose([v for *_, v in fast], [v for i, j, v in naive if v >= t])


def test_recall_and_no_distinct_document_removed(tmp_path, corpus):
    docs, planted, hashes, exact = corpus
    _, gd, rd, kept, groups = _run_pipeline(tmp_path, docs, workers=2)
    url_index = {d["url"]: i for i, d in enumerate(docs)}
    kept_ids = {url_index[d["url"]] for d in kept}
    removed = set(range(len(docs))) - kept_ids

    exact_sim = {(i, j): v for i, j, v in exact}
    planted_at_t = [p for p in planted if exact_sim.get(p, 0.0) >= THRESHOLD]
    assert len(planted_at_t) >= 55  # the corpus really has what we measure
    assert any(jaccard(hashes[i], hashes[j]) < THRESHOLD for i, j in planted[-12:])  # and near misses

    group_of = {}
    for g, group in enumerate(groups):
        for url in [group["keep"], *group["remove"]]:
            group_of[url_index[url]] = g
    found = [p for p in planted_at_t if p[0] in group_of and group_of[p[0]] == group_of.get(p[1])]
    assert len(found) / len(planted_at_t) >= 0.95

    # no distinct document removed: whatever was removed has an exact neighbour >= threshold
    has_neighbour = {i for pair in exact_sim for i in pair}
    assert removed <= has_neighbour
    # and each exact duplicate cluster keeps exactly one document when all its pairs were found
    for comp in _components(len(docs), exact_sim):
        if len(comp) > 1:
            assert len(set(comp) & kept_ids) >= 1
    assert len(kept) == len(docs) - len(removed) == rd["kept"]
    assert rd["dropped"] == {"near_duplicate": len(removed)}
    assert gd["dropped"].get("pair_below_threshold", 0) >= 1  # the heavier edits were rejected


def test_minhash_estimate_tracks_exact_jaccard(corpus):
    docs, planted, hashes, _ = corpus
    signer = Signer(128, 1234)
    errors = [abs(estimated_jaccard(signer.signature(hashes[i]), signer.signature(hashes[j]))
                  - jaccard(hashes[i], hashes[j])) for i, j in planted]
    assert np.mean(errors) < 0.05


def test_output_independent_of_workers_and_malformed_lines_skipped(tmp_path, corpus):
    docs = corpus[0][:150]
    bad = ["{not json", '{"url": "https://x.example/no-text"}', '{"text": "no url here"}']
    runs = []
    for w in (1, 2):
        d = tmp_path / f"w{w}"
        fd, _, _, kept, _ = _run_pipeline(d, docs, w, extra_lines=bad)
        runs.append(((d / "pairs.json").read_bytes(), kept))
        assert fd["dropped"] == {"malformed_json": 1, "missing_text": 1, "missing_key": 1}
        assert fd["kept"] == 150
    assert runs[0] == runs[1]


def test_fingerprints_dedup_a_new_shard_against_an_old_one(tmp_path, corpus):
    docs = corpus[0]
    old, new = docs[:200], docs[200:]
    a, b = write_jsonl(tmp_path / "old.json", old), write_jsonl(tmp_path / "new.json", new)
    fp = str(tmp_path / "old.npz")
    find_duplicates.main(["--inputs", a, "url", "--output", str(tmp_path / "p_old.json"),
                          "--save-fingerprints", fp, "--no-progress"])
    res = find_duplicates.main(["--inputs", b, "url", "--load-fingerprints", fp, "--output",
                                str(tmp_path / "p_new.json"), "--no-progress"])
    assert res["notes"]["fingerprints_loaded"] == 200 and res["kept"] == len(new)

    # same candidates as one run over both shards (pairs inside the old shard excepted)
    both = write_jsonl(tmp_path / "both.json", docs)
    find_duplicates.main(["--inputs", both, "url", "--output", str(tmp_path / "p_all.json"), "--no-progress"])
    key = lambda p: (p["a"], p["b"])  # noqa: E731
    all_pairs = {key(p) for p in read_jsonl(tmp_path / "p_all.json")[1:] if p["b_rank"] >= 200}
    assert {key(p) for p in read_jsonl(tmp_path / "p_new.json")[1:]} == all_pairs
    assert any(p["a_rank"] < 200 for p in read_jsonl(tmp_path / "p_new.json")[1:])  # cross-shard pairs exist

    # grouping with only the new texts judges cross-shard pairs by the estimate; old docs are kept
    groups = str(tmp_path / "g.json")
    gd = group_duplicate_urls.main([str(tmp_path / "p_new.json"), groups, "--inputs", b, "url", "--no-progress"])
    assert gd["notes"]["pairs_judged_by_estimate"] >= 1
    old_urls = {d["url"] for d in old}
    for g in read_jsonl(groups):
        assert not old_urls & set(g["remove"])
    remove_group_duplicates.main([groups, b, str(tmp_path / "new_dedup.json"), "--no-progress"])
    assert len(read_jsonl(tmp_path / "new_dedup.json")) < len(new)

    # fingerprints made with other settings are refused, naming the flag
    with pytest.raises(SystemExit, match="--shingle-size"):
        find_duplicates.main(["--inputs", b, "url", "--load-fingerprints", fp, "--shingle-size", "4",
                              "--output", str(tmp_path / "x.json"), "--no-progress"])


def test_word_shingles_and_empty_text():
    a = "The quick brown fox jumps over the lazy dog near the river bank today"
    b = a.replace("lazy", "sleepy")
    cfg = ShingleConfig(3, "word")
    ha, hb = shingle_hashes(a, cfg), shingle_hashes(b, cfg)
    assert ha.size == 12 and jaccard(ha, hb) == pytest.approx(9 / 15)
    assert shingle_hashes("  ").size == 0
    assert jaccard(shingle_hashes("Hello   World"), shingle_hashes("hello world")) == 1.0
    with pytest.raises(ValueError, match="--shingle-unit"):
        ShingleConfig(5, "line")


def test_vectorized_signature_equals_datasketch_update_path(corpus):
    hashes = corpus[2]
    signer = Signer(64, 99)
    for h in hashes[:20] + [np.zeros(0, np.uint64), np.array([1, 2**40 + 1], np.uint64)]:
        assert np.array_equal(signer.signature(h), signer.signature_reference(h))


def test_exact_all_pairs_script(tmp_path, corpus):
    from tools.openwebtext import exact_all_pairs
    docs, _, hashes, exact = corpus
    src = write_jsonl(tmp_path / "d.json", docs, extra_lines=["{bad"])
    res = exact_all_pairs.main(["--inputs", src, "url", "--output", str(tmp_path / "e.json"), "--no-progress",
                                "--workers", "2"])
    got = [(p["a"], p["b"]) for p in read_jsonl(tmp_path / "e.json")]
    assert got == [(docs[i]["url"], docs[j]["url"]) for i, j, _ in exact]
    assert res["notes"]["pairs_at_or_above_threshold"] == len(exact) and res["dropped"] == {"malformed_json": 1}
