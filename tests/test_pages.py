"""The published pages in a real headless Chromium (Debian's `chromium`, driven over the
Chrome DevTools protocol with aiohttp): filters work, untrusted text runs nothing, no
network request is made; screenshots are saved beside the test's output."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipeline.io import atomic
from tests.conftest import curate, free_port


class Browser:
    """One headless Chromium and one page, over CDP."""

    def __init__(self, tmp: Path):
        exe = shutil.which("chromium") or shutil.which("chromium-browser")
        if not exe:
            pytest.fail("chromium is not installed: `make test` installs Debian's chromium package (apt-get install chromium)")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--remote-debugging-port={self.port}",
             f"--user-data-dir={tmp / 'chrome'}", "--window-size=1280,1600", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=20)

    async def open(self, url: str, checks: dict[str, str], screenshot: Path, actions: list[str] = ()) -> dict:
        import aiohttp

        async with aiohttp.ClientSession() as http:
            for _ in range(100):
                try:
                    async with http.get(f"http://127.0.0.1:{self.port}/json/list") as r:
                        targets = await r.json()
                    break
                except aiohttp.ClientError:
                    await asyncio.sleep(0.1)
            page = next(t for t in targets if t["type"] == "page")
            async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                ids = iter(range(1, 10**6))
                events: list[dict] = []

                async def call(method, **params):
                    i = next(ids)
                    await ws.send_str(json.dumps({"id": i, "method": method, "params": params}))
                    while True:
                        msg = json.loads((await ws.receive()).data)
                        if msg.get("id") == i:
                            return msg.get("result", {})
                        events.append(msg)

                for m in ("Network.enable", "Page.enable", "Runtime.enable"):
                    await call(m)
                await call("Page.navigate", url=url)
                deadline = time.time() + 30
                while not any(e.get("method") == "Page.loadEventFired" for e in events) and time.time() < deadline:
                    msg = json.loads((await ws.receive()).data)
                    events.append(msg)
                await asyncio.sleep(0.5)
                for a in actions:
                    await call("Runtime.evaluate", expression=a)
                results = {}
                for k, expr in checks.items():
                    r = await call("Runtime.evaluate", expression=expr, returnByValue=True)
                    results[k] = r.get("result", {}).get("value")
                shot = await call("Page.captureScreenshot", format="png", captureBeyondViewport=False)
                screenshot.write_bytes(base64.b64decode(shot["data"]))
                requests = [e["params"]["request"]["url"] for e in events if e.get("method") == "Network.requestWillBeSent"]
                dialogs = [e for e in events if e.get("method") == "Page.javascriptDialogOpening"]
                return {"checks": results, "requests": requests, "dialogs": dialogs}


def _artifacts(tmp_path: Path) -> Path:
    out = Path(os.environ.get("CURATE_ARTIFACTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


def test_samples_page_filters_escapes_and_stays_offline(demo_run, tmp_path):
    page = demo_run / "samples" / "index.html"
    url = page.resolve().as_uri()
    b = Browser(tmp_path)
    try:
        shot = _artifacts(tmp_path) / "samples.png"
        res = asyncio.run(b.open(url, {
            "pwned": "typeof window.__pwned",
            "cards": "document.querySelectorAll('.doc').length",
            "shown": "[...document.querySelectorAll('.doc')].filter(d => d.style.display !== 'none').map(d => d.dataset.reason)",
            "planted_text": "document.body.textContent.includes('<script>window.__pwned = 1</script>')",
            "pairs": "document.querySelectorAll('.pair').length",
            "marks": "document.querySelectorAll('.pair mark').length",
            "scripts": "document.scripts.length",
            "rewritten": "[...document.querySelectorAll('.doc[data-rewritten]')].map(d => d.querySelector('.meta.rewritten').textContent)",
            "rewritten_marks": "[...document.querySelectorAll('.doc[data-rewritten]')]"
                               ".map(d => d.querySelectorAll('mark').length)",
            "rewritten_only": "(() => { const s = document.getElementById('reason'); s.value = ''; s.dispatchEvent(new Event('change'));"
                              " const r = document.getElementById('rw'); r.checked = true; r.dispatchEvent(new Event('change'));"
                              " return [...document.querySelectorAll('.doc')].filter(d => d.style.display !== 'none')"
                              ".map(d => d.dataset.rewritten === '1'); })()",
        }, shot, actions=["const s = document.getElementById('reason'); s.value = 'exact_duplicate_of'; s.dispatchEvent(new Event('change'));"]))
    finally:
        b.close()
    c = res["checks"]
    print(f"\nsamples page: {page.stat().st_size:,} bytes, {c['cards']} documents, {c['pairs']} side-by-side pairs; screenshot {shot}")
    assert c["pwned"] == "undefined" and not res["dialogs"]
    assert c["planted_text"] is True
    assert c["cards"] > 50 and c["shown"] and set(c["shown"]) == {"exact_duplicate_of"}
    assert c["pairs"] > 0 and c["marks"] > 0
    # rewritten documents (the demo's ftfy and pii on the crawl, paragraph dedup) beside their ingested text, changes marked
    assert any("fix_text" in x for x in c["rewritten"]) and any("redact_pii" in x for x in c["rewritten"]), c["rewritten"]
    assert all(n > 0 for n in c["rewritten_marks"])
    assert c["rewritten_only"] and all(c["rewritten_only"]) and len(c["rewritten_only"]) == len(c["rewritten"])
    assert c["scripts"] == 2  # the data block and the page's own script: none from documents
    assert [u for u in res["requests"] if u != url] == [], res["requests"]
    assert shot.stat().st_size > 10_000


def test_report_page_and_json_agree_with_ledger_and_manifest(demo_run, tmp_path):
    rep = atomic.read_json(demo_run / "report.json")
    led = atomic.read_json(demo_run / "ledger.json")
    man = atomic.read_json(demo_run / "manifest.json")
    for s, e in led["sources"].items():
        r = rep["sources"][s]
        assert (r["in"], r["kept"], r["removed"], r["quarantined"]) == (e["in"], e["kept"], e["removed_total"], e["quarantined"])
        assert [f["docs"] for f in r["funnel"]] == [st["docs_out"] for st in e["stages"]]
        assert r["removed_by_reason"] == e["removed"]
        assert r["mixture"] == man["sources"].get(s)
    q = rep["sources"]["web"]["quality"]
    assert sum(q["counts"]) == next(st["docs_in"] for st in led["sources"]["web"]["stages"] if st["stage"].startswith("quality"))
    assert rep["mixture"]["total_tokens"] == man["total_tokens"]
    # the histogram and language counts summed from shard markers equal those of the attribute files
    steps = atomic.read_json(demo_run / "run.json")["steps"]
    scores = pq.read_table(demo_run / steps["quality-web"]["dir"] / "web")
    seen = scores.filter(pc.is_valid(scores.column("keep"))).column("score").to_numpy()
    assert q["counts"] == np.histogram(seen, bins=20, range=(0.0, 1.0))[0].tolist()
    filt = pq.read_table(sorted((demo_run / steps["filter-web"]["dir"]).glob("part-*.parquet")))
    lang = next(c for c in filt.column_names if c.endswith(".lang"))
    assert rep["sources"]["web"]["languages"] == {
        v["values"]: v["counts"] for v in pc.value_counts(filt.column(lang).drop_null()).to_pylist()}
    page = demo_run / "report.html"
    url = page.resolve().as_uri()
    b = Browser(tmp_path)
    try:
        shot = _artifacts(tmp_path) / "report.png"
        res = asyncio.run(b.open(url, {"svgs": "document.querySelectorAll('svg').length",
                                       "h2": "[...document.querySelectorAll('h2')].map(h => h.textContent)"}, shot))
    finally:
        b.close()
    print(f"\nreport page: {page.stat().st_size:,} bytes, {res['checks']['svgs']} plots; screenshot {shot}")
    assert res["checks"]["svgs"] >= 5 and "Mixture" in res["checks"]["h2"]
    assert [u for u in res["requests"] if u != url] == []
    r = curate("report", str(demo_run))
    assert r.returncode == 0 and r.stdout.strip() == str(demo_run / "report.html")


def test_samples_command_slices_and_shows_survivors(demo_run, tmp_path):
    out = tmp_path / "fuzzy.html"
    r = curate("samples", str(demo_run), "--stage", "dedup-fuzzy", "--format", "html", "-n", "5", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size > 1000 and "survivor" in out.read_text()
    r = curate("samples", str(demo_run), "--source", "web", "--stage", "dedup-fuzzy", "-n", "4")
    recs = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(recs) == 4 and all(x["stage"] == "dedup:fuzzy" and x["survivor"]["text"] for x in recs)
    again = curate("samples", str(demo_run), "--source", "web", "--stage", "dedup-fuzzy", "-n", "4").stdout
    assert again == r.stdout  # the same seeded choice
    r = curate("samples", str(demo_run), "--reason", "too_few_stop_words", "-n", "3", "--format", "parquet", "--out", str(tmp_path / "s.parquet"))
    import pyarrow.parquet as pq

    t = pq.read_table(tmp_path / "s.parquet").to_pylist()
    assert len(t) == 3 and all(x["reason"] == "too_few_stop_words" for x in t)
    r = curate("explain", str(demo_run), "--all", "--out", str(tmp_path / "all.parquet"))
    assert r.returncode == 0, r.stderr
    allrows = pq.read_table(tmp_path / "all.parquet")
    led = atomic.read_json(demo_run / "ledger.json")
    assert allrows.num_rows == led["totals"]["in"]
    status = allrows.column("status").to_pylist()
    assert status.count("kept") == led["totals"]["kept"] and status.count("removed") == led["totals"]["removed_total"]


def test_report_figures_of_steps_cached_before_their_markers_carried_them_are_the_same(demo_run, monkeypatch):
    """Quality and filter steps cached by an older Curate have no histogram or language
    counts in their markers: the report counts them from the attribute files, to the same figures."""
    from pipeline.views import report

    rep = atomic.read_json(demo_run / "report.json")
    orig = report.read_markers

    def old_markers(d):
        return {k: {x: y for x, y in m.items() if x not in ("score_histogram", "languages")} for k, m in orig(d).items()}

    monkeypatch.setattr(report, "read_markers", old_markers)
    again = report.build(demo_run)
    for s, v in rep["sources"].items():
        assert again["sources"][s]["quality"] == v["quality"] and again["sources"][s]["languages"] == v["languages"], s
    assert rep["sources"]["web"]["languages"] and rep["sources"]["web"]["quality"]["counts"]
