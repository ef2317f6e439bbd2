"""The id index (pipeline/steps/ingest/idindex.py): every id found at its shard and row, reading
only the row groups that can hold it; and on the demo run, what `explain` opens."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq

from pipeline.io import atomic
from pipeline.shards import shuffle
from pipeline.steps.ingest import idindex


def test_every_id_is_found_at_its_shard_and_row_in_one_range_file(tmp_path, monkeypatch):
    monkeypatch.setattr(idindex, "ROW_GROUP", 50)  # many row groups, so pruning matters
    rng = random.Random(3)
    shards = [[f"doc-{rng.randint(0, 10**12)}" for _ in range(rng.randint(0, 400))] for _ in range(7)]
    shards[2].append(shards[0][0])  # one id in two shards (ids are unique within a source only when declared)
    nparts = 3
    for i, ids in enumerate(shards):
        idindex.write_map(idindex.id_hash(ids), tmp_path / "ingest", i, nparts)
    for p in range(nparts):
        idindex.reduce_shard({"inputs": str(tmp_path / "ingest" / "index"), "files": len(shards), "partition": p},
                             SimpleNamespace(path=lambda suffix, p=p: tmp_path / "index" / f"part-{p:05d}{suffix}"))
    # through the merge tier (groups of 3 shards' index files, as ingest-<source>-merge joins them): the same bytes
    groups = [(a, min(len(shards), a + 3)) for a in range(0, len(shards), 3)]
    for j, (a, b) in enumerate(groups):
        shuffle.merge(tmp_path / "ingest" / "index", a, b, shuffle.map_file(tmp_path / "merged" / "index", j))
    for p in range(nparts):
        idindex.reduce_shard({"inputs": str(tmp_path / "merged" / "index"), "files": len(groups), "partition": p},
                             SimpleNamespace(path=lambda suffix, p=p: tmp_path / "index2" / f"part-{p:05d}{suffix}"))
        assert (tmp_path / "index2" / f"part-{p:05d}.parquet").read_bytes() == (tmp_path / "index" / f"part-{p:05d}.parquet").read_bytes()
    total = sum(pq.ParquetFile(tmp_path / "index" / f"part-{p:05d}.parquet").metadata.num_rows for p in range(nparts))
    assert total == sum(len(s) for s in shards)
    read = []
    orig = pq.ParquetFile.read_row_group

    def counting(self, i, *a, **k):
        read.append(i)
        return orig(self, i, *a, **k)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", counting)
    for i, ids in enumerate(shards):
        for r, d in enumerate(ids):
            read.clear()
            found = idindex.lookup(tmp_path / "index", nparts, d)
            assert (i, r) in found
            assert len(read) <= 2  # the groups whose [min, max] holds the hash: one, two at a boundary
    assert sorted(idindex.lookup(tmp_path / "index", nparts, shards[0][0])) == [(0, 0), (2, len(shards[2]) - 1)]
    assert idindex.lookup(tmp_path / "index", nparts, "not-an-id") == []


def test_the_demo_runs_index_holds_every_document_and_explain_uses_it(demo_run):
    steps = atomic.read_json(demo_run / "run.json")["steps"]
    led = atomic.read_json(demo_run / "ledger.json")
    for source in led["sources"]:
        st = steps[f"id-index-{source}"]
        rows = sum(pq.ParquetFile(f).metadata.num_rows for f in (demo_run / st["dir"]).glob("part-*.parquet"))
        docs = sum(pq.ParquetFile(f).metadata.num_rows for f in (demo_run / steps[f"ingest-{source}"]["dir"]).glob("part-*.parquet"))
        assert rows == docs
        files = sorted((demo_run / steps[f"ingest-{source}"]["dir"]).glob("part-*.parquet"))
        ids = pq.read_table(files[-1], columns=["id"]).column("id").to_pylist()
        for r in np.linspace(0, len(ids) - 1, 20).astype(int).tolist():
            assert (int(files[-1].stem.split("-")[1]), r) in idindex.lookup(demo_run / st["dir"], st["shards"], ids[r])
    # explain finds a document through the index, one lookup per source, no scan of the id columns
    from pipeline.views import explain

    calls = []
    orig = idindex.lookup
    scans = []
    orig_read = explain.fs.read_table

    def read_table(p, *a, **k):
        if "/ingest-" in str(p) and k.get("columns") == ["id"]:
            scans.append(p)
        return orig_read(p, *a, **k)

    import pytest

    mp = pytest.MonkeyPatch()
    mp.setattr(explain.idindex, "lookup", lambda *a: calls.append(a) or orig(*a))
    mp.setattr(explain.fs, "read_table", read_table)
    try:
        infos = explain.find(demo_run, ids[0])
    finally:
        mp.undo()
    assert [i["source"] for i in infos] == [source] and infos[0]["id"] == ids[0]
    assert len(calls) == len(led["sources"]) and scans == []
