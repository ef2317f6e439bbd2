"""Web input: WARC/WET files, HTML files and HTML fields, written by the tests from real
Wikipedia text in crawled-looking pages, run through real extractors on the session's Ray.

What is asserted: which records become documents and which are not documents (request,
warcinfo), the extracted text (the article, not the navigation or cookie banner), the
metadata (URL, crawl date, record id, content type, declared and used charset), pages that
lie about their charset, the extract stage's removals and reasons, URL dedup keeping the
latest crawl, the url filter on the record's URL, a cut WARC file, and the time limit: a
page that would take trafilatura most of an hour is stopped at its CPU limit and the shard
goes on."""

from __future__ import annotations

import gzip
import re
import time

import orjson
import pyarrow.parquet as pq
import pytest

from pipeline import config, demo_warc
from pipeline.steps.ingest import extract
from pipeline.run import runner
from pipeline.errors import RunError
from pipeline.io import atomic, warc
from pipeline.io.readers import StreamError
from tests.conftest import ROOT, write_yaml

BOILER = ("Home | News | About | Contact", "We use cookies to improve your experience.", "(c) 2025 demo")
PARIS = "Caf\u00e9 culture in Z\u00fcrich: na\u00efve visitors and s\u00e9ances at the Op\u00e9ra, with cr\u00e8me br\u00fbl\u00e9e."


def _page(title: str, paras: list[str], charset: str = "utf-8") -> str:
    return demo_warc.page_html(title, paras, *BOILER, charset=charset)


def _resp(url: str, date: str, body: bytes, uid: str, **kw) -> bytes:
    return warc.record_bytes("response", url, date, warc.http_response(body, **kw), uid)


@pytest.fixture(scope="module")
def crawl(tmp_path_factory, wiki_texts) -> dict:
    """a.warc.gz: warcinfo, 30 pages each after its request record, a PDF, a 404, two
    lying charsets, a page on a blocked domain, a page whose article is empty, an HTML page
    served as text/plain;
    b.warc (plain): 10 pages, a later re-crawl of page 3 and an earlier one of page 4;
    c.warc.gz: 5 pages, cut in the middle of the 4th record."""
    d = tmp_path_factory.mktemp("crawl")
    texts = wiki_texts[:60]
    a = [warc.record_bytes("warcinfo", None, "2025-01-01T00:00:00Z", b"software: test\r\n", "info-a", http=False)]
    for i in range(30):
        url = f"https://site{i % 3}.example/page/{i}"
        a.append(warc.record_bytes("request", url, "2025-03-01T10:00:00Z", b"GET / HTTP/1.1\r\n\r\n", f"req-{i}"))
        a.append(_resp(url, f"2025-03-01T10:{i:02d}:00Z", _page(f"Title {i}", [texts[i]]).encode(), f"page-{i}"))
    a.append(_resp("https://files.example/report.pdf", "2025-03-02T00:00:00Z", b"%PDF-1.4\n%%EOF\n", "pdf",
                   content_type="application/pdf", charset=None))
    a.append(_resp("https://site0.example/gone", "2025-03-02T00:00:00Z", _page("Not found", ["Gone."]).encode(), "404",
                   status=404, reason="Not Found"))
    a.append(_resp("https://lying.example/cp1252", "2025-03-02T00:00:00Z", _page("Cafes", [PARIS]).encode("cp1252"),
                   "cp1252", charset="utf-8"))
    a.append(_resp("https://lying.example/utf8", "2025-03-02T00:00:00Z", _page("Cafes", [PARIS]).encode("utf-8"),
                   "utf8", charset="iso-8859-1"))
    a.append(_resp("https://spam.blocked.example/win", "2025-03-02T00:00:00Z", _page("Win", [texts[40]]).encode(), "spam"))
    a.append(_resp("https://site1.example/empty", "2025-03-02T00:00:00Z", b"<html><body><nav>Home</nav></body></html>", "empty"))
    # the server says text/plain; the crawler sniffed HTML (Common Crawl's WARC-Identified-Payload-Type): HTML wins
    a.append(warc.record_bytes("response", "https://site2.example/mislabeled", "2025-03-02T00:00:00Z",
                               warc.http_response(_page("Mislabeled", [texts[41]]).encode(), content_type="text/plain"),
                               "mislabeled", payload_type="text/html"))
    warc.write_warc(d / "a.warc.gz", a)
    b = [_resp(f"https://site{i % 3}.example/page/{i}", "2025-04-01T00:00:00Z", _page(f"Title {i}", [texts[i]]).encode(),
               f"b-{i}") for i in range(30, 40)]
    b.append(_resp("https://site0.example/page/3", "2026-02-01T00:00:00Z",
                   _page("Title 3", [texts[3], "Updated in 2026 with a new paragraph about the subject."]).encode(), "recrawl-3"))
    b.append(_resp("https://site1.example/page/4", "2024-01-01T00:00:00Z", _page("Title 4", [texts[4][:200]]).encode(), "older-4"))
    warc.write_warc(d / "b.warc", b, compress=False)
    c = [_resp(f"https://site2.example/c/{i}", "2025-05-01T00:00:00Z", _page(f"C {i}", [texts[45 + i]]).encode(), f"c-{i}")
         for i in range(5)]
    whole = b"".join(gzip.compress(r, mtime=0) for r in c)
    cut = sum(len(gzip.compress(r, mtime=0)) for r in c[:3]) + 200
    (d / "c.warc.gz").write_bytes(whole[:cut])
    (d / "blocklist.txt").write_text("blocked.example\n")
    return {"dir": d, "texts": texts}


