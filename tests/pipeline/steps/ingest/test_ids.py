"""The unique-ids steps in process: the same reused ids are found whatever the number of
hash partitions (the runs in test_bad_input.py use one)."""

from __future__ import annotations

import random

import orjson

from pipeline.shards import shuffle
from pipeline.engine.step import ShardOutput
from pipeline.engine.task import run_shard
from pipeline.steps.ingest import ids


def test_reused_ids_are_the_same_with_one_three_or_seven_partitions(tmp_path):
    rng = random.Random(1)
    recs = [{"id": f"k{rng.randrange(900)}", "text": f"text {i}"} for i in range(6000)]
    specs = []
    for j in range(3):  # three files, the records dealt round-robin
        p = tmp_path / f"{j}.jsonl"
        p.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs[j::3]))
        f = {"path": str(p), "rel": p.name, "format": "jsonl", "compression": None, "size": p.stat().st_size}
        specs.append({"source": "s", "text_field": "text", "id_field": "id", "hf_split": None, "on_bad_record": "quarantine",
                      "tokenizer": None, "max_doc_bytes": 1 << 20, "split": {"file": f, "start": 0, "end": f["size"]}})
    # the reference: every use after the first, in input order (file, then line)
    seen, expected = {}, set()
    for j in range(3):
        for line, r in enumerate(recs[j::3], start=1):
            if r["id"] in seen:
                expected.add((j, line, r["id"], seen[r["id"]]))
            else:
                seen[r["id"]] = f"{tmp_path}/{j}.jsonl:{line}"
    assert len(expected) == 6000 - 900
    for n in (1, 3, 7):
        maps = str(tmp_path / f"map{n}")
        for j, spec in enumerate(specs):  # as the executor runs them: data, then the marker with its place
            run_shard("pipeline.steps.ingest.ids:map_shard", {**spec, "partitions": n}, maps, j)
        found = 0
        for p in range(n):
            r = ids.reduce_shard({"partition": p, "maps_dir": maps, "maps": 3, "inputs": f"{maps}/buckets", "files": 3, "source": "s",
                                  "on_bad_record": "quarantine"}, ShardOutput(str(tmp_path / f"reduce{n}"), p))
            found += r["duplicates"]
        got = set()
        for j in range(3):
            t = shuffle.decisions(str(tmp_path / f"reduce{n}"), j, n)
            got |= {(j, row, i, first) for row, i, first in
                    zip(t.column("row").to_pylist(), t.column("id").to_pylist(), t.column("first").to_pylist())}
        assert found == len(expected) and got == expected, n
