"""Read keys: digests of what a shard task actually reads, for cutoff by what it reads.

A shard's content key covers whole files (engine/reuse.py). Many tasks read less than the
files their spec names: a pass over a document shard's kept rows reads its layers' `keep`
columns and text overrides, not the cluster a dedup stage noted or the score a classifier
gave; a dedup apply reads the decisions about its own rows, not a reducer's whole folder.
When those other parts change (a new page joins a cluster of an old page's), the content
key changes but what the task reads does not. Such a task digests what it reads here,
before its work, and `engine.cutoff.same_as_before` links the earlier shard's output when
the digests agree: the cascade stops where the inputs that matter are the same.

    rk, state = readkey.shard(doc, ("text",))
    if (st := same_as_before(spec, out, rk)) is not None:
        return st
    for rows, batch in view.kept_batches(doc["documents"], doc["layers"], ["text"], state=state):
        ...                                   # the layers are read once, for the key and the pass

A digest covers values, not how Arrow chunked them: the same rows give the same digest
whichever files they came from.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import xxhash

from pipeline.shards.view import OVERRIDES, Layers, num_rows


def shard(doc: dict, columns=OVERRIDES, *more: pa.Table | None) -> tuple[str, Layers]:
    """(read key, layer state) of a document shard: its keep mask and the overrides of
    `columns` its layers hold, with the tables in `more` (a task's decisions), digested; the
    state is what the task then reads its kept rows through (view.kept_batches(state=...)),
    so the layers are read once. `columns` must cover the overrides the task reads."""
    st = Layers(doc["layers"], num_rows(doc["documents"]), columns)
    return of(st, *more), st


def of(st: Layers, *more: pa.Table | None) -> str:
    """The read key of a layer state (and of the tables in `more`)."""
    h = xxhash.xxh3_128()
    h.update(len(st.keep).to_bytes(8, "little"))
    h.update(np.packbits(st.keep).tobytes())
    _overrides(h, st)
    for t in more:
        h.update(b"\x00table")
        if t is not None:
            _table(h, t)
    return h.hexdigest()


def texts(st: Layers) -> str:
    """The digest of a layer state's overrides (its texts) without its keep mask: an earlier
    shard of the same documents with the same one held the same value in every row, kept or
    not. A task whose output covers every row (a classifier's scores) takes that shard's rows
    as they are when only the keep mask moved (a page removed by a new duplicate)."""
    h = xxhash.xxh3_128()
    h.update(len(st.keep).to_bytes(8, "little"))
    _overrides(h, st)
    return h.hexdigest()


def _overrides(h, st: Layers) -> None:
    for c in sorted(st.overrides):
        h.update(b"\x00col:" + c.encode())
        _array(h, st.overrides[c])


def of_tables(*tables: pa.Table | None) -> str:
    """The digest of some tables' values (a task's own read, outside a layer state)."""
    h = xxhash.xxh3_128()
    for t in tables:
        h.update(b"\x00table")
        if t is not None:
            _table(h, t)
    return h.hexdigest()


def _table(h, t: pa.Table) -> None:
    h.update(t.num_rows.to_bytes(8, "little"))
    for name in t.column_names:
        h.update(b"\x00col:" + name.encode())
        _array(h, t.column(name))


def _array(h, arr) -> None:
    """Values and nulls of an array, whatever its chunks: numbers by their bytes (a NaN is not
    a null), strings and bytes by their lengths and bytes, anything
    else by its Python values."""
    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    h.update(str(arr.type).encode())
    h.update(np.packbits(arr.is_valid().to_numpy(zero_copy_only=False)).tobytes())
    vals = arr.drop_null()
    if pa.types.is_integer(vals.type) or pa.types.is_floating(vals.type) or pa.types.is_boolean(vals.type):
        h.update(vals.to_numpy(zero_copy_only=False).tobytes())
        return
    t = vals.type
    if len(vals) and (pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t)
                      or pa.types.is_large_binary(t)):  # the lengths and the bytes, without a Python value a row
        bufs = vals.buffers()
        o = np.frombuffer(bufs[1], np.int64 if pa.types.is_large_string(t) or pa.types.is_large_binary(t) else np.int32)
        o = o[vals.offset: vals.offset + len(vals) + 1].astype(np.int64)
        h.update(np.diff(o).tobytes())
        if bufs[2] is not None:
            h.update(memoryview(bufs[2])[int(o[0]):int(o[-1])])
        return
    for v in vals.to_pylist():
        b = v.encode("utf-8", "surrogatepass") if isinstance(v, str) else repr(v).encode("utf-8", "surrogatepass")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