def _docs(run_dir, source: str) -> list[dict]:
    rj = atomic.read_json(run_dir / "run.json")
    out = []
    for f in sorted((run_dir / rj["steps"][f"ingest-{source}"]["dir"]).glob("part-*.parquet")):
        out += pq.read_table(f).to_pylist()
    for r in out:
        r["meta"] = orjson.loads(r["metadata"]) if r["metadata"] else {}
    return out


@pytest.fixture(scope="module")
def crawl_run(ray_local, crawl):
    d = crawl["dir"]
    y = write_yaml(d / "crawl.yaml", f"""
        name: crawl
        output: {d}/out
        sources:
          web:
            paths: ["{d}/*.warc*"]
            filters: [blocked]
        filters:
          blocked: {{type: url, blocklist: {d}/blocklist.txt}}
        dedup:
          exact: {{key: url}}
        """)
    return runner.run(config.load(y), log=lambda m: None, quiet=True)


def test_warc_records_become_documents_with_their_text_and_metadata(crawl_run, crawl):
    led = atomic.read_json(crawl_run / "ledger.json")["sources"]["web"]
    # 30 + 7 odd records in a, 12 in b, 3 whole in c; request and warcinfo records are not documents
    assert led["in"] == 37 + 12 + 3 + 1  # + the cut record, quarantined
    assert led["stages"][0]["skipped_records"] == {"request": 30, "warcinfo": 1}
    assert led["removed"]["extract"] == {"http_status": 1, "not_html": 1, "no_text": 1}
    assert led["removed"]["filter:blocked"] == {"blocked_domain": 1}
    assert led["removed"]["dedup:exact"] == {"url_duplicate": 2}
    assert led["quarantined_by_reason"] == {"corrupt_stream": 1}
    assert led["kept"] == 53 - 1 - 3 - 1 - 2
    # c.warc.gz is cut: the counted records balance, what followed the cut is unknown
    assert led["conservation"] == "unknown" and [f["file"] for f in led["unread_files"]] == [str(crawl["dir"] / "c.warc.gz")]
    assert [s["stage"] for s in led["stages"]][:3] == ["ingest", "extract", "filter:blocked"]
    assert led["extraction"]["extractor"] == "resiliparse" and led["extraction"]["pages"] == 50

    rows = _docs(crawl_run, "web")
    # in record order, whatever finished first: pages are extracted ahead, the records between them wait their turn
    assert [r["source_id"] for r in rows[:37]] == [f"<urn:uuid:{k}>" for k in [f"page-{i}" for i in range(30)] + [
        "pdf", "404", "cp1252", "utf8", "spam", "empty", "mislabeled"]]
    docs = {r["meta"]["url"]: r for r in rows if r["meta"].get("warc_record_id") != "<urn:uuid:older-4>"}
    p7 = docs["https://site1.example/page/7"]
    assert crawl["texts"][7] in p7["text"] and p7["text"].startswith("Title 7")
    for boiler in BOILER + ("More stories", "window.dataLayer"):
        assert boiler not in p7["text"]
    assert p7["meta"] == {"url": "https://site1.example/page/7", "crawl_date": "2025-03-01T10:07:00Z", "warc_type": "response",
                          "warc_record_id": "<urn:uuid:page-7>", "http_status": 200, "content_type": "text/html",
                          "charset": "utf-8", "encoding": "utf-8"}
    assert p7["source_id"] == "<urn:uuid:page-7>"
    # pages that lie about their charset read right either way
    for url, used in (("https://lying.example/cp1252", "cp1252"), ("https://lying.example/utf8", "utf-8")):
        assert PARIS in docs[url]["text"], docs[url]["text"]
        assert docs[url]["meta"]["encoding"] == used
    assert crawl["texts"][41] in docs["https://site2.example/mislabeled"]["text"]
    assert docs["https://site2.example/mislabeled"]["meta"]["content_type"] == "text/html"
    assert docs["https://files.example/report.pdf"]["meta"]["extraction"] == "not_html"
    assert docs["https://files.example/report.pdf"]["text"] == ""
    assert docs["https://site0.example/gone"]["meta"] == {**docs["https://site0.example/gone"]["meta"], "extraction": "http_status",
                                                          "http_status": 404}


