"""Heavy LSH buckets cut into blocks, so that no bucket reducer holds a templated bucket.

A bucket's rows go to one reducer (partition_of(bucket)). Templated pages put millions of
documents in one bucket of every band: at 10^9 documents, a boilerplate shared by 1% of
them is a bucket of 10^7 rows, 2.5x a reducer's whole share, on one task. Two steps before
the signatures find such buckets from a sample, the same whatever the sharding:

sample (per group of GROUP document shards): the kept documents whose id hash (okey2)
    falls under `rate` = SAMPLES_PER_BLOCK / salt_rows, and their band buckets, computed as
    the signatures step computes them. It reads the shards' ids and only the row groups of
    sampled documents (1 in 100,000 by default). Only corpora of more than `salt_rows` kept
    documents are sampled: a smaller one has no bucket that large, and both steps are empty.
heavy (one task): buckets whose estimated size (sampled / rate) passes `salt_rows`, each cut
    into ceil(size / salt_rows) blocks, ranges of its members' id hash, each block a
    virtual partition past the ordinary ones; its anchor is its sampled member first in
    the bucket order (source priority, id hash).

The signatures step then sends a heavy bucket's rows to their block's partition
(fuzzy.partitions_of), and the reducer pairs each block's members as it pairs any bucket's
(every pair up to ALL_PAIRS members, else each with the first and the one before it) plus
the block's first two members with the anchor (fuzzy.anchor_pairs): every member still meets the
bucket's cluster, and a reducer holds about `salt_rows` rows of it. The sample decides,
from ids alone, which buckets are cut and where, so the pairs are the same for any number
of shards, workers or merge groups. A bucket the sample misses is at most a few times
`salt_rows` (about 2 x at 20 expected samples).
"""

from __future__ import annotations

import math
from typing import TypedDict

import numpy as np
import pyarrow as pa

from pipeline.config.engine import DEFAULTS
from pipeline.engine.step import task
from pipeline.io import atomic, fs
from pipeline.shards import text, view
from pipeline.shards.documents import DocShard
from pipeline.steps.dedup import fuzzy

SALT_ROWS = DEFAULTS["fuzzy_salt_rows"]  # (engine.fuzzy_salt_rows) rows of one bucket a reducer holds at most (half of dedup's PARTITION_ROWS)
SAMPLES_PER_BLOCK = 20  # expected samples of a bucket of salt_rows members
GROUP = 64  # document shards per sample task
TABLE = "heavy.parquet"  # the heavy step's table, in its step folder
SCHEMA = pa.schema([("bucket", pa.uint64()), ("okey", pa.uint64()), ("okey2", pa.uint64()), ("gid", pa.int64())])


def rate(salt: int) -> float:
    return min(1.0, SAMPLES_PER_BLOCK / salt)


class SaltSampleSpec(TypedDict):
    """A `dedup-fuzzy-sample` shard (steps/dedup/plan.py `sample_specs`): a group of up to GROUP document shards."""

    docs: list[DocShard]
    params: dict  # the dedup.fuzzy section with `rows`, without `threshold`
    rate: float  # the share of the documents sampled (`rate`)
    describe: str


@task(version="1")
def sample_shard(spec: SaltSampleSpec, out) -> dict:
    """Band buckets of the sampled kept documents of a group of document shards."""
    p = spec["params"]
    a, b = text.permutations(p["num_perm"], p["seed"])
    bound = np.uint64(min(2**64 - 1, int(spec["rate"] * 2**64)))
    got, kept = [], 0
    for doc in spec["docs"]:
        picked = []
        for rows, batch in view.kept_batches(doc["documents"], doc["layers"], ["id"]):
            kept += len(rows)
            picked.append(rows[fuzzy.okey2(batch.column("id").to_pylist()) < bound] if spec["rate"] < 1 else rows)
        rows = np.concatenate(picked) if picked else np.zeros(0, np.int64)
        if not len(rows):
            continue
        t = view.read_rows(doc["documents"], doc["layers"], rows, ["id", "text"])
        lengths = pa.compute.binary_length(t.column("text")).to_numpy(zero_copy_only=False)
        for lo, hi in fuzzy.chunks(lengths, fuzzy.CHUNK_BYTES):  # as the signatures step: bounded numpy passes
            r = fuzzy.band_rows(doc, p, a, b, rows[lo:hi], t.column("id").slice(lo, hi - lo),
                                t.column("text").slice(lo, hi - lo).to_pylist())
            if r is not None:
                got.append(r)
    table = pa.table({c: np.concatenate([r[i] for r in got]) for i, c in enumerate(SCHEMA.names)}, schema=SCHEMA) \
        if got else SCHEMA.empty_table()
    atomic.write_table(table, out.path(".parquet"))
    return {"rows": kept, "docs": kept, "sampled": sum(r[4] for r in got)}


class HeavySpec(TypedDict):
    """The `dedup-fuzzy-heavy` step's one shard (steps/dedup/plan.py `heavy_specs`)."""

    samples: str  # the sample step's folder
    files: int  # its part files
    rate: float  # the share sampled
    salt_rows: int  # rows of one bucket a reducer holds at most (engine.fuzzy_salt_rows)
    describe: str


@task(version="1")
def heavy_shard(spec: HeavySpec, out) -> dict:
    """The heavy buckets: bucket, blocks, first (its first virtual partition), anchor (gid,
    okey, okey2), sorted by bucket."""
    paths = [fs.path(spec["samples"]) / f"part-{i:05d}.parquet" for i in range(spec["files"])]
    tables = [t for t in fs.read_many(fs.read_table, paths) if t.num_rows]
    t = pa.concat_tables(tables) if tables else SCHEMA.empty_table()
    bucket, ok, ok2, g = (t.column(c).to_numpy() for c in SCHEMA.names)
    order = np.lexsort((g, ok2, ok, bucket))  # the bucket reducer's order: a bucket's first sampled member leads
    bucket, ok, ok2, g = bucket[order], ok[order], ok2[order], g[order]
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]]) if len(bucket) else np.zeros(0, np.int64)
    counts = np.diff(np.r_[starts, len(bucket)])
    est = counts / spec["rate"]
    blocks = np.array([math.ceil(x / spec["salt_rows"]) for x in est.tolist()], np.int64)
    cut = blocks >= 2
    s, blocks = starts[cut], blocks[cut]
    first = (np.cumsum(blocks) - blocks).astype(np.int64)  # each bucket's first block (none: an empty table)
    table = pa.table({"bucket": bucket[s], "blocks": blocks, "first": first, "anchor": g[s],
                      "anchor_okey": ok[s], "anchor_okey2": ok2[s], "estimate": est[cut].round().astype(np.int64)})
    atomic.write_table(table, fs.path(out.dir) / TABLE)
    return {"rows": len(bucket), "sampled_rows": len(bucket), "heavy": int(cut.sum()), "virtual": int(blocks.sum()),
            "largest_estimate": int(est.max()) if len(est) else 0}
