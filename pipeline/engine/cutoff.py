"""Cutoff by what a task reads: the task side of reuse by content (engine/reuse.py).

A shard's content key covers whole files. A task that reads less of them (a document
shard's keep mask and texts, not the other columns of its layers; the decisions about its
own rows, not a reducer's whole folder) declares those spec keys `Step.read_keyed`: the
shard's *partial key* leaves them out, the executor finds the earlier shard of the same
partial key (`reuse.candidates`, in the pass that looks up content keys) and passes it in
the spec as `prior`, and the task, having digested what it read (pipeline/shards/readkey.py),
links that shard's files when the digests agree instead of computing. A new page that joins an old page's cluster
changes the old shard's dedup layer file, not its keep mask: what reads the kept texts
after it is linked, not computed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

import orjson
import xxhash

from pipeline.engine.step import shard_name
from pipeline.io import fs


ENGINE_FIELDS = ("out_files", "content_key", "partial_key", "read_key", "reusable", "reused_from", "linked_from",
                 "seconds", "cpu_seconds", "peak_rss_mb", "node", "writer")


class Prior(TypedDict):
    """A spec's `prior` (a hint: never in a key): the earlier shard of the same partial key."""

    dir: str  # its step folder
    shard: int  # its number there
    read_key: str  # the digest of what it read
    out_files: dict[str, str]  # its files (relative path -> digest)
    stats: dict  # its marker, the engine's fields left out


def hint(found: tuple[Path, int, dict]) -> Prior | None:
    """What a task to compute is told of the earlier shard of its partial key (its spec's
    `prior`): None when that shard recorded no read key."""
    d, i, m = found
    if "read_key" not in m:
        return None
    return {"dir": str(d), "shard": i, "read_key": m["read_key"], "out_files": m["out_files"],
            "stats": {k: v for k, v in m.items() if k not in ENGINE_FIELDS}}


def same_as_before(spec: dict, out, read_key: str) -> dict | None:
    """Cutoff by what a task reads. A task whose output depends on less than the files its
    spec names (the keep mask of a document shard's layers, not their other columns; the
    decisions about its own rows, not a reducer's whole folder) digests what it read
    (`read_key`) before its work. When the earlier shard of its partial key (spec `prior`,
    from the executor) read the same, its files are linked into this shard's folder and its
    stats returned, with `read_key`: the task returns them instead of computing. None: compute.

        rk, state = readkey.shard(doc)   # pipeline/shards/readkey.py: read key and layer state
        if (st := same_as_before(spec, out, rk)) is not None:
            return st
        ...   # the work, reading through view.kept_batches(..., state=state); its stats carry read_key=rk
    """
    h = spec.get("prior")
    if not isinstance(h, dict) or h.get("read_key") != read_key:
        return None
    if not link_prior(spec, out, lambda rel: True):  # collected since: computed
        return None
    old, new = fs.path(h["dir"]), fs.path(out.dir)
    a, b = shard_name(h["shard"]), shard_name(out.index)
    stats = orjson.loads(orjson.dumps(h["stats"]).replace(json_str(old), json_str(new)))
    if a != b:
        root = str(new) + "/"
        stats = {k: (renamed(v, a, b) if isinstance(v, str) and v.startswith(root) else v) for k, v in stats.items()}
    return {**stats, "read_key": read_key, "linked_from": old.name}


def link_prior(spec: dict, out, want) -> bool:
    """Link into this shard's folder the earlier shard's files whose path `want(rel)` accepts
    (renamed to this shard's name), recorded as this task's outputs; False when one was
    collected since (nothing recorded: the task computes)."""
    h = spec.get("prior")
    old, new = fs.path(h["dir"]), fs.path(out.dir)
    a, b = shard_name(h["shard"]), shard_name(out.index)
    pairs = [(old / rel, new / renamed(rel, a, b), d) for rel, d in h["out_files"].items() if want(rel)]
    refs = fs.link_all((src, dst) for src, dst, _ in pairs)  # all or none: a half-linked shard is never left
    if refs is None:
        return False
    fs.recorded([(str(dst), d, refs[str(dst)]) if refs else (str(dst), d) for _, dst, d in pairs])
    return True


