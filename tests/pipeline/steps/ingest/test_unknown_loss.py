"""Losses that cannot be counted are not hidden (issue 34): a `.jsonl.gz` cut short and a
Parquet file cut in half, under `on_bad_record: quarantine`. The run finishes (exit 0) with
every good record kept, but its ledger says conservation "unknown" for those sources, not
true; the summary `curate run` prints, report.json and report.html, `curate runs` (and
--json), `curate diff` and the dataset card name the cut files; the YAML's `publish:`
section and `curate publish` leave the run unpublished unless --allow-unknown-loss, and the
card then says so in its first lines. One small run, shared by the tests of this module
(joined to the session's Ray); the ledger's arithmetic is checked without one."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from pipeline.io import atomic
from pipeline.shards import ledger
from tests.conftest import curate, write_yaml
from tests.pipeline.steps.ingest.test_bad_input import _lines, _quarantine

TEXTS = [f"Document number {i} of the small corpus, with a few words to keep it plain." for i in range(120)]


@pytest.fixture(scope="module")
def cut_run(tmp_path_factory, joined) -> dict:
    d = tmp_path_factory.mktemp("unknown_loss")
    (d / "gz").mkdir()
    (d / "gz" / "a.jsonl.gz").write_bytes(gzip.compress(_lines(TEXTS[:20])))
    whole = gzip.compress(_lines(TEXTS[20:120], 20))
    (d / "gz" / "b.jsonl.gz").write_bytes(whole[: int(len(whole) * 0.6)])  # truncated
    (d / "pq").mkdir()
    pq.write_table(pa.table({"id": [f"p{i}" for i in range(10)], "text": TEXTS[:10]}), d / "pq" / "a.parquet")
    buf = pa.BufferOutputStream()
    pq.write_table(pa.table({"id": [f"q{i}" for i in range(10)], "text": TEXTS[10:20]}), buf)
    whole = buf.getvalue().to_pybytes()
    (d / "pq" / "b.parquet").write_bytes(whole[: len(whole) // 2])  # cut in half: no footer
    y = write_yaml(d / "m.yaml", f"""
        name: cut
        output: {d}/out
        sources:
          gz: {{paths: ["{d}/gz/*.jsonl.gz"], id_field: id}}
          pq: {{paths: ["{d}/pq/*.parquet"], id_field: id}}
        publish: {{dir: "{d}/published/{{name}}"}}
        """)
    r = curate("run", str(y), "--workers", "2", env=joined)
    return {"dir": d, "run": d / "out" / "cut", "result": r, "cut": {"gz": str(d / "gz" / "b.jsonl.gz"),
                                                                      "pq": str(d / "pq" / "b.parquet")}}


def test_the_run_finishes_keeps_the_good_records_and_its_ledger_says_unknown(cut_run):
    r, run_dir = cut_run["result"], cut_run["run"]
    assert r.returncode == 0, r.stderr[-3000:]
    t = ds.dataset(run_dir / "mixture", format="parquet").to_table(columns=["id", "source"])
    kept = set(zip(t.column("source").to_pylist(), t.column("id").to_pylist(), strict=True))
    stop = _quarantine(run_dir, "gz")[0]["line"]  # where the truncated stream stopped
    assert 20 < stop < 100
    assert kept == {("gz", f"d{i}") for i in range(20 + stop - 1)} | {("pq", f"p{i}") for i in range(10)}
    led = atomic.read_json(run_dir / "ledger.json")
    assert led["conservation"] == "unknown"
    for s, e in led["sources"].items():
        assert e["conservation"] == "unknown", s
        assert e["in"] == e["kept"] + e["removed_total"] + e["quarantined"], s  # the counted part still balances
        assert [f["file"] for f in e["unread_files"]] == [cut_run["cut"][s]]
    assert ledger.imbalance(led) == []


def test_the_summary_names_the_cut_files_and_says_the_run_is_not_published(cut_run):
    out, run_dir = cut_run["result"].stdout, cut_run["run"]
    assert "unknown loss: 2 input files were cut or could not be read" in out
    assert f"  {cut_run['cut']['gz']} (source gz): " in out and f"  {cut_run['cut']['pq']} (source pq): " in out
    rows = {ln.split()[0]: ln.split()[-1] for ln in out.splitlines() if ln.startswith(("gz ", "pq "))}
    assert rows == {"gz": "unknown", "pq": "unknown"}  # the `balanced` column
    published = cut_run["dir"] / "published" / "cut"
    assert not published.exists()
    assert f"not published (unknown loss): `curate publish {run_dir} {published} --allow-unknown-loss`" in out


def test_the_report_and_curate_runs_name_the_cut_files(cut_run):
    run_dir, cut = cut_run["run"], cut_run["cut"]
    rep = atomic.read_json(run_dir / "report.json")
    assert rep["conservation"] == "unknown"
    assert [(f["source"], f["file"]) for f in rep["unread_files"]] == [("gz", cut["gz"]), ("pq", cut["pq"])]
    assert {s: e["conservation"] for s, e in rep["sources"].items()} == {"gz": "unknown", "pq": "unknown"}
    page = (run_dir / "report.html").read_text()
    assert "Unknown loss: 2 input files were cut or could not be read" in page
    assert page.index("Unknown loss") < page.index("<h2>Sources</h2>") and cut["gz"] in page and cut["pq"] in page
    r = curate("runs", str(run_dir.parent), "--json")
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout)[0]
    assert row["conservation"] == "unknown" and [f["file"] for f in row["unread_files"]] == [cut["gz"], cut["pq"]]
    text = curate("runs", str(run_dir.parent)).stdout.splitlines()
    assert text[1].startswith("cut ") and "! 2 input files were cut or could not be read" in text[2]
    assert f"{cut['gz']} (source gz); {cut['pq']} (source pq)" in text[2]
    r = curate("diff", str(run_dir), str(run_dir))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "A: unknown loss: 2 input files were cut or could not be read" in r.stdout and f"{cut['pq']} (source pq)" in r.stdout


def test_publish_refuses_the_run_unless_allowed_and_the_card_then_says_so_first(cut_run, tmp_path):
    run_dir, cut = cut_run["run"], cut_run["cut"]
    r = curate("publish", str(run_dir), str(tmp_path / "hub"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert (f"publish: {run_dir}: 2 input files were cut or could not be read, so the records after the damage were neither "
            f"read nor counted (ledger conservation: unknown): {cut['gz']} (source gz); {cut['pq']} (source pq). Re-fetch or "
            f"repair the files and run again, or publish the run as it is with `curate publish {run_dir} {tmp_path / 'hub'} "
            "--allow-unknown-loss`") in r.stderr
    assert not (tmp_path / "hub").exists()
    r = curate("publish", str(run_dir), str(tmp_path / "hub"), "--allow-unknown-loss")
    assert r.returncode == 0, r.stderr[-2000:]
    card = (tmp_path / "hub" / "README.md").read_text()
    body = card.split("\n---\n", 1)[1].lstrip().splitlines()
    assert body[0] == "# cut" and body[2].startswith("**Unknown loss: 2 input files were cut or could not be read")
    # named relative to the mixture file: a published card holds no path of this machine (issue 51, item 12)
    assert "`gz/b.jsonl.gz` (source `gz`); `pq/b.parquet` (source `pq`)" in body[2] and cut["gz"] not in card
    assert "Every document is accounted for" not in card and "(ledger conservation: unknown)" in card


def test_an_imbalance_is_false_whatever_else_and_only_it_fails_the_run():
    def entry(kept, stream_error=None):
        ingest = {0: {"records_in": 10, "docs_out": 9, "chars": 90, "quarantined": {"corrupt_stream": 1},
                      "stream_error": stream_error}}
        return ledger.source_entry("s", ingest, None, [], {"kept": kept, "rows": kept, "tokens": 0, "repeats": 0})

    assert (entry(9)["conservation"], entry(9, "cut")["conservation"], entry(8, "cut")["conservation"]) == (True, "unknown", False)
    assert ledger.build({"a": entry(9), "b": entry(9, "cut")})["conservation"] == "unknown"
    led = ledger.build({"a": entry(9, "cut"), "b": entry(8, "cut")})
    assert led["conservation"] is False
    assert [x.split(":")[0] for x in ledger.imbalance(led)] == ["source b"]
    # a ledger written before: conservation true beside unread_after_corruption "unknown" is still a loss
    old = {"sources": {"s": {"conservation": True, "unread_after_corruption": "unknown", "unreadable_streams": ["cut"]}}}
    assert ledger.unread_files(old) == [{"source": "s", "file": None, "error": "cut"}]
