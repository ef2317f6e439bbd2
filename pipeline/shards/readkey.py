"""Read keys: digests of what a shard task actually reads, for cutoff by what it reads.

A shard's content key covers whole files (engine/reuse.py). Many tasks read less than the
files their spec names: a pass over a document shard's kept rows reads its layers' `keep`
columns and text overrides, not the cluster a dedup stage noted or the score a classifier
gave; a dedup apply reads the decisions about its own rows, not a reducer's whole folder.
When those other parts change (a new page joins a cluster of an old page's), the content
key changes but what the task reads does not. Such a task digests what it reads here,
before its work, and `engine.cutoff.same_as_before` links the earlier shard's output when
the digests agree: the cascade stops where the inputs that matter are the same.

    rk = readkey.view(doc["documents"], doc["layers"], columns=("text",))
    if (st := same_as_before(spec, out, rk)) is not None:
        return st

A digest covers values, not how Arrow chunked them: the same rows give the same digest
whichever files they came from.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import xxhash

from pipeline.shards.view import OVERRIDES, Layers, num_rows


def view(documents: str, layers: list[str], columns=OVERRIDES, *more: pa.Table | None) -> str:
    """The keep mask of a document shard and the overrides of `columns` its layers hold,
    with the tables in `more` (a task's decisions): what a pass over its kept rows reads
    beside the documents file (which the partial key covers)."""
    n = num_rows(documents)
    st = Layers(layers, n, columns)
    h = xxhash.xxh3_128()
    h.update(n.to_bytes(8, "little"))
    h.update(np.packbits(st.keep).tobytes())
    for c in sorted(st.overrides):
        h.update(b"\x00col:" + c.encode())
        _array(h, st.overrides[c])
    for t in more:
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
    a null), anything else by its Python values."""
    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    h.update(str(arr.type).encode())
    h.update(np.packbits(arr.is_valid().to_numpy(zero_copy_only=False)).tobytes())
    vals = arr.drop_null()
    if pa.types.is_integer(vals.type) or pa.types.is_floating(vals.type) or pa.types.is_boolean(vals.type):
        h.update(vals.to_numpy(zero_copy_only=False).tobytes())
        return
    for v in vals.to_pylist():
        b = v.encode("utf-8", "surrogatepass") if isinstance(v, str) else repr(v).encode("utf-8", "surrogatepass")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
