import pytest

from tests.tools.openwebtext.helpers import read_jsonl, write_jsonl
from tools.openwebtext import blacklist_urls as bl


@pytest.mark.parametrize("url, reason", [
    ("https://news.example.org/2020/story.html", None),
    ("http://blog.example.com/post?id=3", None),
    ("https://www.youtube.com/watch?v=x", "blacklisted_domain"),
    ("https://m.facebook.com/some/page", "blacklisted_domain"),  # subdomain of a listed domain
    ("https://notfacebook.com/page", None),  # a suffix match must fall on a label boundary
    ("https://example.org/photo.JPG", "blacklisted_extension"),
    ("https://example.org/paper.pdf?download=1", "blacklisted_extension"),
    ("https://example.org/v2.0/readme", None),  # a dot in a directory is not an extension
    ("ftp://example.org/file", "malformed_url"),
    ("https://", "malformed_url"),
    ("https://exa mple.org/", "malformed_url"),
    ("https://example.org:99999/", "malformed_url"),
    ("https://localhost/page", "malformed_url"),
    ("a.b", "malformed_url"),
])
def test_judge(url, reason):
    norm, why = bl.judge(url, bl.DOMAIN_BLACKLIST, bl.EXTENSION_BLACKLIST, 8)
    assert why == reason and (norm is None) == (reason is not None)


def test_normalized_duplicates():
    same = ["https://www.Example.org/a/", "http://example.org/a#frag", "https://EXAMPLE.org/a"]
    assert len({bl.normalize_url(u) for u in same}) == 1
    assert bl.normalize_url("https://example.org/a?x=1") != bl.normalize_url("https://example.org/a?x=2")


def test_url_list_directory(tmp_path):
    d = tmp_path / "urls"
    d.mkdir()
    (d / "b.txt").write_text("https://example.org/b\nhttps://imgur.com/x\n\n")
    (d / "a.txt").write_text("https://example.org/a\nhttps://www.example.org/a/\nnot a url\n")
    extra = tmp_path / "extra.txt"
    extra.write_text("# more\nexample.net\n")
    (d / "c.txt").write_text("https://sub.example.net/x\n")
    res = bl.main([str(d), str(tmp_path / "clean.txt"), "--extra-domains", str(extra), "--no-progress"])
    assert (tmp_path / "clean.txt").read_text() == "https://example.org/a\nhttps://example.org/b\n"
    assert res["dropped"] == {"duplicate_url": 1, "malformed_url": 1, "blacklisted_domain": 2}


@pytest.mark.parametrize("workers", [1, 2])
def test_json_documents_filtered_by_url(tmp_path, workers):
    docs = [{"text": "a", "url": "https://example.org/a"}, {"text": "b", "url": "https://vimeo.com/1"},
            {"text": "c", "url": "https://example.org/a/"}, {"text": "d", "url": "https://example.org/d.mp4"},
            {"text": "e"}, {"text": "f", "url": "https://example.org/f"}]
    src = write_jsonl(tmp_path / "docs.json", docs, extra_lines=["{bad"])
    res = bl.main([src, str(tmp_path / "out.json"), "--workers", str(workers), "--no-progress"])
    assert [d["text"] for d in read_jsonl(tmp_path / "out.json")] == ["a", "f"]
    assert res["dropped"] == {"blacklisted_domain": 1, "duplicate_url": 1, "blacklisted_extension": 1,
                              "missing_url": 1, "malformed_json": 1}


def test_mixed_inputs_rejected(tmp_path):
    (tmp_path / "a.json").write_text("")
    (tmp_path / "b.txt").write_text("")
    with pytest.raises(SystemExit):
        bl.main([str(tmp_path / "a.json"), str(tmp_path / "b.txt"), str(tmp_path / "o")])
