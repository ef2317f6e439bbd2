"""An id -> (shard, row) index per source, so that `curate explain --id` opens a few
files whatever the corpus size, instead of reading every shard's id column.

    ingest-<source>    beside each shard, the xxh3-64 hash of each document's id and its
                       row, range-partitioned by hash: `index/part-XXXXX.{data,index}`
    merge-id-index-<source>  the merge tier (pipeline/steps/merge.py): above 32 shards, groups
                       of shards' index files concatenated, so a reducer reads at most 64 files
    id-index-<source>  one task per hash range: that range from every shard, sorted, as
                       `part-XXXXX.parquet` (h, shard, row) in row groups of ROW_GROUP

A lookup hashes the id, picks its range's file and reads only the row groups whose
[min, max] of `h` holds the hash; a hash may name another id (about one pair in 10^10
shares 64 bits at 25 B documents), so callers check the id at the place found.
"""

from __future__ import annotations

import math
from typing import TypedDict

import numpy as np
import pyarrow as pa
import xxhash

from pipeline.shards import shuffle
from pipeline.io import atomic, fs

SCHEMA = pa.schema([("h", pa.uint64()), ("shard", pa.int64()), ("row", pa.int64())])
INDEX_ROWS = 32_000_000  # rows per range: 16 bytes each, about 0.5 GB a reduce task
ROW_GROUP = 65_536


def partitions(total_rows: int) -> int:
    return max(1, math.ceil(total_rows / INDEX_ROWS))


def id_hash(ids) -> np.ndarray:
    return np.array([xxhash.xxh3_64_intdigest(i.encode("utf-8", "surrogatepass")) for i in ids], dtype=np.uint64)


def range_of(h: np.ndarray, n: int) -> np.ndarray:
    """Ranges of the 64-bit hash, in order (as the unique-ids check partitions)."""
    return (((h >> np.uint64(32)) * np.uint64(n)) >> np.uint64(32)).astype(np.int64)


def write_map(h: np.ndarray, step_dir, index: int, nparts: int) -> None:
    """An ingest shard's part of the index: (h, row), partitioned by hash range."""
    # the shard rides along: a reducer may read a merge of many shards' files (pipeline/steps/merge.py)
    table = pa.table({"h": h, "shard": np.full(len(h), index, np.int64), "row": np.arange(len(h), dtype=np.int64)})
    shuffle.write_partitions(table, range_of(h, nparts), nparts, shuffle.map_file(fs.path(step_dir) / "index", index))


class IdIndexSpec(TypedDict):
    """An `id-index-<source>` shard (steps/ingest/plan.py `index_shards`): one range of the id hash."""

    inputs: str  # the ingest step's (or its merge tier's) index folder
    files: int | list[int]  # the files there (steps/merge.py read_from)
    partition: int
    describe: str


def reduce_shard(spec: IdIndexSpec, out) -> dict:
    p = spec["partition"]
    # this range from every shard's index file, or from the merge tier's files when it ran
    t = shuffle.read_partition(spec["inputs"], spec["files"], p, schema=SCHEMA)
    t = t.sort_by([("h", "ascending"), ("shard", "ascending"), ("row", "ascending")])
    atomic.write_table(t, out.path(".parquet"), compression="zstd", row_group_size=ROW_GROUP)
    return {"rows": t.num_rows}


def lookup(index_dir, nparts: int, doc_id: str) -> list[tuple[int, int]]:
    """(shard, row) of every document whose id hashes as `doc_id` does."""
    h = int(id_hash([doc_id])[0])
    p = int(range_of(np.array([h], np.uint64), nparts)[0])
    pf = fs.parquet_file(fs.path(index_dir) / f"part-{p:05d}.parquet")
    out = []
    for k in range(pf.metadata.num_row_groups):
        st = pf.metadata.row_group(k).column(0).statistics
        if st is not None and st.has_min_max and not (st.min <= h <= st.max):
            continue
        t = pf.read_row_group(k)
        hs = t.column("h").to_numpy()
        for j in np.flatnonzero(hs == np.uint64(h)).tolist():
            out.append((int(t.column("shard")[j].as_py()), int(t.column("row")[j].as_py())))
    return out
