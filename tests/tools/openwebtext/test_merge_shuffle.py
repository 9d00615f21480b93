import pytest

from tests.tools.openwebtext.helpers import read_jsonl, write_jsonl
from tools.openwebtext import merge_jsons, shuffle_dataset


@pytest.mark.parametrize("workers", [1, 2])
def test_merge_in_name_order_skipping_bad_lines(tmp_path, workers):
    d = tmp_path / "shards"
    write_jsonl(d / "b.json", [{"text": "b1"}], extra_lines=["{bad"])
    write_jsonl(d / "a.jsonl", [{"text": "a1"}, {"text": "a2"}])
    (d / "notes.md").write_text("not a shard")
    extra = write_jsonl(tmp_path / "extra.json", [{"text": "x"}, {"no": "text"}])
    out = d / "merged.json"  # inside the merged directory: must not read itself
    out.write_text('{"text": "stale"}\n')
    res = merge_jsons.main(["--json_path", str(d), "--inputs", extra, "--output_file", str(out),
                            "--workers", str(workers), "--no-progress"])
    assert [r["text"] for r in read_jsonl(out)] == ["a1", "a2", "b1", "x"]
    assert res["dropped"] == {"malformed_json": 1, "missing_text": 1} and res["notes"]["files_merged"] == 3
    assert sorted(p.name for p in d.iterdir()) == ["a.jsonl", "b.json", "merged.json", "notes.md"]


@pytest.fixture()
def docs(tmp_path):
    return write_jsonl(tmp_path / "in.json", [{"text": str(i)} for i in range(500)], extra_lines=["oops"])


@pytest.mark.parametrize("buckets", [1, 7])
def test_shuffle_is_a_seeded_permutation(tmp_path, docs, buckets):
    def run(seed, workers, name):
        res = shuffle_dataset.main(["--input", docs, "--output", str(tmp_path / name), "--seed", str(seed),
                                    "--buckets", str(buckets), "--workers", str(workers), "--no-progress"])
        assert res["kept"] == 500 and res["dropped"] == {"malformed_json": 1}
        return [r["text"] for r in read_jsonl(tmp_path / name)]
    a, a2, b = run(1, 1, "a.json"), run(1, 2, "a2.json"), run(2, 1, "b.json")
    assert sorted(a, key=int) == [str(i) for i in range(500)]
    assert a == a2 and a != b and a != [str(i) for i in range(500)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "a2.json", "b.json", "in.json"]
