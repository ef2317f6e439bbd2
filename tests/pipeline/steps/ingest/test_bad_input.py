"""The bad-input matrix: real broken files, each case under `on_bad_record: quarantine`
(the default: which records are kept, which are set aside with which reason, file, line or
row, and the ledger balances) and under `fail` (the exact `path:line: what; what to do`).

Also here: duplicate ids within a source (the first use kept, later ones quarantined with
its place), and the config errors of runs over these inputs (an output holding another
mixture file's run, a classifier whose source is filtered empty). Files that cannot be read
at all, random streams with bad records injected, URLs whose filesystem package is missing
and peak memory on a 1 GB shard: tests/pipeline/steps/ingest/test_bad_files.py."""

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


def test_every_source_balances_and_nothing_is_lost(quarantine_run, bad_files):
    """What was read balances everywhere; a source with a stream or file cut short cannot
    count what followed the damage: its conservation is "unknown", with the files named."""
    run_dir, led = quarantine_run
    cut = {"corrupt_zstd": ["corrupt_zstd/a.jsonl.zst"], "truncated_gz": ["truncated_gz/a.jsonl.gz"],
           "parquet_corrupt": ["parquet_corrupt/a.parquet", "parquet_corrupt/b.parquet"]}
    d = bad_files["dir"]
    assert led["conservation"] == "unknown"
    for name, e in led["sources"].items():
        assert e["in"] == e["kept"] + e["removed_total"] + e["quarantined"], name
        assert e["conservation"] == ("unknown" if name in cut else True), name
        assert [f["file"] for f in e["unread_files"]] == [str(d / f) for f in cut.get(name, [])], name


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



def test_two_mixture_files_of_one_name_in_two_folders_do_not_share_a_run_directory(ray_local, tmp_path):
    """Ownership is the file's resolved path, not its name: x/mixture.yaml and y/mixture.yaml
    with the same `name` and `output` are two experiments. Editing x/mixture.yaml in place
    stays the normal loop; a Ray job's copy of the file (a new folder per job) is the file
    at its path inside the working directory; a run.json without `mixture_file` binds nothing."""
    from pipeline.errors import UsageError
    from pipeline.run.record import check_owner

    (tmp_path / "d.jsonl").write_text('{"text": "one two three"}\n')
    text = f"""
        name: same
        output: {tmp_path}/out
        sources:
          s: {{paths: ["{tmp_path}/d.jsonl"]}}
    """
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    x, y = write_yaml(tmp_path / "x" / "mixture.yaml", text), write_yaml(tmp_path / "y" / "mixture.yaml", text)
    run_dir = runner.run(config.load(x), log=lambda m: None, quiet=True)
    write_yaml(x, text.replace("name: same", "name: same\n        seed: 1"))  # edited in place: the normal loop
    runner.run(config.load(x), log=lambda m: None, quiet=True)
    with pytest.raises(UsageError) as e:
        runner.run(config.load(y), log=lambda m: None, quiet=True)
    assert str(e.value).startswith(f"{run_dir} holds a run of another mixture file ({x}), not {y}; ")
    assert "a mixture.yaml in another folder is another mixture file" in str(e.value)
    r = curate("validate", str(y))
    assert r.returncode == 2 and f"holds a run of another mixture file ({x}), not {y}" in r.stderr
    assert "Traceback" not in r.stderr

    def owner(mixture_file, path):
        atomic.write_json(run_dir / "run.json", {"mixture_file": mixture_file} if mixture_file else {})
        check_owner(config.load(path), run_dir, overwrite=False)

    jobs = tmp_path / "ray" / "session_1" / "runtime_resources" / "working_dir_files"
    for d in ("_ray_pkg_aaa/x", "_ray_pkg_bbb/x", "_ray_pkg_ccc/y"):
        (jobs / d).mkdir(parents=True)
    copies = [write_yaml(jobs / f"_ray_pkg_{h}" / "x" / "mixture.yaml", text) for h in ("aaa", "bbb")]
    other = write_yaml(jobs / "_ray_pkg_ccc" / "y" / "other.yaml", text)
    owner(str(copies[0]), copies[1])  # the next job's copy of the same file
    owner(str(x), copies[0])  # a job submitted from the checkout that ran x/mixture.yaml
    owner(str(copies[0]), x)  # and back
    owner(None, y)  # a run.json of old code without mixture_file: nobody's yet
    with pytest.raises(UsageError):
        owner(str(copies[0]), other)
    with pytest.raises(UsageError):
        owner(str(copies[0]), y)


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
