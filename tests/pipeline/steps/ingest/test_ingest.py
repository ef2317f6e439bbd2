"""Ingest on real files through real Ray: ids, quarantine, the fail policy, every format."""

from __future__ import annotations

import gzip

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash

from pipeline import config
from pipeline.run import runner
from pipeline.errors import RunError
from pipeline.io import atomic
from tests.conftest import curate, write_yaml


def _run(yaml_path, output=None):
    return runner.run(config.load(yaml_path), output=str(output) if output else None, log=lambda m: None)


def _mixture_rows(run_dir) -> list[dict]:
    """The mixture's rows in input order (the mixture itself is shuffled): sources in YAML
    order, then ingest shard and row."""
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    rj = atomic.read_json(run_dir / "run.json")
    position = {}
    order = atomic.read_json(run_dir / rj["steps"]["mix-select"]["dir"] / "step.json")["config"]["sources"]  # YAML order
    for name in order:
        st = rj["steps"][f"ingest-{name}"]
        for f in sorted((run_dir / st["dir"]).glob("part-*.parquet")):
            for i in pq.read_table(f, columns=["id"]).column("id").to_pylist():
                position[(name, i)] = len(position)
    rows = ds.dataset(run_dir / "mixture", format="parquet").to_table().to_pylist()
    return sorted(rows, key=lambda r: (position[(r["source"], r["id"])], r["epoch"]))


@pytest.fixture
def broken_jsonl(tmp_path, wiki_texts):
    lines = [orjson.dumps({"text": wiki_texts[0], "url": "u0"}),
             b'{"text": "unterminated',
             orjson.dumps({"text": wiki_texts[1], "url": "u2"}),
             b"",
             orjson.dumps({"body": "no text field here"}),
             orjson.dumps({"text": 42}),
             b"\xff\xfe not utf-8",
             orjson.dumps({"text": wiki_texts[2]})]
    (tmp_path / "data").mkdir()
    p = tmp_path / "data" / "a.jsonl.gz"
    p.write_bytes(gzip.compress(b"\n".join(lines) + b"\n"))
    return p


def test_quarantine_records_file_line_and_error(ray_local, tmp_path, broken_jsonl):
    y = write_yaml(tmp_path / "m.yaml", """
        name: q
        sources:
          web: {paths: ["data/*.jsonl.gz"]}
    """)
    run_dir = _run(y)
    q = [orjson.loads(x) for x in (run_dir / "quarantine" / "web" / "part-00000.jsonl").read_bytes().splitlines()]
    assert [(r["line"], r["reason"]) for r in q] == [
        (2, "invalid_json"), (5, "missing_text"), (6, "text_not_string"), (7, "invalid_utf8")]
    assert all(r["file"] == str(broken_jsonl) for r in q)
    assert q[0]["excerpt"] == '{"text": "unterminated' and q[0]["error"].startswith("invalid JSON")
    assert q[1]["error"] == "no field 'text'; fields present: body; set sources.web.text_field"
    assert q[2]["error"] == "field 'text' is a number, not a string"
    led = atomic.read_json(run_dir / "ledger.json")["sources"]["web"]
    assert (led["in"], led["kept"], led["quarantined"], led["conservation"]) == (7, 3, 4, True)  # the blank line is no record
    assert led["quarantined_by_reason"] == {"invalid_json": 1, "invalid_utf8": 1, "missing_text": 1, "text_not_string": 1}
    rows = _mixture_rows(run_dir)
    assert [r["source_id"] for r in rows] == ["a.jsonl.gz:1", "a.jsonl.gz:3", "a.jsonl.gz:8"]


def test_fail_policy_stops_with_file_and_line(tmp_path, broken_jsonl, joined_1cpu):
    y = write_yaml(tmp_path / "m.yaml", """
        name: f
        sources:
          web: {paths: ["data/*.jsonl.gz"], on_bad_record: fail}
    """)
    r = curate("run", str(y), "--workers", "1", env=joined_1cpu)
    assert r.returncode == 1, r.stderr
    assert (f"{broken_jsonl}:2: invalid JSON: unexpected end of data: line 1 column 23 (char 22); fix the record, "
            "or set sources.web.on_bad_record: quarantine to set it aside") in r.stderr
    assert "step ingest-web, shard 0" in r.stderr
    assert "Traceback" not in r.stderr
    assert atomic.read_json(tmp_path / "out" / "f" / "run.json")["status"] == "FAILED"


