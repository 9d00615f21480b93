"""Drop URLs by domain and file-extension blacklists, duplicates and malformed ones.

Works on either kind of input, told apart by file name:
  - URL lists (any name not ending in .json/.jsonl): one URL per line; the output is
    the clean URL list, one per line (the seed's use: filter before downloading);
  - loose-JSON documents (.json/.jsonl): each document is judged by its --url-key
    field and the output is the kept documents.
An input that is a directory means every file in it, in name order.

A URL is dropped when it is malformed (not http(s), no host, spaces, a bad port, or
shorter than --min-url-chars), when its host is a blacklisted domain or a subdomain of
one (image/video hosts, social networks, file lockers, shops: pages with little prose),
when its path ends in a blacklisted extension (images, media, archives, binaries,
documents), or when its normalized form (lowercase scheme and host, no "www.", no
fragment, no trailing slash) was already seen. Add to the lists with --extra-domains
and --extra-extensions.

    python tools/openwebtext/blacklist_urls.py urls/ clean_urls.txt
    python tools/openwebtext/blacklist_urls.py raw.json raw_clean.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from urllib.parse import urlsplit

if __package__ in (None, ""):  # run as a script: make `tools.openwebtext` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.openwebtext.jsonl_io import (Summary, add_common_args, atomic_output, parse_checked,
                                        parallel_map, parse_line)

DOMAIN_BLACKLIST = {
    # images and media hosting
    "imgur.com", "flickr.com", "instagram.com", "pinterest.com", "500px.com", "gfycat.com",
    "giphy.com", "tinypic.com", "photobucket.com", "deviantart.com", "imageshack.us",
    "youtube.com", "youtu.be", "vimeo.com", "dailymotion.com", "twitch.tv", "streamable.com",
    "liveleak.com", "soundcloud.com", "spotify.com", "bandcamp.com", "tiktok.com",
    # social networks and link aggregators
    "facebook.com", "twitter.com", "x.com", "t.co", "reddit.com", "redd.it", "linkedin.com",
    "tumblr.com", "snapchat.com", "discord.gg", "discord.com",
    # file lockers, paste and archive sites
    "dropbox.com", "drive.google.com", "docs.google.com", "mega.nz", "mediafire.com",
    "pastebin.com", "4shared.com", "rapidshare.com", "zippyshare.com", "wetransfer.com",
    # shops and marketplaces
    "amazon.com", "ebay.com", "etsy.com", "aliexpress.com", "walmart.com", "craigslist.org",
    # link shorteners (the target is unknown)
    "bit.ly", "goo.gl", "tinyurl.com", "ow.ly", "is.gd", "buff.ly",
}

EXTENSION_BLACKLIST = {
    # images
    ".jpg", ".jpeg", ".png", ".gif", ".gifv", ".bmp", ".svg", ".webp", ".tif", ".tiff", ".ico",
    # audio and video
    ".mp3", ".wav", ".flac", ".ogg", ".mp4", ".webm", ".avi", ".mov", ".mkv", ".wmv", ".m4a",
    # archives and binaries
    ".zip", ".rar", ".7z", ".tar", ".gz", ".bz2", ".xz", ".exe", ".dmg", ".iso", ".apk", ".bin",
    ".msi", ".deb", ".rpm", ".jar",
    # documents and data
    ".pdf", ".doc", ".docx", ".xls", ".xlsx", ".ppt", ".pptx", ".csv", ".json", ".xml", ".rss",
    ".txt", ".epub",
}

JSON_SUFFIXES = (".json", ".jsonl")


def normalize_url(url: str) -> str | None:
    """Canonical form used to detect duplicates; None when the URL is malformed."""
    if any(c.isspace() for c in url):
        return None
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError on a non-numeric or out-of-range port
    except ValueError:
        return None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname or "." not in parts.hostname:
        return None
    host = parts.hostname.lower().removeprefix("www.")
    if port is not None:
        host = f"{host}:{port}"
    path = parts.path.rstrip("/")
    query = f"?{parts.query}" if parts.query else ""
    return f"{host}{path}{query}"


def domain_blacklisted(host: str, domains: set[str]) -> bool:
    labels = host.split(".")
    return any(".".join(labels[i:]) in domains for i in range(len(labels) - 1))


def judge(url: str, domains: set[str], extensions: set[str], min_chars: int) -> tuple[str | None, str | None]:
    """(normalized URL, None) if the URL passes the blacklists, else (None, drop reason)."""
    url = url.strip()
    if len(url) < min_chars:
        return None, "malformed_url"
    norm = normalize_url(url)
    if norm is None:
        return None, "malformed_url"
    parts = urlsplit(url)
    if domain_blacklisted(parts.hostname.lower(), domains):
        return None, "blacklisted_domain"
    last = parts.path.rsplit("/", 1)[-1].lower()
    if "." in last and last[last.rindex("."):] in extensions:
        return None, "blacklisted_extension"
    return norm, None


_state: dict = {}


def _init_worker(domains, extensions, min_chars, url_key) -> None:
    _state.update(domains=domains, extensions=extensions, min_chars=min_chars, url_key=url_key)


def _judge_line(item: tuple[str, int, bytes, bool]):
    """One input line -> (path, lineno, line to write, normalized URL, drop reason)."""
    path, lineno, raw, is_json = item
    if is_json:
        doc, problem = parse_line(raw, text_key=None)
        if doc is None:
            return path, lineno, None, None, problem
        url = doc.get(_state["url_key"])
        if not isinstance(url, str):
            return path, lineno, None, None, f"missing_url (no string under {_state['url_key']!r})"
        out = raw if raw.endswith(b"\n") else raw + b"\n"
    else:
        try:
            url = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            return path, lineno, None, None, "malformed_utf8"
        out = (url + "\n").encode("utf-8")
    norm, reason = judge(url, _state["domains"], _state["extensions"], _state["min_chars"])
    return path, lineno, out, norm, reason


def expand_inputs(inputs: list[str]) -> list[Path]:
    files = []
    for name in map(Path, inputs):
        files.extend(sorted(p for p in name.iterdir() if p.is_file()) if name.is_dir() else [name])
    return files


def _lines(files: list[Path], is_json: bool):
    for path in files:
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                if raw.strip():
                    yield str(path), lineno, raw, is_json


def _read_list(path: str | None, dotted: bool) -> set[str]:
    if not path:
        return set()
    with open(path, encoding="utf-8") as f:
        items = {line.strip().lower() for line in f if line.strip() and not line.startswith("#")}
    return {i if not dotted or i.startswith(".") else "." + i for i in items}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="+", help="URL-list files, loose-JSON files, or directories of them.")
    p.add_argument("output", help="clean URL list, or loose JSON of the kept documents for JSON inputs.")
    p.add_argument("--url-key", default="url", help="JSON key of a document's URL (default 'url').")
    p.add_argument("--min-url-chars", type=int, default=8,
                   help="URLs shorter than this are malformed (default 8).")
    p.add_argument("--extra-domains", default=None, metavar="FILE",
                   help="file of more blacklisted domains, one per line ('#' starts a comment).")
    p.add_argument("--extra-extensions", default=None, metavar="FILE",
                   help="file of more blacklisted file extensions (e.g. '.mid'), one per line.")
    add_common_args(p)
    return p


def main(argv=None) -> dict:
    parser = build_parser()
    args = parse_checked(parser, argv)
    files = expand_inputs(args.inputs)
    kinds = {f.suffix.lower() in JSON_SUFFIXES for f in files}
    if len(kinds) != 1:
        parser.error("inputs must be all URL lists or all loose-JSON (.json/.jsonl) files" if files
                     else "no input files found")
    is_json = kinds.pop()
    domains = DOMAIN_BLACKLIST | _read_list(args.extra_domains, dotted=False)
    extensions = EXTENSION_BLACKLIST | _read_list(args.extra_extensions, dotted=True)
    summary, seen = Summary("blacklist_urls"), set()
    init = (domains, extensions, args.min_url_chars, args.url_key)
    with atomic_output(args.output, "wb") as out:
        for path, lineno, line, norm, reason in parallel_map(
                _judge_line, _lines(files, is_json), args.workers, _init_worker, init, chunksize=256,
                progress=not args.no_progress, desc="blacklist_urls"):
            if reason is None and norm in seen:
                reason = "duplicate_url"
            if reason is not None:
                kind = reason.split(" ", 1)[0]
                summary.drop(kind)
                if kind.startswith(("malformed_json", "malformed_utf8", "missing_url")):
                    summary.problem(f"{path}:{lineno}", reason)
                continue
            seen.add(norm)
            out.write(line)
            summary.keep()
    return summary.finish(args.summary_json)


if __name__ == "__main__":
    main()
