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

import os
from pathlib import Path
from typing import TypedDict

import orjson

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
    done = []
    try:
        for rel, d in h["out_files"].items():
            if not want(rel):
                continue
            src, dst = old / rel, new / renamed(rel, a, b)
            fs.makedirs(dst.parent)
            if fs.is_local(dst) and os.path.lexists(dst):
                os.unlink(dst)
            fs.link_or_copy(src, dst)
            done.append((str(dst), d))
    except FileNotFoundError:
        return False
    fs.recorded(done)
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


class PriorRows:
    """An earlier shard's values by text key (`prior_rows`): `find(keys)` gives, for each key,
    the row of the earlier file holding it (-1: none), by one sort and a binary search."""

    def __init__(self, table, key: str):
        import numpy as np

        k = table.column(key).to_numpy()
        self._order = np.argsort(k, kind="stable")
        self._keys = k[self._order]
        self.table = table

    def find(self, keys):
        import numpy as np

        if not len(self._keys) or not len(keys):
            return np.full(len(keys), -1, np.int64)
        at = np.minimum(np.searchsorted(self._keys, keys), len(self._keys) - 1)
        return np.where(self._keys[at] == keys, self._order[at], -1)


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
