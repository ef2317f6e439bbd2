"""The bad-input matrix: real broken files, each case under `on_bad_record: quarantine`
(the default: which records are kept, which are set aside with which reason, file, line or
row, and the ledger balances) and under `fail` (the exact `path:line: what; what to do`).

Cases not here yet (issue 9): duplicate ids within a source, an unreadable file as a
non-root user (tests run as root, for whom permissions do not apply), 1 GB shards."""

from __future__ import annotations

import gzip

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from pipeline import config, runner
from pipeline.errors import RunError
from pipeline.io import atomic
from tests.conftest import write_yaml


def _lines(texts: list[str], start: int = 0) -> bytes:
    return b"".join(orjson.dumps({"id": f"d{start + i}", "text": t}) + b"\n" for i, t in enumerate(texts))


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, wiki_texts) -> dict:
    """One folder per case."""
    d = tmp_path_factory.mktemp("bad")
    texts = wiki_texts[:300]
    files = {}

    def put(case: str, name: str, data: bytes):
        (d / case).mkdir(exist_ok=True)
        (d / case / name).write_bytes(data)
        files[case] = d / case / name

    # a zstd file of three frames whose middle frame is corrupt
    c = zstandard.ZstdCompressor(write_checksum=True)
    mid = bytearray(c.compress(_lines(texts[100:200], 100)))
    for i in range(len(mid) // 2, len(mid) // 2 + 64):
        mid[i] ^= 0x5A
    put("corrupt_zstd", "a.jsonl.zst", c.compress(_lines(texts[:100])) + bytes(mid) + c.compress(_lines(texts[200:300], 200)))
    gz = gzip.compress(_lines(texts[:200]))
    put("truncated_gz", "a.jsonl.gz", gz[: int(len(gz) * 0.6)])
    mixed = [
        orjson.dumps({"id": "ok1", "text": texts[0]}),
        b'{"id": "broken", "text": "unterminated',
        orjson.dumps({"id": "notext", "body": "no text field"}),
        orjson.dumps({"id": "num", "text": 42}),
        orjson.dumps({"id": "list", "text": ["a", "b"]}),
        orjson.dumps({"id": "null", "text": None}),
        b'{"id": "utf8", "text": "caf\xe9 \xff"}',
        orjson.dumps(["not", "an", "object"]),
        orjson.dumps({"id": "ok2", "text": texts[1]}),
    ]
    put("mixed", "a.jsonl", b"\n".join(mixed) + b"\n")
    put("empty", "a.jsonl", b"")
    (d / "empty" / "b.jsonl").write_bytes(b"\n\n   \n\n")
    huge = ("All work and no play makes Jack a dull boy. " * (50 * (1 << 20) // 44 + 1))[: 50 << 20]
    put("huge", "a.jsonl", orjson.dumps({"id": "huge", "text": huge}) + b"\n" + _lines(texts[:3]))
    t = pa.table({"id": ["p0", "p1", "p2"], "body": texts[:3]})
    (d / "parquet_no_text").mkdir()
    pq.write_table(t, d / "parquet_no_text" / "a.parquet")
    (d / "parquet_schemas").mkdir()
    pq.write_table(pa.table({"id": ["s0", "s1"], "text": texts[:2], "url": ["u0", "u1"]}), d / "parquet_schemas" / "a.parquet")
    pq.write_table(pa.table({"text": texts[2:5], "id": ["s2", "s3", "s4"], "lang": ["en"] * 3, "score": [0.1, 0.2, 0.3]}),
                   d / "parquet_schemas" / "b.parquet")
    return {"dir": d, "files": files}


def _mixture(d, policy: str, sources: list[str], extra: dict | None = None) -> str:
    lines = ["name: m", f"output: {d}/out-{policy}", "sources:"]
    for s in sources:
        ext = "parquet" if s.startswith("parquet") else "jsonl*"
        opts = {"paths": [f"{d}/{s.split('@')[0]}/*.{ext}"], "id_field": "id", "on_bad_record": policy, **(extra or {}).get(s, {})}
        lines.append(f"  {s.replace('@', '_')}: {orjson.dumps(opts).decode()}")
    return "\n".join(lines) + "\n"


def _quarantine(run_dir, source) -> list[dict]:
    out = []
    for f in sorted((run_dir / "quarantine" / source).glob("*.jsonl")):
        out += [orjson.loads(x) for x in f.read_bytes().splitlines()]
    return out


def _kept_ids(run_dir, source) -> set[str]:
    import pyarrow.dataset as ds

    t = ds.dataset(run_dir / "mixture", format="parquet").to_table(columns=["id", "source"])
    return {i for i, s in zip(t.column("id").to_pylist(), t.column("source").to_pylist(), strict=True) if s == source}


@pytest.fixture(scope="module")
def quarantine_run(ray_local, bad_files, tmp_path_factory):
    d = bad_files["dir"]
    sources = ["corrupt_zstd", "truncated_gz", "mixed", "empty", "huge", "huge@limited", "parquet_no_text", "parquet_schemas"]
    y = write_yaml(tmp_path_factory.mktemp("q") / "m.yaml",
                   _mixture(d, "quarantine", sources, {"huge@limited": {"max_doc_bytes": 10 << 20}}))
    run_dir = runner.run(config.load(y), log=lambda m: None, quiet=True)
    return run_dir, atomic.read_json(run_dir / "ledger.json")


def test_every_source_balances_and_nothing_is_lost(quarantine_run):
    run_dir, led = quarantine_run
    assert led["conservation"] is True
    for name, e in led["sources"].items():
        assert e["in"] == e["kept"] + e["removed_total"] + e["quarantined"], name


def test_a_corrupt_zstd_frame_keeps_what_came_before_and_says_the_rest_is_unknown(quarantine_run, bad_files):
    run_dir, led = quarantine_run
    q = _quarantine(run_dir, "corrupt_zstd")
    assert [r["reason"] for r in q] == ["corrupt_stream"]
    stop = q[0]["line"]
    assert 101 <= stop <= 200  # the break is in the middle frame: the first frame's 100 records are read
    assert _kept_ids(run_dir, "corrupt_zstd") == {f"d{i}" for i in range(stop - 1)}
    assert q[0]["unread_records"] == "unknown" and q[0]["file"] == str(bad_files["files"]["corrupt_zstd"])
    assert "re-fetch or repair the file" in q[0]["error"]
    e = led["sources"]["corrupt_zstd"]
    assert e["unread_after_corruption"] == "unknown" and e["quarantined_by_reason"] == {"corrupt_stream": 1}
    assert e["in"] == stop  # the records read, plus the one entry for the break


def test_a_truncated_gzip_keeps_every_complete_record(quarantine_run):
    run_dir, led = quarantine_run
    q = _quarantine(run_dir, "truncated_gz")
    assert [r["reason"] for r in q] == ["corrupt_stream"] and q[0]["unread_records"] == "unknown"
    stop = q[0]["line"]
    assert 50 < stop < 200
    assert _kept_ids(run_dir, "truncated_gz") == {f"d{i}" for i in range(stop - 1)}
    assert led["sources"]["truncated_gz"]["unread_after_corruption"] == "unknown"


def test_broken_lines_are_quarantined_with_line_reason_and_excerpt(quarantine_run, bad_files):
    run_dir, led = quarantine_run
    q = _quarantine(run_dir, "mixed")
    assert [(r["line"], r["reason"]) for r in q] == [
        (2, "invalid_json"), (3, "missing_text"), (4, "text_not_string"), (5, "text_not_string"),
        (6, "text_not_string"), (7, "invalid_utf8"), (8, "not_an_object")]
    errors = [r["error"] for r in q]
    assert errors[2:5] == ["field 'text' is a number, not a string", "field 'text' is a list, not a string",
                           "field 'text' is null, not a string"]
    assert errors[1] == "no field 'text'; fields present: id, body; set sources.mixed.text_field"
    first_line = bad_files["files"]["mixed"].read_bytes().split(b"\n")[0]
    assert q[0]["excerpt"] == '{"id": "broken", "text": "unterminated' and q[0]["offset"] == len(first_line) + 1
    assert all(r["file"] == str(bad_files["files"]["mixed"]) for r in q)
    assert _kept_ids(run_dir, "mixed") == {"ok1", "ok2"}
    assert led["sources"]["mixed"]["quarantined_by_reason"] == {
        "invalid_json": 1, "invalid_utf8": 1, "missing_text": 1, "not_an_object": 1, "text_not_string": 3}


def test_empty_files_and_blank_lines_are_no_records(quarantine_run):
    run_dir, led = quarantine_run
    e = led["sources"]["empty"]
    assert (e["in"], e["kept"], e["quarantined"], e["conservation"]) == (0, 0, 0, True)
    assert _quarantine(run_dir, "empty") == []


def test_a_50mb_document_is_kept_by_default_and_too_large_under_a_lower_limit(quarantine_run):
    run_dir, led = quarantine_run
    assert _kept_ids(run_dir, "huge") == {"huge", "d0", "d1", "d2"}
    q = _quarantine(run_dir, "huge_limited")
    assert [(r["line"], r["reason"]) for r in q] == [(1, "too_large")]
    assert q[0]["error"].startswith("the record has 52,428,8") and "over sources.huge_limited.max_doc_bytes (10,485,760)" in q[0]["error"]
    assert len(q[0]["excerpt"]) <= 200
    assert _kept_ids(run_dir, "huge_limited") == {"d0", "d1", "d2"}
    # memory stays bounded: the ingest worker's peak while it read, parsed and tokenised 50 MB
    rj = atomic.read_json(run_dir / "run.json")
    mk = atomic.read_json(run_dir / rj["steps"]["ingest-huge"]["dir"] / "_markers" / "part-00000.json")
    print(f"\npeak RSS of the ingest task with a 50 MB document: {mk['peak_rss_mb']} MB")
    assert mk["peak_rss_mb"] < 1500


def test_a_parquet_file_without_the_text_column_sets_every_row_aside(quarantine_run):
    run_dir, led = quarantine_run
    q = _quarantine(run_dir, "parquet_no_text")
    assert [(r["row"], r["reason"]) for r in q] == [(0, "missing_text"), (1, "missing_text"), (2, "missing_text")]
    assert q[0]["error"] == "no column 'text'; columns: id, body; set sources.parquet_no_text.text_field"
    e = led["sources"]["parquet_no_text"]
    assert (e["in"], e["kept"], e["quarantined"]) == (3, 0, 3)
    from pipeline import (
        decisions,  # what samples and `explain --all` show for them: file#row, as Parquet places are written
    )

    places = [r["source_id"] for r in decisions.quarantined(decisions.Run(run_dir), "parquet_no_text")]
    assert places == [f"{q[0]['file']}#{i}" for i in range(3)]


def test_parquet_files_with_different_schemas_in_one_source_are_all_read(quarantine_run):
    run_dir, led = quarantine_run
    assert _kept_ids(run_dir, "parquet_schemas") == {"s0", "s1", "s2", "s3", "s4"}
    assert led["sources"]["parquet_schemas"]["quarantined"] == 0


@pytest.mark.parametrize("case, place, message", [
    ("corrupt_zstd", ":1", None),  # checked below: the line where reading stopped
    ("truncated_gz", ":1", None),
    ("mixed", "a.jsonl:2", "invalid JSON: unexpected end of data"),
    ("huge@limited", "a.jsonl:1", "the record has 52,428,8"),
    ("parquet_no_text", "a.parquet row 0", "no column 'text'; columns: id, body; set sources.parquet_no_text.text_field"),
])
def test_under_fail_the_run_stops_at_the_first_bad_record_with_its_place(ray_local, bad_files, tmp_path, case, place, message):
    d = bad_files["dir"]
    extra = {"huge@limited": {"max_doc_bytes": 10 << 20}}
    y = write_yaml(tmp_path / "m.yaml", _mixture(d, "fail", [case], extra).replace(f"{d}/out-fail", str(tmp_path / "out")))
    with pytest.raises(RunError) as e:
        runner.run(config.load(y), log=lambda m: None, quiet=True)
    msg = str(e.value)
    source = case.replace("@", "_")
    assert f"step ingest-{source}, shard 0" in msg
    assert f"or set sources.{source}.on_bad_record: quarantine to set it aside" in msg
    if message:
        assert f"{place}: {message}" in msg
    else:
        assert "the compressed stream is unreadable from here on" in msg and "re-fetch or repair the file" in msg
    led = tmp_path / "out" / "m" / "ledger.json"
    assert not led.exists()  # a failed run publishes no ledger or mixture
    assert atomic.read_json(tmp_path / "out" / "m" / "run.json")["status"] == "FAILED"


# ---------------------------------------------------------------- property: nothing is lost


def _bad_line(kind: str, i: int) -> bytes:
    return {
        "invalid_json": b'{"id": "b%d", "text": "cut' % i,
        "missing_text": orjson.dumps({"id": f"b{i}", "body": "x"}),
        "text_not_string": orjson.dumps({"id": f"b{i}", "text": [i]}),
        "invalid_utf8": b'{"id": "b%d", "text": "\xff\xfe"}' % i,
        "not_an_object": orjson.dumps([i]),
    }[kind]


@pytest.mark.parametrize("compression", [None, "gzip", "zstd"])
def test_random_streams_with_injected_bad_records_lose_nothing(tmp_path, compression):
    """Hypothesis: any mix of good records (any Unicode text, blank lines between) and bad
    ones; every record is either a document with its text unchanged, in order, or a
    quarantine entry with the injected reason at its line."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from pipeline.executor import ShardOutput
    from pipeline.steps import ingest

    kinds = st.sampled_from(["invalid_json", "missing_text", "text_not_string", "invalid_utf8", "not_an_object"])
    good = st.text(st.characters(blacklist_categories=("Cs",)), max_size=60).map(lambda t: ("good", t))
    stream = st.lists(st.one_of(good, kinds.map(lambda k: ("bad", k)), st.just(("blank", ""))), max_size=40)

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(stream)
    def check(items):
        lines, want_docs, want_bad = [], [], []
        for i, (what, v) in enumerate(items):
            if what == "good":
                lines.append(orjson.dumps({"id": f"g{i}", "text": v}))
                want_docs.append((f"g{i}", v))
            elif what == "bad":
                lines.append(_bad_line(v, i))
                want_bad.append((len(lines), v))
            else:
                lines.append(b"   ")
        data = b"".join(x + b"\n" for x in lines)
        d = tmp_path / f"ex{abs(hash(data))}"
        d.mkdir()
        suffix = {None: "", "gzip": ".gz", "zstd": ".zst"}[compression]
        path = d / f"a.jsonl{suffix}"
        path.write_bytes(gzip.compress(data) if compression == "gzip"
                         else zstandard.ZstdCompressor().compress(data) if compression == "zstd" else data)
        f = {"path": str(path), "rel": path.name, "format": "jsonl", "compression": compression, "size": path.stat().st_size}
        spec = {"source": "s", "text_field": "text", "id_field": "id", "hf_split": None, "on_bad_record": "quarantine",
                "tokenizer": None, "max_doc_bytes": 1 << 20, "split": {"file": f}}
        stats = ingest.run_shard(spec, ShardOutput(str(d / "out"), 0))
        quarantined = sum(stats["quarantined"].values())
        assert stats["records_in"] == len(want_docs) + len(want_bad) == stats["docs_out"] + quarantined
        t = pq.read_table(d / "out" / "part-00000.parquet", columns=["id", "text"])
        assert list(zip(t.column("id").to_pylist(), t.column("text").to_pylist(), strict=True)) == want_docs
        q = [orjson.loads(x) for x in (d / "out" / "quarantine" / "part-00000.jsonl").read_bytes().splitlines()] if want_bad else []
        assert [(r["line"], r["reason"]) for r in q] == want_bad

    check()


def test_a_url_whose_filesystem_package_is_missing_gives_the_pip_line(tmp_path):
    """gcsfs is not installed in the test environment: gs:// inputs and outputs say how to get it."""
    from tests.conftest import curate

    y = write_yaml(tmp_path / "m.yaml", """
        name: m
        output: gs://bucket/runs
        sources:
          web: {paths: ["gs://bucket/crawl/*.jsonl.zst"]}
    """)
    r = curate("validate", str(y))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "m.yaml:4: sources.web.paths[0]: cannot read gs://bucket/crawl/*.jsonl.zst: Please install gcsfs to access Google Storage; " \
           "pip install 'curate[gcs]'" in r.stderr
    r = curate("run", str(y), "--output", "gs://bucket/other")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "gs://bucket/other: Please install gcsfs to access Google Storage; pip install 'curate[gcs]'" in r.stderr


def test_a_classifier_whose_source_is_filtered_empty_says_what_to_check(ray_local, tmp_path, demo_corpus):
    y = write_yaml(tmp_path / "m.yaml", f"""
        name: m
        sources:
          wiki: {{paths: ["{demo_corpus}/wiki/summaries_es.parquet"], id_field: id, max_shard_rows: 3000}}
          web:
            paths: ["{demo_corpus}/web/crawl-00000.jsonl.zst"]
            filters: [nothing_passes]
            quality: {{classifier: c, keep_fraction: 0.5}}
        filters:
          nothing_passes: {{type: length, min_chars: 1000000000}}
        classifiers:
          c: {{type: fasttext, positive: [wiki], negative: [web]}}
    """)
    with pytest.raises(RunError) as e:
        runner.run(config.load(y), log=lambda m: None, quiet=True)
    msg = str(e.value)
    assert "step classify-c-train, shard 0" in msg and "traceback" not in msg
    assert "classifier c: only 6239 positive and 0 negative examples reach training (after their sources' filters and dedup); " \
           "fastText needs thousands of documents per class: check classifiers.c.positive and .negative" in msg