def test_url_dedup_keeps_the_latest_crawl_whatever_the_file_order(crawl_run):
    from pipeline.shards import decisions

    run = decisions.Run(crawl_run)
    rows = []
    for part in run.shards("web"):
        rows += decisions.shard_decisions(run, "web", part, with_text=True).to_pylist()
    by_url: dict[str, list[dict]] = {}
    for r in rows:
        by_url.setdefault(r["url"], []).append(r)
    p3 = sorted(by_url["https://site0.example/page/3"], key=lambda r: r["status"])
    assert [r["status"] for r in p3] == ["kept", "removed"]
    assert "Updated in 2026" in p3[0]["text"] and p3[0]["source_id"] == "<urn:uuid:recrawl-3>"  # in b, read after a
    assert p3[1]["reason"] == f"url_duplicate_of:{p3[0]['id']}"
    p4 = {r["source_id"]: r for r in by_url["https://site1.example/page/4"]}
    assert p4["<urn:uuid:page-4>"]["status"] == "kept" and p4["<urn:uuid:older-4>"]["stage"] == "dedup:exact"


def test_a_cut_warc_file_keeps_what_came_before_and_says_where_it_stopped(crawl_run):
    q = [orjson.loads(x) for f in sorted((crawl_run / "quarantine" / "web").glob("*.jsonl")) for x in f.read_bytes().splitlines()]
    assert len(q) == 1 and q[0]["reason"] == "corrupt_stream" and q[0]["file"].endswith("c.warc.gz")
    assert q[0]["row"] == 3 and q[0]["unread_records"] == "unknown"
    assert "the WARC file is unreadable from record 4 on" in q[0]["error"]


