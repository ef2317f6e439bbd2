"""Exact dedup: one survivor per group of documents with the same normalised text.

map (per document shard): the xxh3-128 hash of each kept document's normalised text,
hash-partitioned. reduce (per partition): groups of equal hashes; the survivor is the
smallest (source priority, id); every other member is removed with the reason
`exact_duplicate_of:<survivor id>`. 128 bits make an accidental collision negligible
(about 1e-21 for a billion documents).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from pipeline.dedup import shuffle, text
from pipeline.io import fs
from pipeline.steps import view

_M64 = (1 << 64) - 1
COLUMNS = {"reason": "string", "duplicate_of": "string", "duplicate_of_source": "string"}


def map_shard(spec: dict, out) -> dict:
    doc = spec["doc"]
    opts = spec["normalize"]
    h1, h2, ids, rows_all = [], [], [], []
    for rows, b in view.kept_batches(doc["documents"], doc["layers"], ["id", "text"]):
        for t in b.column("text").to_pylist():
            v = xxhash.xxh3_128_intdigest(text.normalize(t, opts))
            h1.append(v >> 64)
            h2.append(v & _M64)
        ids.append(b.column("id"))
        rows_all.append(rows)
    n = len(h1)
    rows = np.concatenate(rows_all) if rows_all else np.zeros(0, np.int64)
    k1 = np.array(h1, dtype=np.uint64)
    table = pa.table({
        "h1": k1, "h2": np.array(h2, dtype=np.uint64),
        "rank": np.full(n, doc["rank"], np.int32),
        "id": pa.concat_arrays([c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in ids]) if ids else pa.array([], pa.string()),
        "gid": shuffle.gid(doc["src"], doc["part"], rows),
    })
    files = shuffle.write_partitions(table, shuffle.partition_of(k1, spec["partitions"]), fs.path(out.dir) / "buckets",
                                     f"{doc['source']}-part-{doc['part']:05d}")
    return {"rows": n, "partitions": spec["partitions"], "files": files}


def reduce_shard(spec: dict, out) -> dict:
    t = shuffle.read_dir(spec["inputs"])
    if t is None or t.num_rows == 0:
        return {"rows": 0, "groups": 0, "removed": 0}
    t = t.sort_by([("h1", "ascending"), ("h2", "ascending"), ("rank", "ascending"), ("id", "ascending")])
    h1 = t.column("h1").to_numpy()
    h2 = t.column("h2").to_numpy()
    new = np.r_[True, (h1[1:] != h1[:-1]) | (h2[1:] != h2[:-1])]
    head = np.maximum.accumulate(np.where(new, np.arange(len(new)), 0))  # index of each row's group head
    dup = np.flatnonzero(~new)
    sources = spec["sources"]
    ranks_to_src = spec["rank_source"]
    surv = pa.array(head[dup])
    table = pa.table({
        "reason": pc.binary_join_element_wise("exact_duplicate_of", t.column("id").take(surv), ":"),
        "duplicate_of": t.column("id").take(surv),
        "duplicate_of_source": pa.array([ranks_to_src[r] for r in t.column("rank").take(surv).to_pylist()], pa.string()),
    })
    shuffle.write_to_shards(table, t.column("gid").to_numpy()[dup], sources, fs.path(out.dir), f"p-{spec['partition']:05d}")
    return {"rows": t.num_rows, "groups": int((~new[1:] & new[:-1]).sum()) if len(new) > 1 else 0, "removed": len(dup)}
