"""The demo crawl as raw web archives: `warc/crawl-0000k.warc.gz`, for web-input runs.

The demo's generated crawl pages (demo_data.web_records: real Wikipedia text with
boilerplate, spam and copies) rendered as HTML pages with navigation, a cookie banner and a
footer around the article, and written as WARC/1.1 response records the way crawlers do
(one gzip member per record, a warcinfo record first, a request record before each
response). What a real crawl also holds, planted at known places so tests can assert
them: non-HTML payloads (a PDF, a PNG, JSON), HTTP errors and redirects, pages that lie
about their charset (windows-1252 bytes declared as UTF-8; UTF-8 declared as ISO-8859-1),
and URLs crawled twice, months apart, with changed text (for `dedup.exact: {key: url}`).
Seeded, with fixed record ids and dates: the same Python gives byte-identical files.
"""

from __future__ import annotations

import html
import random
from pathlib import Path

from pipeline.io import warc

SEED = 20261201
WARC_FILES = 2


def page_html(title: str, paragraphs: list[str], nav: str, cookie: str, footer: str, charset: str = "utf-8") -> str:
    """A page as crawled: boilerplate around an <article> with the text."""
    e = html.escape
    body = "\n".join(f"<p>{e(p)}</p>" for p in paragraphs)
    links = "".join(f'<li><a href="/{e(w.lower())}">{e(w)}</a></li>' for w in nav.split(" | "))
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="{charset}"><title>{e(title)}</title>\n'
            '<script>window.dataLayer=[];function track(){return 1}</script>\n'
            '<style>body{font-family:sans-serif}.cookie{position:fixed}</style></head>\n'
            f'<body><header><nav><ul>{links}</ul></nav></header>\n'
            f'<div class="cookie">{e(cookie)} <button>Accept</button></div>\n'
            f'<main><article><h1>{e(title)}</h1>\n{body}\n</article>\n'
            '<aside><h3>Related</h3><ul><li><a href="/r1">More stories</a></li><li><a href="/r2">Popular</a></li></ul></aside></main>\n'
            f'<footer><p>{e(footer)}</p></footer></body></html>\n')


def _render(rec: dict) -> tuple[str, list[str]]:
    """(title, paragraphs) of a generated page: articles carry nav, cookie, title, text
    and footer as their first, second, third and last parts (demo_data._article)."""
    parts = rec["text"].split("\n\n")
    if rec["kind"] in ("article", "exact_copy", "near_copy") and len(parts) >= 5:
        return parts[2], parts[3:-1]
    return rec["url"].rsplit("/", 1)[-1], parts


def _uuid(i: int, salt: int) -> str:
    return f"00000000-0000-4000-8{salt:03d}-{i:012d}"


def crawl_records(web: list[dict], seed: int = SEED) -> list[list[bytes]]:
    """WARC_FILES lists of record bytes. Returns also what was planted (see `planted`)."""
    rng = random.Random(seed)
    files: list[list[bytes]] = [[] for _ in range(WARC_FILES)]
    for k in range(WARC_FILES):
        info = f"software: curate demo\r\nformat: WARC File Format 1.1\r\nisPartOf: demo-crawl-{k}\r\n".encode()
        files[k].append(warc.record_bytes("warcinfo", None, "2025-01-01T00:00:00Z", info, _uuid(k, 999), http=False))
    for i, rec in enumerate(web):
        k = i % WARC_FILES
        date = f"{rec['crawl_date']}T{i % 24:02d}:{i % 60:02d}:00Z"
        title, paras = _render(rec)
        nav, cookie, footer = "Home | News | About | Contact", "We use cookies to improve your experience.", "(c) 2025 demo"
        page = page_html(title, paras, nav, cookie, footer)
        url = rec["url"]
        req = f"GET /{url.split('/', 3)[-1]} HTTP/1.1\r\nHost: {url.split('/')[2]}\r\n\r\n".encode()
        files[k].append(warc.record_bytes("request", url, date, req, _uuid(i, 1)))
        files[k].append(warc.record_bytes("response", url, date, warc.http_response(page.encode()), _uuid(i, 2),
                                          payload_type="text/html"))
        if i % 97 == 5:  # the same URL crawled again months later, with a changed page
            later = f"2026-{1 + i % 12:02d}-15T08:00:00Z"
            page2 = page_html(title, paras + [f"Updated in 2026: {rng.choice(paras)[:80]}"], nav, cookie, footer)
            files[(k + 1) % WARC_FILES].append(
                warc.record_bytes("response", url, later, warc.http_response(page2.encode()), _uuid(i, 3), payload_type="text/html"))
        if i % 151 == 7:
            _odd_records(files[k], i, date, rng)
    return files


def _odd_records(out: list[bytes], i: int, date: str, rng: random.Random) -> None:
    """What a crawl holds besides good pages, one of each at this place."""
    d = f"https://files.example.org/{i:06d}"
    pdf = b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n"
    out.append(warc.record_bytes("response", d + "/report.pdf", date, warc.http_response(pdf, "application/pdf", None), _uuid(i, 4),
                                 payload_type="application/pdf"))
    png = b"\x89PNG\r\n\x1a\n" + bytes(rng.randrange(256) for _ in range(64))
    out.append(warc.record_bytes("response", d + "/logo.png", date, warc.http_response(png, "image/png", None), _uuid(i, 5),
                                 payload_type="image/png"))
    out.append(warc.record_bytes("response", d + "/api.json", date,
                                 warc.http_response(b'{"ok": true}', "application/json", None), _uuid(i, 6)))
    missing = page_html("Not Found", ["The page you asked for does not exist."], "Home", "", "")
    out.append(warc.record_bytes("response", d + "/gone", date, warc.http_response(missing.encode(), status=404, reason="Not Found"),
                                 _uuid(i, 7)))
    out.append(warc.record_bytes("response", d + "/old", date, warc.http_response(b"", status=301, reason="Moved Permanently"),
                                 _uuid(i, 8)))
    text = ("Caf\u00e9 culture in Z\u00fcrich: na\u00efve visitors and s\u00e9ances at the Op\u00e9ra. "
            "The old town's caf\u00e9s serve cr\u00e8me br\u00fbl\u00e9e.")
    lying = page_html("Z\u00fcrich caf\u00e9s", [text], "Home", "", "", charset="utf-8")
    out.append(warc.record_bytes("response", d + "/cp1252-declared-utf8", date,
                                 warc.http_response(lying.encode("cp1252"), charset="utf-8"), _uuid(i, 9)))
    out.append(warc.record_bytes("response", d + "/utf8-declared-latin1", date,
                                 warc.http_response(lying.encode("utf-8"), charset="iso-8859-1"), _uuid(i, 10)))


def build(out: Path, web: list[dict]) -> list[Path]:
    paths = []
    for k, recs in enumerate(crawl_records(web)):
        p = Path(out) / "warc" / f"crawl-{k:05d}.warc.gz"
        p.parent.mkdir(parents=True, exist_ok=True)
        warc.write_warc(p, recs)
        paths.append(p)
    return paths
