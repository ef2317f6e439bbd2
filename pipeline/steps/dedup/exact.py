"""Exact dedup: one survivor per group of documents with the same normalised text, or,
with `key: url`, the same URL (re-crawls of one page).

map (per document shard): the xxh3-128 hash of each kept document's normalised text (or
URL without its #fragment; documents without a URL take no part); each hash's first
holder in the shard is hash-partitioned, the shard's other holders stay in its rest file
(pipeline/shards/combine.py, m = 1), so a text copied a million times costs its reducer
one row per shard.
reduce (per partition): groups of equal hashes; the survivor is the smallest (source
priority, id), or (source priority, place) with `dedup.order: place`, or for URLs the
latest crawl date first; every other member is removed
with the reason `exact_duplicate_of:<survivor id>` (`url_duplicate_of:` for URLs). 128
bits make an accidental collision negligible (about 1e-21 for a billion documents).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import NotRequired, TypedDict

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from pipeline.engine.cutoff import Prior, same_as_before
from pipeline.shards import combine, readkey, shuffle
from pipeline.shards import text
from pipeline.engine.step import task
from pipeline.io import fs
from pipeline.shards import view
from pipeline.shards.documents import DocShard

_M64 = (1 << 64) - 1
_UNDATED = 1 << 62  # sorts after every real date (order is minus the epoch second)


def _epoch(date) -> int:
    """Seconds since 1970 of an ISO 8601 date or time; undated or unreadable: -_UNDATED."""
    if not isinstance(date, str):
        return -_UNDATED
    try:
        d = datetime.fromisoformat(date.replace("Z", "+00:00"))
    except ValueError:
        return -_UNDATED
    if d.tzinfo is None:
        d = d.replace(tzinfo=timezone.utc)
    return int(d.timestamp())


COLUMNS = {"reason": "string", "duplicate_of": "string", "duplicate_of_source": "string", "duplicate_of_gid": "int64"}


def _url_keys(metas: list, spec: ExactMapSpec, h1: list, h2: list, order: list) -> list[int]:
    """Hash halves and order (minus the crawl date) of each document with a URL; their rows."""
    keep = []
    for j, m in enumerate(metas):
        rec = orjson.loads(m) if m else {}
        url = rec.get(spec["url_field"])
        if not isinstance(url, str) or not url:
            continue  # no URL: not a candidate
        v = xxhash.xxh3_128_intdigest(url.split("#", 1)[0].encode("utf-8", "surrogatepass"))
        h1.append(v >> 64)
        h2.append(v & _M64)
        order.append(-_epoch(rec.get(spec["date_field"])))
        keep.append(j)
    return keep


class ExactMapSpec(TypedDict):
    """A `dedup-exact-map` shard (steps/dedup/plan.py `per_doc`): one document shard's keys."""

    doc: DocShard
    normalize: list[str]  # what to fold before hashing (text.normalize)
    key: NotRequired[str]  # url; left out for text keys (their old hashes)
    url_field: NotRequired[str]  # with key url: the metadata fields of the URL and crawl date
    date_field: NotRequired[str]
    order: NotRequired[str]  # dedup.order when place (combine.tiebreak)
    partitions: int  # the reducers' count
    describe: str
    prior: NotRequired[Prior]  # from the executor: the earlier shard of the same partial key


@task(version=combine.VERSION)
def map_shard(spec: ExactMapSpec, out) -> dict:
    doc = spec["doc"]
    rk, state = readkey.shard(doc)  # an earlier shard that read the same is linked
    if (st := same_as_before(spec, out, rk)) is not None:
        return st
    opts = spec["normalize"]
    by_url = spec.get("key") == "url"
    h1, h2, ids, rows_all, order = [], [], [], [], []
    for rows, b in view.kept_batches(doc["documents"], doc["layers"], ["id", "metadata" if by_url else "text"], state=state):
        if by_url:
            keep = _url_keys(b.column("metadata").to_pylist(), spec, h1, h2, order)
            ids.append(b.column("id").take(pa.array(keep, pa.int64())))
            rows_all.append(rows[keep])
            continue
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
    if by_url:  # the survivor is the latest crawl: sorted first
        table = table.append_column("order", pa.array(np.array(order, dtype=np.int64)))
    top, rest = combine.local_top(table, ["order"] if by_url else [], 1, combine.tiebreak(spec))
    nonempty = shuffle.write_partitions(top, shuffle.partition_of(top.column("h1").to_numpy(), spec["partitions"]),
                                        spec["partitions"], shuffle.map_file(fs.path(out.dir) / "buckets", out.index))
    return {"read_key": rk, "rows": n, "partitions": spec["partitions"], "segments": nonempty,
            "rest": combine.write_rest(rest, fs.path(out.dir) / "rest", out.index)}


class ExactReduceSpec(shuffle.ReduceSpec):
    """A `dedup-exact-reduce` shard (steps/dedup/plan.py `reduce_specs`): one hash partition."""

    reason: NotRequired[str]  # url_duplicate_of for URL keys
    order: NotRequired[str]  # dedup.order when place (combine.tiebreak)
    describe: str


@task(version="2")  # 2: decisions partitioned by slot (Context.slot_offsets)
def reduce_shard(spec: ExactReduceSpec, out) -> dict:
    t = shuffle.read_partition(spec["inputs"], spec["maps"], spec["partition"])
    target = shuffle.map_file(fs.path(out.dir) / "to", out.index)
    if t is None or t.num_rows == 0:
        shuffle.write_empty(spec["ndocs"], target)
        return {"rows": 0, "groups": 0, "removed": 0}
    order = [("order", "ascending")] if "order" in t.column_names else []
    t = t.sort_by([("h1", "ascending"), ("h2", "ascending"), *order, ("rank", "ascending"), (combine.tiebreak(spec), "ascending")])
    head, cut, emit, st = combine.reduce_groups(t, 1)
    sel = np.flatnonzero(emit)
    surv = pa.array(head[sel])
    ranks_to_src = spec["rank_source"]
    table = pa.table({
        "h1": t.column("h1").take(pa.array(sel)), "h2": t.column("h2").take(pa.array(sel)),
        "cut": pa.array(cut[sel]), "extra": t.column("extra").take(pa.array(sel)),
        "reason": pc.binary_join_element_wise(spec.get("reason", "exact_duplicate_of"), t.column("id").take(surv), ":"),
        "duplicate_of": t.column("id").take(surv),
        "duplicate_of_source": pa.array([ranks_to_src[r] for r in t.column("rank").take(surv).to_pylist()], pa.string()),
        "duplicate_of_gid": t.column("gid").take(surv),  # where the survivor is: samples read its text directly
    })
    shuffle.write_to_shards(table, t.column("gid").to_numpy()[sel], spec["offsets"], spec["ndocs"], target)
    return {"rows": t.num_rows, "documents": st["holders"], "groups": st["repeated"], "removed": st["past"]}