def prior_file(spec: dict, want) -> Path | None:
    """The earlier shard's file (spec `prior`: the shard of the same partial key, whatever it
    read) whose path in its folder `want(rel)` accepts, or None. A task whose output is row
    by row (a classifier's score of a text) reads it to reuse the rows whose inputs are the
    same when `same_as_before` found the shard's read changed: a new page that removes one
    old page scores that shard's other pages no second time."""
    h = spec.get("prior")
    if not isinstance(h, dict):
        return None
    for rel in sorted(h.get("out_files") or {}):
        if want(rel):
            return fs.path(h["dir"]) / rel
    return None


def text_keys(texts):
    """Each text's xxh3-128 as a row of two uint64 (high, low): what a row's earlier value is
    reused by. 128 bits: at 10^10 documents the chance of two texts of one shard sharing a key
    is ~10^-20 (64 bits gave ~10^-6 at 10^7 rows a shard, and a collision reuses another
    text's value silently)."""
    import numpy as np

    raw = b"".join([xxhash.xxh3_128_digest(t or "") for t in texts])  # big-endian: high word first
    return np.frombuffer(raw, ">u8").reshape(-1, 2).astype(np.uint64)


def key_array(keys):
    """`text_keys` rows as an Arrow fixed_size_binary(16) column (big-endian: high, then low)."""
    import numpy as np
    import pyarrow as pa

    buf = np.ascontiguousarray(keys.astype(">u8")).tobytes()
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(16), len(keys), [None, pa.py_buffer(buf)])


def key_rows(col):
    """A stored key column back to `text_keys` rows; None for a column of another kind (an
    earlier version's 64-bit keys: nothing is reused from it)."""
    import numpy as np
    import pyarrow as pa

    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks else pa.array([], pa.binary(16))
    if col.type != pa.binary(16) or col.null_count:
        return None
    raw = np.frombuffer(col.buffers()[1], ">u8")[2 * col.offset: 2 * (col.offset + len(col))]
    return raw.reshape(-1, 2).astype(np.uint64)


class PriorRows:
    """An earlier shard's values by text key (`prior_rows`): `find(keys)` gives, for each key
    (`text_keys` rows), the row of the earlier file holding it (-1: none), by one sort and a
    binary search on the high word, the low word compared."""

    def __init__(self, table, key: str):
        import numpy as np

        k = key_rows(table.column(key))
        if k is None:
            k = np.zeros((0, 2), np.uint64)
        self._order = np.lexsort((k[:, 1], k[:, 0]))  # by high, then low
        self._hi, self._lo = k[self._order, 0], k[self._order, 1]
        self.table = table

    def find(self, keys):
        import numpy as np

        out = np.full(len(keys), -1, np.int64)
        if not len(self._hi) or not len(keys):
            return out
        hi, lo = keys[:, 0], keys[:, 1]
        left, right = np.searchsorted(self._hi, hi, "left"), np.searchsorted(self._hi, hi, "right")
        one = np.flatnonzero(right - left == 1)
        at = left[one]
        match = self._lo[at] == lo[one]
        out[one[match]] = self._order[at[match]]
        for j in np.flatnonzero(right - left > 1).tolist():  # two keys of one high word: the lows are sorted within
            a, b = int(left[j]), int(right[j])
            p = a + int(np.searchsorted(self._lo[a:b], lo[j]))
            if p < b and self._lo[p] == lo[j]:
                out[j] = self._order[p]
        return out


def prior_table(spec: dict, columns: list[str]):
    """`columns` of the earlier shard's output file (`prior_file`: its one Parquet file outside
    `keys/`), or None: no earlier shard, its file collected since, or written before these
    columns (a single file's read leaves a missing column out)."""
    import pyarrow as pa

    f = prior_file(spec, lambda rel: rel.endswith(".parquet") and not rel.startswith("keys/") and "/keys/" not in rel)
    if f is None:
        return None
    try:
        t = fs.read_table(f, columns=columns)
    except (FileNotFoundError, pa.ArrowInvalid):
        return None
    return t if t.column_names == columns else None


def prior_rows(spec: dict, columns: list[str], key: str = "text_key") -> PriorRows | None:
    """`prior_table`'s columns indexed by `key` (one of them), or None."""
    t = prior_table(spec, columns)
    return PriorRows(t, key) if t is not None else None


def renamed(rel: str, a: str, b: str) -> str:
    """`rel` with its file name's shard name `a` made `b` (`x/part-00004.parquet`, `part-00004-p3.data`)."""
    head, _, name = rel.rpartition("/")
    if not name.startswith(a):
        return rel
    return f"{head}/{b}{name[len(a):]}" if head else b + name[len(a):]


def json_str(p: Path) -> bytes:
    return orjson.dumps(str(p))[1:-1]