def test_the_report_shows_the_extract_stage_and_samples_show_urls(crawl_run):
    from pipeline.shards import decisions
    from pipeline.steps.samples import tasks as samples_mod

    rep = atomic.read_json(crawl_run / "report.json")["sources"]["web"]
    assert [f["stage"] for f in rep["funnel"]][:2] == ["ingest", "extract"]
    assert rep["funnel"][1]["docs"] == rep["funnel"][0]["docs"] - 3
    html = (crawl_run / "report.html").read_text()
    assert "Extraction (HTML to text)" in html and "request 30, warcinfo 1" in html
    got = samples_mod.sample(decisions.Run(crawl_run), ["web"], 10, stage="extract")
    assert sorted((r["reason"], r["url"]) for r in got) == [
        ("http_status", "https://site0.example/gone"), ("no_text", "https://site1.example/empty"),
        ("not_html", "https://files.example/report.pdf")]


def test_every_cut_of_a_warc_file_is_found(tmp_path, wiki_texts):
    """FastWARC stops quietly at a cut file; the reader must not: for every prefix of a small
    .warc.gz and .warc, the records read are the file's first records with their payloads
    whole, every record wholly inside the prefix is among them, and a StreamError follows
    unless the prefix ends on a record boundary."""
    bodies = [_page("T", [wiki_texts[i][:150]]).encode() for i in range(3)]
    recs = [_resp(f"https://x.example/{i}", "2025-01-01T00:00:00Z", b, f"r{i}") for i, b in enumerate(bodies)]
    recs.insert(1, warc.record_bytes("request", "https://x.example/r", "2025-01-01T00:00:00Z", b"GET / HTTP/1.1\r\n\r\n", "q"))
    payloads = [warc.http_response(b).split(b"\r\n\r\n", 1)[1] for b in bodies]
    for comp in ("gzip", None):
        blobs = [gzip.compress(r, mtime=0) if comp else r for r in recs]
        data = b"".join(blobs)
        ends = [sum(len(b) for b in blobs[:k]) for k in range(1, len(blobs) + 1)]
        clean = 0 if comp else 4  # a plain record's closing CRLF CRLF: a cut there loses nothing
        for cut in range(1, len(data)):
            (tmp_path / "c").write_bytes(data[:cut])
            out = list(warc.iter_records(str(tmp_path / "c"), comp, 1 << 20, {}))
            errors = [r for r in out if isinstance(r, StreamError)]
            got = [r.payload for r in out if not isinstance(r, StreamError)]
            inside = sum(1 for k, e in enumerate(ends) if e <= cut and k != 1)  # the request is no document
            assert len(errors) == (0 if any(e - clean <= cut <= e for e in ends) else 1), (comp, cut)
            assert got == payloads[:len(got)] and len(got) >= inside, (comp, cut)
            assert not errors or out[-1] is errors[0]


# ---------------------------------------------------------------- other web inputs


