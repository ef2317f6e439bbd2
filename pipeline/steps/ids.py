"""Unique ids within a source, checked before ingest writes a document.

When a source declares `id_field`, its ids key everything after ingest (decisions,
`curate explain`, dedup survivors), so two records of one source may not share one.

    ids-<source>         map, one task per ingest split: ingest's own parsing, keeping the
                         (hash, id, line or row) of every record that would become a
                         document, sorted by hash (row groups of 64K rows)
    unique-ids-<source>  reduce, one task per range of the 64-bit hash: reads only the row
                         groups of every map file that overlap its range, finds ids used twice

The first use in input order (split, then line or row) is kept; ingest quarantines every
later one with the reason `duplicate_id` and the place of the first. Under
`on_bad_record: fail` the reduce stops the run naming both places. Memory: a map task holds
one split's ids, a reduce task at most about PARTITION_ROWS of them.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from pipeline.dedup import shuffle
from pipeline.errors import InputError
from pipeline.io import fs
from pipeline.steps import ingest

PARTITION_ROWS = 4_000_000
ROW_GROUP = 65536
SCHEMA = pa.schema([("h", pa.uint64()), ("id", pa.string()), ("loc", pa.int64())])


def map_shard(spec: dict, out) -> dict:
    sink = ingest.IdSink(spec)
    split = spec["split"]
    ingest.parse(sink, split)
    h = np.array([xxhash.xxh3_64_intdigest(i.encode("utf-8", "surrogatepass")) for i in sink.ids], dtype=np.uint64)
    loc = np.array(sink.locs, dtype=np.int64)
    order = np.lexsort((loc, h))
    table = pa.table({"h": h[order], "id": pa.array(sink.ids, pa.string()).take(pa.array(order)), "loc": loc[order]},
                     schema=SCHEMA)
    fs.write_table(table, out.path(".parquet"), row_group_size=ROW_GROUP, compression="zstd")
    kind = "line" if split["file"]["format"] == "jsonl" else "row"
    return {"rows": len(sink.ids), "place": [split["file"]["path"], kind]}


def partitions(total_rows: int) -> int:
    return max(1, math.ceil(total_rows / PARTITION_ROWS))


def _place(places: list, split: int, loc: int) -> str:
    path, kind = places[split]
    return f"{path}:{loc}" if kind == "line" else f"{path} row {loc}"


def reduce_shard(spec: dict, out) -> dict:
    p, n = spec["partition"], spec["partitions"]
    lo, hi = (p << 64) // n, ((p + 1) << 64) // n
    cond = None
    if n > 1:  # row-group statistics skip the groups outside [lo, hi)
        cond = pc.field("h") >= pa.scalar(lo, pa.uint64())
        if hi < 1 << 64:
            cond = cond & (pc.field("h") < pa.scalar(hi, pa.uint64()))
    tables = []
    for i, path in enumerate(spec["maps"]):
        t = fs.read_table(path, filters=cond)
        tables.append(t.append_column("split", pa.array(np.full(t.num_rows, i, np.int64))))
    t = pa.concat_tables(tables) if tables else SCHEMA.empty_table()
    if t.num_rows < 2:
        return {"rows": t.num_rows, "duplicates": 0}
    t = t.sort_by([("h", "ascending"), ("id", "ascending"), ("split", "ascending"), ("loc", "ascending")])
    h = t.column("h").to_numpy()
    ids = t.column("id")
    same = (h[1:] == h[:-1]) & pc.equal(ids.slice(1), ids.slice(0, len(ids) - 1)).to_numpy(zero_copy_only=False)
    new = np.r_[True, ~same]
    dup = np.flatnonzero(~new)
    if len(dup) == 0:
        return {"rows": t.num_rows, "duplicates": 0}
    head = np.maximum.accumulate(np.where(new, np.arange(len(new)), 0))[dup]
    split = t.column("split").to_numpy()
    loc = t.column("loc").to_numpy()
    places, source = spec["places"], spec["source"]
    if spec["on_bad_record"] == "fail":
        k = min(range(len(dup)), key=lambda j: (split[dup[j]], loc[dup[j]]))
        d, f = int(dup[k]), int(head[k])
        raise InputError(
            f"{_place(places, int(split[d]), int(loc[d]))}: id {ids[d].as_py()!r} is used again (first at "
            f"{_place(places, int(split[f]), int(loc[f]))}); ids must be unique within a source: fix the data, drop "
            f"sources.{source}.id_field to give every record a content id, or set sources.{source}.on_bad_record: "
            "quarantine to set the later uses aside"
        )
    table = pa.table({
        "id": ids.take(pa.array(dup)),
        "first": pa.array([_place(places, int(split[f]), int(loc[f])) for f in head], pa.string()),
    })
    g = (split[dup].astype(np.int64) << np.int64(32)) | loc[dup]  # a gid of source 0: (split, line or row)
    shuffle.write_to_shards(table, g, [source], fs.path(out.dir), f"p-{p:05d}")
    return {"rows": t.num_rows, "duplicates": len(dup)}
