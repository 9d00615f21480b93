import os

import pytest

from tests.tools.openwebtext.helpers import write_jsonl
from tools.openwebtext.jsonl_io import (Summary, atomic_output, parallel_map, parse_line,
                                        read_documents, read_documents_parallel)


@pytest.mark.parametrize("raw, problem", [
    (b'{"text": "ok", "url": "u"}', None),
    (b'{"text": "ok"', "malformed_json"),
    (b'[1, 2]', "malformed_json"),
    (b'{"url": "u"}', "missing_text"),
    (b'{"text": 3}', "missing_text"),
    (b'{"text": "\xff\xfe"}', "malformed_utf8"),
])
def test_parse_line_names_the_problem(raw, problem):
    doc, found = parse_line(raw)
    if problem is None:
        assert found is None and doc["text"] == "ok"
    else:
        assert doc is None and found.startswith(problem)


@pytest.mark.parametrize("workers", [1, 2])
def test_readers_count_and_skip_malformed_lines(tmp_path, workers):
    path = tmp_path / "in.json"
    write_jsonl(path, [{"text": "a"}, {"text": "b"}], extra_lines=["{oops", '{"url": 1}', "", "[]"])
    with open(path, "ab") as f:
        f.write(b'{"text": "\xff"}\n' + b'{"text": "c"}')  # bad UTF-8, then a last line without newline
    summary = Summary("t")
    texts = [d["text"] for d in read_documents(path, summary, progress=False)]
    assert texts == ["a", "b", "c"]
    assert dict(summary.dropped) == {"malformed_json": 2, "missing_text": 1, "malformed_utf8": 1}
    assert summary.problems[0].endswith(":3: malformed_json (Expecting property name enclosed in double quotes)")

    parallel = Summary("t")
    got = [(d["text"], raw) for d, raw in read_documents_parallel(path, parallel, workers=workers, progress=False)]
    assert [t for t, _ in got] == texts and got[-1][1] == b'{"text": "c"}'
    assert parallel.dropped == summary.dropped


def test_atomic_output_keeps_old_file_on_failure(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("old\n")
    with pytest.raises(RuntimeError):
        with atomic_output(target) as f:
            f.write("half written")
            raise RuntimeError("crash mid-run")
    assert target.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["out.json"]  # no temporary file left behind
    with atomic_output(target) as f:
        f.write("new\n")
    assert target.read_text() == "new\n" and oct(target.stat().st_mode & 0o777) == "0o644"


def _square(x):
    return x * x


@pytest.mark.parametrize("workers", [1, 2])
def test_parallel_map_keeps_order(workers):
    assert list(parallel_map(_square, range(200), workers, chunksize=7, progress=False)) == \
        [x * x for x in range(200)]


def test_summary_report_and_merge(capsys):
    a, b = Summary("step"), Summary("step")
    a.keep(3), a.drop("too_short", 2), a.note("fixed")
    b.keep(1), b.drop("too_short"), b.drop("malformed_json"), b.problem("f:7", "malformed_json (x)")
    a.merge(b)
    assert a.as_dict() == {"name": "step", "seen": 8, "kept": 4,
                           "dropped": {"malformed_json": 1, "too_short": 3},
                           "notes": {"fixed": 1}, "problems": ["f:7: malformed_json (x)"]}
    a.report()
    err = capsys.readouterr().err
    assert "[step] seen 8, kept 4, dropped 4" in err and "too_short" in err and "f:7" in err