def test_wet_records_html_files_and_an_html_field(ray_local, tmp_path, wiki_texts):
    """WET conversion records are text already (no extractor runs); .html files are a
    document each; a JSONL field of HTML is extracted, its url used by the url filter."""
    wet = [warc.record_bytes("conversion", f"https://wet.example/{i}", "2025-06-01T00:00:00Z", wiki_texts[70 + i].encode(),
                             f"wet-{i}", http=False) for i in range(3)]
    warc.write_warc(tmp_path / "x.warc.wet.gz", wet)
    pages = tmp_path / "pages"
    pages.mkdir()
    (pages / "one.html").write_text(_page("One", [wiki_texts[80]]))
    (pages / "two.htm").write_bytes(_page("Deux", [PARIS], charset="windows-1252").encode("cp1252"))
    (pages / "blank.html").write_text("<html><body><script>var x = 1;</script></body></html>")
    with open(tmp_path / "h.jsonl", "wb") as f:
        f.writelines(orjson.dumps({"id": f"h{i}", "url": f"https://{host}/{i}", "html": _page("H", [wiki_texts[90 + i]])}) + b"\n" for i, host in enumerate(["ok.example", "blocked.example", "ok.example"]))
    (tmp_path / "block.txt").write_text("blocked.example\n")
    y = write_yaml(tmp_path / "w.yaml", f"""
        name: w
        output: {tmp_path}/out
        sources:
          wet: {{paths: ["{tmp_path}/x.warc.wet.gz"]}}
          pages:
            paths: ["{pages}/*"]
            extract: {{type: trafilatura}}
          field:
            paths: ["{tmp_path}/h.jsonl"]
            id_field: id
            html_field: html
            filters: [blocked]
        filters:
          blocked: {{type: url, blocklist: {tmp_path}/block.txt}}
        """)
    run_dir = runner.run(config.load(y), log=lambda m: None, quiet=True)
    led = atomic.read_json(run_dir / "ledger.json")["sources"]
    assert all(e["conservation"] is True for e in led.values())
    wet_docs = _docs(run_dir, "wet")
    assert [d["text"] for d in wet_docs] == wiki_texts[70:73]
    assert wet_docs[0]["meta"]["warc_type"] == "conversion" and "extraction" not in led["wet"]
    pd = {d["source_id"]: d for d in _docs(run_dir, "pages")}
    # trafilatura folds no-break spaces into spaces
    assert wiki_texts[80].replace("\xa0", " ") in pd["one.html"]["text"] and "cookies" not in pd["one.html"]["text"]
    assert PARIS in pd["two.htm"]["text"] and pd["two.htm"]["meta"]["encoding"] == "cp1252"
    assert led["pages"]["removed"] == {"extract": {"no_text": 1}} and led["pages"]["extraction"]["extractor"] == "trafilatura"
    fd = {d["source_id"]: d for d in _docs(run_dir, "field")}
    assert wiki_texts[90] in fd["h0"]["text"] and "html" not in fd["h0"]["meta"] and fd["h0"]["meta"]["url"] == "https://ok.example/0"
    assert led["field"]["removed"] == {"filter:blocked": {"blocked_domain": 1}} and led["field"]["kept"] == 2


def test_config_errors_for_web_sources(tmp_path):
    from pipeline.errors import UsageError

    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    y = write_yaml(tmp_path / "bad.yaml", f"""
        name: bad
        sources:
          s:
            paths: ["{tmp_path}/a.jsonl"]
            extract: {{type: resiliparse}}
        """)
    lm = config.load(y)
    from pipeline.plan.sources import resolve_inputs

    with pytest.raises(UsageError, match=r"a.jsonl is jsonl, but sources.s.extract needs HTML: set sources.s.html_field"):
        resolve_inputs(lm)
    y = write_yaml(tmp_path / "bad2.yaml", """
        name: bad
        sources:
          s: {paths: [x.warc.gz], format: warc, id_field: id}
        filters:
          extract: {type: length}
        """)
    with pytest.raises(UsageError) as e:
        config.load(y)
    assert "id_field does not apply to format warc" in str(e.value)
    assert "filters: the filter name 'extract' is reserved" in str(e.value)
    (tmp_path / "p.html").write_text("<p>x</p>")
    y = write_yaml(tmp_path / "bad3.yaml", f"""
        name: bad
        sources:
          s:
            paths: ["{tmp_path}/p.html"]
            extract: {{type: python, callable: "no_such_module_here:extract"}}
        """)
    assert config.checks.check_extractors(config.load(y)) == [
        f"{y}:5: sources.s.extract.callable: the module 'no_such_module_here' cannot be imported here; install the "
        "package that provides it (on every node of a cluster), or fix the module:function name"]


# ---------------------------------------------------------------- the time limit


def _slow_page(n: int = 200_000) -> str:
    """trafilatura 1.x's image check (`[^\\s]+\\.(jpe?g|png|...)` searched over an image
    source with no extension) is quadratic: 8,000 "a." take ~4.6 s here, 200,000 about 50
    minutes, inside the regex engine's C code, which no Python-level timeout can stop."""
    return _page("Slow", ["A page with a pathological image link."]).replace(
        "</article>", f"<img src='{'a.' * n}'></article>")