def test_content_ids_are_stable_unique_and_documented(ray_local, tmp_path, wiki_texts):
    (tmp_path / "d").mkdir()
    recs = [{"text": wiki_texts[0]}, {"text": wiki_texts[1]}, {"text": wiki_texts[0]}]  # an exact copy
    (tmp_path / "d" / "x.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
    y = write_yaml(tmp_path / "m.yaml", """
        name: ids
        sources:
          web: {paths: ["d/*.jsonl"]}
    """)
    a = _mixture_rows(_run(y, tmp_path / "o1"))
    b = _mixture_rows(_run(y, tmp_path / "o2"))
    assert [r["id"] for r in a] == [r["id"] for r in b]
    assert len({r["id"] for r in a}) == 3
    assert a[0]["id"] == xxhash.xxh3_128_hexdigest(("x.jsonl:1\n" + wiki_texts[0]).encode())
    assert [r["source_id"] for r in a] == ["x.jsonl:1", "x.jsonl:2", "x.jsonl:3"]


def test_parquet_and_hf_sources_with_ids_and_metadata(ray_local, tmp_path, wiki_texts):
    import datasets

    (tmp_path / "pq").mkdir()
    pq.write_table(pa.table({"doc_id": [f"p{i}" for i in range(40)], "body": wiki_texts[:40], "lang": ["en"] * 40}),
                   tmp_path / "pq" / "a.parquet", row_group_size=10)
    datasets.Dataset.from_dict({"text": wiki_texts[40:70], "title": [f"t{i}" for i in range(30)]}).save_to_disk(str(tmp_path / "hf"))
    y = write_yaml(tmp_path / "m.yaml", """
        name: fmt
        tokenizer: null
        sources:
          pq: {paths: ["pq/*.parquet"], text_field: body, id_field: doc_id, max_shard_rows: 15}
          hf: {paths: ["hf"], max_shard_rows: 12}
    """)
    run_dir = _run(y)
    rows = _mixture_rows(run_dir)
    assert [r["id"] for r in rows[:40]] == [f"p{i}" for i in range(40)]
    assert [r["text"] for r in rows] == wiki_texts[:70]
    assert [r["source_id"] for r in rows[40:43]] == ["hf#0", "hf#1", "hf#2"]
    docs = pq.read_table(next((run_dir / "steps").glob("ingest-pq-*")) / "part-00000.parquet").to_pylist()
    assert orjson.loads(docs[0]["metadata"]) == {"lang": "en"} and docs[0]["n_tokens"] is None
    rj = atomic.read_json(run_dir / "run.json")
    assert rj["steps"]["ingest-pq"]["shards"] == 4  # 10-row groups packed up to 15 rows: 1 group each
    assert rj["steps"]["ingest-hf"]["shards"] == 3


def test_a_failing_shard_names_step_and_input(ray_local, tmp_path):
    (tmp_path / "pq").mkdir()
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "pq" / "a.parquet")
    y = write_yaml(tmp_path / "m.yaml", """
        name: nocol
        sources:
          s: {paths: ["pq/*.parquet"], on_bad_record: fail}
    """)
    with pytest.raises(RunError) as e:
        _run(y)
    assert f"step ingest-s, shard 0 ({tmp_path}/pq/a.parquet row groups [0]..[0]) failed: " in str(e.value)
    assert f"{tmp_path}/pq/a.parquet row 0: no column 'text'; columns: body; set sources.s.text_field" in str(e.value)


def test_large_compressed_file_is_scanned_then_split_by_records(ray_local, tmp_path, wiki_texts):
    import zstandard

    (tmp_path / "z").mkdir()
    data = b"".join(orjson.dumps({"text": t, "n": i}) + b"\n" for i, t in enumerate(wiki_texts[:1050]))
    (tmp_path / "z" / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    y = write_yaml(tmp_path / "m.yaml", """
        name: z
        tokenizer: null
        sources:
          web: {paths: ["z/*.jsonl.zst"], max_shard_rows: 200, max_shard_bytes: 1024}
    """)
    run_dir = _run(y)
    rj = atomic.read_json(run_dir / "run.json")
    assert rj["steps"]["scan-web"]["status"] == "SUCCESS"
    assert rj["steps"]["ingest-web"]["shards"] == 6  # 1050 lines in ranges of 200
    rows = _mixture_rows(run_dir)
    assert [orjson.loads(r["source_id"].split(":")[1]) for r in rows] == list(range(1, 1051))
    assert [r["text"] for r in rows] == wiki_texts[:1050]


def test_local_data_files_through_hf_datasets(ray_local, tmp_path, wiki_texts):
    import csv

    (tmp_path / "c").mkdir()
    for k in range(2):
        with open(tmp_path / "c" / f"part{k}.csv", "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["title", "body"])
            for i in range(25):
                w.writerow([f"t{k}-{i}", wiki_texts[k * 25 + i]])
    y = write_yaml(tmp_path / "m.yaml", """
        name: csv
        tokenizer: null
        sources:
          c: {paths: ["c/*.csv"], hf_builder: csv, text_field: body}
    """)
    run_dir = _run(y)
    rows = _mixture_rows(run_dir)
    assert [r["text"] for r in rows] == wiki_texts[:50]
    assert rows[26]["source_id"] == "part1.csv#1"
    assert atomic.read_json(run_dir / "run.json")["steps"]["ingest-c"]["shards"] == 2
