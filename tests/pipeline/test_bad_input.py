"""The bad-input matrix: real broken files, each case under `on_bad_record: quarantine`
(the default: which records are kept, which are set aside with which reason, file, line or
row, and the ledger balances) and under `fail` (the exact `path:line: what; what to do`).

Also here: duplicate ids within a source (the first use kept, later ones quarantined with
its place), a line too long to hold (read through, never whole), and peak memory on a 1 GB
shard. An unreadable file is tested as root without the capability that ignores permissions."""

from __future__ import annotations

import gzip

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from pipeline import config
from pipeline.run import runner
from pipeline.errors import RunError
from pipeline.io import atomic
from tests.conftest import curate, write_yaml


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
    # Parquet: the second row group's page header damaged; a file cut in half (no footer)
    (d / "parquet_corrupt").mkdir()
    pq.write_table(pa.table({"id": [f"c{i}" for i in range(200)], "text": texts[:200]}), d / "parquet_corrupt" / "a.parquet",
                   row_group_size=100, use_dictionary=False)
    raw = bytearray((d / "parquet_corrupt" / "a.parquet").read_bytes())
    at = pq.ParquetFile(d / "parquet_corrupt" / "a.parquet").metadata.row_group(1).column(1).data_page_offset
    raw[at:at + 8] = bytes(b ^ 0xFF for b in raw[at:at + 8])
    (d / "parquet_corrupt" / "a.parquet").write_bytes(bytes(raw))
    whole = pa.BufferOutputStream()
    pq.write_table(pa.table({"id": ["t0", "t1"], "text": texts[:2]}), whole)
    whole = whole.getvalue().to_pybytes()
    (d / "parquet_corrupt" / "b.parquet").write_bytes(whole[: len(whole) // 2])
    put("dup_ids", "a.jsonl", b"".join(orjson.dumps({"id": i, "text": t}) + b"\n"
                                        for i, t in [("d0", texts[0]), ("d1", texts[1]), ("d0", texts[2])]))
    (d / "dup_ids" / "b.jsonl.gz").write_bytes(gzip.compress(_lines([texts[3]], 1) + _lines([texts[4]], 3)))
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
    sources = ["corrupt_zstd", "truncated_gz", "mixed", "empty", "huge", "huge@limited", "parquet_no_text", "parquet_schemas",
               "dup_ids", "parquet_corrupt"]
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


def test_a_first_runs_published_samples_and_the_samples_command_show_quarantined_records(quarantine_run, bad_files):
    """The samples step runs before the run publishes <run>/quarantine: it reads the ingest
    step's quarantine files. `--stage ingest` and `--reason` reach quarantined records."""
    run_dir, _ = quarantine_run
    removed = [orjson.loads(x) for x in (run_dir / "samples" / "mixed" / "removed.jsonl").read_bytes().splitlines()]
    got = sorted((r["status"], r["stage"], r["reason"], r["source_id"]) for r in removed)
    f = str(bad_files["files"]["mixed"])
    assert got == sorted([("quarantined", "ingest", "invalid_json", f"{f}:2"), ("quarantined", "ingest", "missing_text", f"{f}:3"),
                          ("quarantined", "ingest", "invalid_utf8", f"{f}:7"), ("quarantined", "ingest", "not_an_object", f"{f}:8")]
                         + [("quarantined", "ingest", "text_not_string", f"{f}:{line}") for line in (4, 5, 6)])
    assert all(r["error"] for r in removed)

    def cli(*args) -> list[dict]:
        res = curate("samples", str(run_dir), *args)
        assert res.returncode == 0, res.stderr
        return [orjson.loads(x) for x in res.stdout.splitlines()]

    by_stage = cli("--source", "mixed", "--stage", "ingest", "-n", "20")
    assert sorted(r["source_id"] for r in by_stage) == sorted(f"{f}:{line}" for line in range(2, 9))
    by_reason = cli("--reason", "invalid_json")
    assert [(r["source"], r["source_id"], r["status"]) for r in by_reason] == [("mixed", f"{f}:2", "quarantined")]


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
    from pipeline.shards import decisions

    places = [r["source_id"] for r in decisions.quarantined(decisions.Run(run_dir), "parquet_no_text")]
    assert places == [f"{q[0]['file']}#{i}" for i in range(3)]


def test_parquet_files_with_different_schemas_in_one_source_are_all_read(quarantine_run):
    run_dir, led = quarantine_run
    assert _kept_ids(run_dir, "parquet_schemas") == {"s0", "s1", "s2", "s3", "s4"}
    assert led["sources"]["parquet_schemas"]["quarantined"] == 0


def test_a_reused_id_keeps_the_first_use_and_quarantines_the_later_ones(quarantine_run, bad_files):
    run_dir, led = quarantine_run
    d = bad_files["dir"] / "dup_ids"
    assert _kept_ids(run_dir, "dup_ids") == {"d0", "d1", "d3"}
    q = [(r["file"], r["line"], r["reason"], r["error"]) for r in _quarantine(run_dir, "dup_ids")]
    tail = "(that record is kept); ids must be unique within a source: fix the data, or drop sources.dup_ids.id_field to give every record a content id"
    assert q == [(f"{d}/a.jsonl", 3, "duplicate_id", f"id 'd0' is already used at {d}/a.jsonl:1 {tail}"),
                 (f"{d}/b.jsonl.gz", 1, "duplicate_id", f"id 'd1' is already used at {d}/a.jsonl:2 {tail}")]
    e = led["sources"]["dup_ids"]
    assert (e["in"], e["kept"], e["quarantined_by_reason"]) == (5, 3, {"duplicate_id": 2})


def test_a_damaged_parquet_file_keeps_the_row_groups_before_the_damage(quarantine_run, bad_files):
    run_dir, led = quarantine_run
    d = bad_files["dir"] / "parquet_corrupt"
    assert _kept_ids(run_dir, "parquet_corrupt") == {f"c{i}" for i in range(100)}
    q = [(r["file"], r["row"], r["reason"], r["unread_records"], r["error"][:60]) for r in _quarantine(run_dir, "parquet_corrupt")]
    assert q == [(f"{d}/a.parquet", 100, "corrupt_file", "unknown", "the file is unreadable from row 100 on (OSError: Couldn't de"),
                 (f"{d}/b.parquet", None, "corrupt_file", "unknown", "not a readable parquet file (ArrowInvalid: Parquet magic byt")]
    e = led["sources"]["parquet_corrupt"]
    assert (e["in"], e["kept"], e["quarantined"], e["unread_after_corruption"]) == (102, 100, 2, "unknown")


def test_an_unreadable_file_stops_validate_under_fail_and_is_set_aside_under_quarantine(tmp_path):
    """Run as root without the capabilities that ignore file permissions (setpriv)."""
    import os
    import shutil

    from tests.conftest import curate

    prefix = []
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("root without setpriv: permissions cannot be made to apply")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_bytes(_lines(["A readable record."]))
    (tmp_path / "in" / "b.jsonl").write_bytes(_lines(["A record nobody may read."], 1))
    (tmp_path / "in" / "b.jsonl").chmod(0)
    for policy in ("fail", "quarantine"):
        write_yaml(tmp_path / f"{policy}.yaml", f"""
            name: u
            output: {tmp_path}/out
            sources:
              s: {{paths: ["{tmp_path}/in/*.jsonl"], on_bad_record: {policy}}}
            """)
    r = curate("validate", str(tmp_path / "fail.yaml"), prefix=prefix)
    assert r.returncode == 2, r.stderr
    assert (f"fail.yaml:4: sources.s.paths[0]: {tmp_path}/in/b.jsonl cannot be read (Permission denied); give the user "
            "running curate read access (e.g. chmod a+r), or set sources.s.on_bad_record: quarantine") in r.stderr
    r = curate("run", str(tmp_path / "quarantine.yaml"), "--workers", "1", prefix=prefix)
    assert r.returncode == 0, r.stderr[-3000:]
    run_dir = tmp_path / "out" / "u"
    assert [(x["file"], x["reason"], x["unread_records"]) for x in _quarantine(run_dir, "s")] == [
        (f"{tmp_path}/in/b.jsonl", "unreadable_file", "unknown")]
    e = atomic.read_json(run_dir / "ledger.json")["sources"]["s"]
    assert (e["kept"], e["quarantined_by_reason"], e["unread_after_corruption"], e["conservation"]) == (
        1, {"unreadable_file": 1}, "unknown", True)
    # chmod leaves mtime alone: the plan still sees the change, and reads the file again
    plan = curate("plan", str(tmp_path / "quarantine.yaml"), prefix=prefix).stdout
    assert {ln.split()[0]: ln.split()[2] for ln in plan.splitlines() if ln.startswith("ingest-")} == {"ingest-s": "skip"}
    (tmp_path / "in" / "b.jsonl").chmod(0o644)
    plan = curate("plan", str(tmp_path / "quarantine.yaml"), prefix=prefix).stdout
    assert {ln.split()[0]: ln.split()[2] for ln in plan.splitlines() if ln.startswith("ingest-")} == {"ingest-s": "run"}


@pytest.mark.parametrize("case, place, message", [
    ("corrupt_zstd", ":1", None),  # checked below: the line where reading stopped
    ("truncated_gz", ":1", None),
    ("mixed", "a.jsonl:2", "invalid JSON: unexpected end of data"),
    ("huge@limited", "a.jsonl:1", "the record has 52,428,8"),
    ("parquet_no_text", "a.parquet row 0", "no column 'text'; columns: id, body; set sources.parquet_no_text.text_field"),
    ("parquet_corrupt", "a.parquet row 100", "the file is unreadable from row 100 on (OSError: Couldn't deserialize thrift"),
    ("dup_ids", "a.jsonl:3", "id 'd0' is used again (first at {d}/dup_ids/a.jsonl:1); ids must be unique within a source"),
])
def test_under_fail_the_run_stops_at_the_first_bad_record_with_its_place(ray_local, bad_files, tmp_path, case, place, message):
    d = bad_files["dir"]
    extra = {"huge@limited": {"max_doc_bytes": 10 << 20}}
    y = write_yaml(tmp_path / "m.yaml", _mixture(d, "fail", [case], extra).replace(f"{d}/out-fail", str(tmp_path / "out")))
    with pytest.raises(RunError) as e:
        runner.run(config.load(y), log=lambda m: None, quiet=True)
    msg = str(e.value)
    source = case.replace("@", "_")
    step, aside = ("unique-ids", "the later uses") if case == "dup_ids" else ("ingest", "it")
    if case == "parquet_corrupt" and "shard 1" in msg:  # two bad files, two parallel shards: either may stop the run
        place, message = "b.parquet", "not a readable parquet file (ArrowInvalid: Parquet magic bytes not found"
    else:
        assert f"step {step}-{source}, shard 0" in msg
    assert f"or set sources.{source}.on_bad_record: quarantine to set {aside} aside" in msg
    if message:
        assert f"{place}: {message.format(d=d)}" in msg
    else:
        assert "the compressed stream is unreadable from here on" in msg and "re-fetch or repair the file" in msg
    led = tmp_path / "out" / "m" / "ledger.json"
    assert not led.exists()  # a failed run publishes no ledger or mixture
    assert atomic.read_json(tmp_path / "out" / "m" / "run.json")["status"] == "FAILED"


# ---------------------------------------------------------------- config


def test_an_output_holding_another_mixture_files_run_is_refused_unless_overwrite(ray_local, tmp_path, bad_files):
    from pipeline.errors import UsageError

    text = f"""
        name: same
        output: out
        sources:
          s: {{paths: ["{bad_files['dir']}/parquet_schemas/*.parquet"]}}
    """
    a, b = write_yaml(tmp_path / "a.yaml", text), write_yaml(tmp_path / "b.yaml", text)
    run_dir = runner.run(config.load(a), log=lambda m: None, quiet=True)
    runner.run(config.load(a), log=lambda m: None, quiet=True)  # the same file again: the normal loop
    with pytest.raises(UsageError) as e:
        runner.run(config.load(b), log=lambda m: None, quiet=True)
    assert str(e.value).startswith(f"{run_dir} holds a run of another mixture file ({a}), not {b}; give this one its own "
                                   "`name` or `output` (or --output DIR), or pass --overwrite")
    from tests.conftest import curate

    r = curate("validate", str(b))  # caught before any Ray task
    assert r.returncode == 2 and f"error: {run_dir} holds a run of another mixture file ({a}), not {b}" in r.stderr
    runner.run(config.load(b), log=lambda m: None, quiet=True, overwrite=True)
    assert atomic.read_json(run_dir / "run.json")["mixture_file"] == str(b)


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

    from pipeline.engine.step import ShardOutput
    from pipeline.steps.ingest import documents as ingest

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


# ---------------------------------------------------------------- memory: a 1 GB shard, a 300 MB line

_MEASURE = r"""
import json, sys
from pipeline.engine.step import ShardOutput
from pipeline.engine.task import peak_rss_mb as _peak_rss_mb, reset_peak_rss as _reset_peak_rss
from pipeline.steps.ingest import documents as ingest
reset = _reset_peak_rss()
st = ingest.run_shard(json.loads(sys.argv[1]), ShardOutput(sys.argv[2], 0))
print(json.dumps({"peak_mb": _peak_rss_mb(reset), "docs": st["docs_out"], "quarantined": st["quarantined"]}))
"""


def _ingest_peak(path, tmp, tokenizer=None) -> dict:
    import json
    import subprocess
    import sys

    f = {"path": str(path), "rel": path.name, "format": "jsonl", "compression": "zstd", "size": path.stat().st_size}
    spec = {"source": "s", "text_field": "text", "id_field": None, "hf_split": None, "on_bad_record": "quarantine",
            "tokenizer": tokenizer, "max_doc_bytes": 8 << 20, "split": {"file": f}}
    r = subprocess.run([sys.executable, "-c", _MEASURE, json.dumps(spec), str(tmp)], capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def test_peak_memory_of_an_ingest_task_does_not_grow_with_the_shard_or_a_giant_line(tmp_path, wiki_texts):
    """One shard of 1 GB of JSONL (zstd), with a 300 MB line in the middle (over an 8 MB
    max_doc_bytes: read through, quarantined), against a 64 MB shard of the same records.
    A line under the limit is held whole (up to about twice the limit while it is read)."""
    import time

    chunk = _lines(["\n\n".join(wiki_texts[i:i + 5]) for i in range(0, 5000, 5)])  # ~2.6 MB: 1,000 pages of ~2.6 KB
    sizes = {}
    for name, total, giant in [("small", 64 << 20, False), ("big", 1 << 30, True)]:
        p = tmp_path / f"{name}.jsonl.zst"
        n = 0
        with p.open("wb") as fh, zstandard.ZstdCompressor(level=1).stream_writer(fh) as w:
            while n < total:
                if giant and n >= total // 2:
                    line = b'{"id": "giant", "text": "' + b"x" * (300 << 20) + b'"}\n'
                    w.write(line)
                    n += len(line)
                    giant = False
                w.write(chunk)
                n += len(chunk)
        sizes[name] = n
    t0 = time.time()
    small = _ingest_peak(tmp_path / "small.jsonl.zst", tmp_path / "o1")
    big = _ingest_peak(tmp_path / "big.jsonl.zst", tmp_path / "o2")
    print(f"\ningest peak RSS: {sizes['small'] / 2**20:.0f} MB shard {small['peak_mb']} MB; "
          f"{sizes['big'] / 2**20:.0f} MB shard with a 300 MB line {big['peak_mb']} MB ({time.time() - t0:.1f}s)")
    assert big["quarantined"] == {"too_large": 1}
    assert big["docs"] > 10 * small["docs"]
    assert big["peak_mb"] - small["peak_mb"] < 60  # bounded by the batch and the limit, not by the shard or the line