def test_a_pathological_page_cannot_stall_a_shard(ray_local, tmp_path, wiki_texts):
    recs = [_resp(f"https://ok.example/{i}", "2025-01-01T00:00:00Z", _page(f"T{i}", [wiki_texts[i]]).encode(), f"ok-{i}")
            for i in range(6)]
    recs.insert(3, _resp("https://slow.example/", "2025-01-01T00:00:00Z", _slow_page().encode(), "slow"))
    warc.write_warc(tmp_path / "s.warc.gz", recs)
    y = write_yaml(tmp_path / "t.yaml", f"""
        name: t
        output: {tmp_path}/out
        sources:
          s:
            paths: ["{tmp_path}/s.warc.gz"]
            extract: {{type: trafilatura, include_images: true, timeout: 1}}
        """)
    t0 = time.monotonic()
    run_dir = runner.run(config.load(y), log=lambda m: None, quiet=True)
    wall = time.monotonic() - t0
    led = atomic.read_json(run_dir / "ledger.json")["sources"]["s"]
    assert led["quarantined_by_reason"] == {"extract_timeout": 1} and led["kept"] == 6 and led["conservation"] is True
    assert led["extraction"]["timeouts"] == 1 and led["extraction"]["restarts"] == 1
    q = orjson.loads(next((run_dir / "quarantine" / "s").glob("*.jsonl")).read_bytes().splitlines()[0])
    assert q["url"] == "https://slow.example/" and q["row"] == 3
    # stopped at its CPU limit: the wall time it reports grows only when another process shares the cores
    m = re.match(r"extraction used over 1 CPU seconds \(extract.timeout\); stopped after (\d+\.\d) s", q["error"])
    assert m and 1.0 <= float(m.group(1)) < 5, q["error"]
    assert "raise sources.s.extract.timeout" in q["error"]
    shard = atomic.read_json(next((run_dir / "steps").glob("ingest-s-*/_markers/part-00000.json")))
    print(f"\nshard with the pathological page: {shard['seconds']:.1f} s (limit 1 CPU s); whole run {wall:.1f} s")
    assert shard["seconds"] < 8  # the page alone would take trafilatura ~50 minutes

    y.write_text(y.read_text().replace("timeout: 1}", "timeout: 1}\n    on_bad_record: fail"))
    with pytest.raises(RunError, match=r"s.warc.gz row 3: extraction used over 1 CPU seconds .*raise sources.s.extract.timeout"):
        runner.run(config.load(y), log=lambda m: None, quiet=True)


def test_the_sandbox_stops_hangs_errors_and_crashes_and_goes_on():
    """A page that sleeps (no CPU: the wall-clock guard), one whose extractor raises, one
    that needs 3 GB (over the process's cap), one that kills the extractor process: each gets
    its status, and the next page is extracted."""
    sb = extract.Sandbox({"type": "python", "callable": "tests.pipeline.steps.ingest.web_extractors:extract", "timeout": 0.5,
                          "max_memory_mb": 1024}, wall=2.0)
    try:
        assert sb.extract("<p>fine</p>") == ("ok", "fine")
        t0 = time.monotonic()
        status, msg = sb.extract("<p>SLEEP</p>")
        assert status == "timeout" and "wall-clock" in msg and time.monotonic() - t0 < 4
        assert sb.extract("<p>RAISE</p>") == ("error", "ValueError: cannot parse this page")
        assert sb.extract("<p>HOG</p>") == ("error", "MemoryError: ")  # the 1 GB cap, not the machine's memory
        status, msg = sb.extract("<p>CRASH</p>")
        assert status == "crash" and "died" in msg
        assert sb.extract("<p>after</p>") == ("ok", "after") and sb.starts == 3
    finally:
        sb.close()
    sb = extract.Sandbox({"type": "python", "callable": "tests.pipeline.steps.ingest.web_extractors:extract", "timeout": 0.5})
    try:  # the default wall guard (12 s here): a loaded machine cannot mistake the CPU limit for it
        status, msg = sb.extract("<p>SPIN</p>")
        assert status == "timeout" and "used over 0.5 CPU seconds" in msg
        assert sb.extract("<p>after</p>") == ("ok", "after") and sb.starts == 2
    finally:
        sb.close()


