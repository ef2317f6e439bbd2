"""Unique ids within a source, checked before ingest writes a document.

When a source declares `id_field`, its ids key everything after ingest (decisions,
`curate explain`, dedup survivors), so two records of one source may not share one.

    ids-<source>         map, one task per ingest split: ingest's own parsing, keeping the
                         (hash, id, line or row) of every record that would become a
                         document, range-partitioned by hash (pipeline/shards/shuffle.py)
    merge-ids-<source>   the merge tier (pipeline/steps/merge.py): above 32 maps, groups of
                         maps' files concatenated, so that a reducer reads at most 64 files
    unique-ids-<source>  reduce, one task per range of the 64-bit hash: reads its segment
                         of every (merged) map file, finds ids used twice

The first use in input order (split, then line or row) is kept; ingest quarantines every
later one with the reason `duplicate_id` and the place of the first. Under
`on_bad_record: fail` the reduce stops the run naming both places. Memory: a map task holds
one split's ids, a reduce task about PARTITION_ROWS of them. The partition count is fixed
when the maps are planned, from the number of splits x `max_shard_rows` (an upper bound
for splits by rows; byte-range splits of small records can hold more).
"""

from __future__ import annotations

import math
from typing import TypedDict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from pipeline.shards import shuffle
from pipeline.errors import InputError
from pipeline.engine.step import shard_marker, task
from pipeline.io import fs
from pipeline.steps.ingest import documents as ingest

PARTITION_ROWS = 4_000_000
SCHEMA = pa.schema([("h", pa.uint64()), ("id", pa.string()), ("loc", pa.int64()), ("split", pa.int64())])


class IdsMapSpec(ingest.IngestSpec):
    """An `ids-<source>` shard (steps/ingest/plan.py `id_shards`): the ingest shard's spec, with the reducers' count."""

    partitions: int


@task(version=shuffle.VERSION)
def map_shard(spec: IdsMapSpec, out) -> dict:
    from pipeline.steps.ingest import splits, verify

    split = spec["split"]
    rk, same = verify.verified(spec, out, splits.paths(split))  # inputs.verify: content
    if same is not None:
        return same
    sink = ingest.IdSink(spec)
    ingest.parse(sink, split)
    h = np.array([xxhash.xxh3_64_intdigest(i.encode("utf-8", "surrogatepass")) for i in sink.ids], dtype=np.uint64)
    loc = np.array(sink.locs, dtype=np.int64)
    # the split rides along: a reducer may read a merge of many maps' files (pipeline/steps/merge.py)
    table = pa.table({"h": h, "id": pa.array(sink.ids, pa.string()), "loc": loc,
                      "split": np.full(len(h), out.index, np.int64)}, schema=SCHEMA)
    n = spec["partitions"]
    part = ((h >> np.uint64(32)) * np.uint64(n)) >> np.uint64(32)  # ranges of the hash, in order
    shuffle.write_partitions(table, part.astype(np.int64), n, shuffle.map_file(fs.path(out.dir) / "buckets", out.index))
    kind = "line" if split["file"]["format"] == "jsonl" else "row"
    return {"rows": len(sink.ids), "place": [split["file"]["path"], kind], "partitions": n, **verify.recorded(rk)}


def partitions(total_rows: int) -> int:
    return max(1, math.ceil(total_rows / PARTITION_ROWS))


def _places(spec: IdsReduceSpec, splits: set[int]) -> dict[int, list]:
    """(path, "line" | "row") of some splits, from their map markers (only where ids repeat)."""
    return {i: shard_marker(spec["maps_dir"], i)["place"] for i in splits}


def _place(places: list, split: int, loc: int) -> str:
    path, kind = places[split]
    return f"{path}:{loc}" if kind == "line" else f"{path} row {loc}"


class IdsReduceSpec(TypedDict):
    """A `unique-ids-<source>` shard (steps/ingest/plan.py `unique_shards`): one range of the id hash."""

    source: str
    partition: int
    maps_dir: str  # the ids map step's folder (its markers name each split's file)
    maps: int  # the map shards: the ingest splits
    inputs: str  # the maps' (or their merge tier's) buckets folder
    files: int | list[int]  # the files there (steps/merge.py read_from)
    on_bad_record: str  # quarantine or fail
    describe: str


def reduce_shard(spec: IdsReduceSpec, out) -> dict:
    p = spec["partition"]
    target = shuffle.map_file(fs.path(out.dir) / "to", out.index)
    # this range from every map's file, or from the merge tier's files when it ran: `files` files in `inputs`
    t = shuffle.read_partition(spec["inputs"], spec["files"], p, schema=SCHEMA)
    if t.num_rows < 2:
        shuffle.write_empty(spec["maps"], target)
        return {"rows": t.num_rows, "duplicates": 0, "splits": []}
    t = t.sort_by([("h", "ascending"), ("id", "ascending"), ("split", "ascending"), ("loc", "ascending")])
    h = t.column("h").to_numpy()
    ids = t.column("id")
    same = (h[1:] == h[:-1]) & pc.equal(ids.slice(1), ids.slice(0, len(ids) - 1)).to_numpy(zero_copy_only=False)
    new = np.r_[True, ~same]
    dup = np.flatnonzero(~new)
    if len(dup) == 0:
        shuffle.write_empty(spec["maps"], target)
        return {"rows": t.num_rows, "duplicates": 0, "splits": []}
    head = np.maximum.accumulate(np.where(new, np.arange(len(new)), 0))[dup]
    split = t.column("split").to_numpy()
    loc = t.column("loc").to_numpy()
    places, source = _places(spec, set(split[dup].tolist()) | set(split[head].tolist())), spec["source"]
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
    shuffle.write_to_shards(table, g, [0], spec["maps"], target)
    # the ingest splits that hold a later use: only their shards read this step (and are keyed by it: engine/reuse.py)
    return {"rows": t.num_rows, "duplicates": len(dup), "splits": sorted(set(split[dup].tolist()))}