def test_the_extractor_process_gets_no_credentials(monkeypatch):
    """An extractor parses pages from the web: a page that gets code running in it must find
    no cloud credentials in its environment, only what running Python needs."""
    planted = {"AWS_SECRET_ACCESS_KEY": "s3cr3t", "AWS_ACCESS_KEY_ID": "AKIA", "AWS_SESSION_TOKEN": "t",
               "HF_TOKEN": "hf_x", "GOOGLE_APPLICATION_CREDENTIALS": "/k.json", "AZURE_STORAGE_KEY": "k",
               "MY_API_KEY": "k", "RAY_AUTH_TOKEN": "r", "CURATE_UPLOAD_TOKEN": "c", "CURATE_CACHE_DIR": "/tmp/cc",
               "LC_ALL": "C.UTF-8"}
    for k, v in planted.items():
        monkeypatch.setenv(k, v)
    sb = extract.Sandbox({"type": "python", "callable": "tests.pipeline.steps.ingest.web_extractors:extract", "timeout": 5})
    try:
        status, names = sb.extract("<p>ENV</p>")
    finally:
        sb.close()
    assert status == "ok", names
    seen = set(names.split())
    assert {"PATH", "CURATE_CACHE_DIR", "LC_ALL"} <= seen
    assert not seen & (set(planted) - {"CURATE_CACHE_DIR", "LC_ALL"}), seen
    assert not [k for k in seen if k.startswith(("AWS_", "GOOGLE_", "AZURE_", "RAY_"))], seen


def test_the_shipped_warc_mixture_runs_on_the_demo_crawl(ray_local, demo_corpus, tmp_path):
    text = (ROOT / "mixtures" / "warc.yaml").read_text().replace("../data/demo", str(demo_corpus))
    text = text.replace("blocklist: blocklist.txt", f"blocklist: {ROOT / 'mixtures' / 'blocklist.txt'}")
    y = write_yaml(tmp_path / "warc.yaml", text.replace("output: ../out", f"output: {tmp_path}/out"))
    run_dir = runner.run(config.load(y), log=lambda m: None, quiet=True)
    led = atomic.read_json(run_dir / "ledger.json")["sources"]["crawl"]
    assert led["conservation"] is True and led["kept"] > 500
    assert set(led["removed"]["extract"]) == {"http_status", "not_html"}
    assert led["removed"]["dedup:exact"]["url_duplicate"] >= 1
    assert led["removed"]["filter:blocked_urls"]["blocked_domain"] > 100


def test_decoding_reads_charset_labels_as_browsers_do():
    s = "Caf\u00e9 \u2013 \u201cquoted\u201d"
    # iso-8859-1 is read as windows-1252 (WHATWG): the dash and quotes survive, not C1 controls
    assert extract.decode(s.encode("cp1252"), "iso-8859-1") == (s, "cp1252")
    assert extract.decode(s.encode("utf-8"), "iso-8859-1") == (s, "utf-8")  # valid UTF-8 wins over the label
    ja = "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3067\u3059\u3002\u3053\u308c\u306f\u9577\u3044\u6587\u7ae0\u3067\u3059\u3002"
    assert extract.decode(ja.encode("shift_jis"), None) == (ja, "shift_jis")  # no label: detected
    assert extract.decode(b"\xef\xbb\xbf<p>x</p>", None) == ("<p>x</p>", "utf-8")  # a BOM is not text
