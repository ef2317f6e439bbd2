"""The last step of every dedup kind: decisions -> one attribute file per document shard.

`<step>/<source>/part-XXXXX.parquet` has every row of the document shard, in order:
`id`, `keep` (null where an earlier stage had removed the row), `reason`, and the kind's
detail columns (the survivor's id and source, Jaccard, cluster). The marker carries the
stage's counts for the ledger: docs, chars and tokens in and out, removals by kind.
"""

from __future__ import annotations

from pathlib import Path
from typing import NotRequired, TypedDict

import numpy as np
import pyarrow as pa

from pipeline.engine.cutoff import Prior, same_as_before
from pipeline.shards import combine, readkey, shuffle
from pipeline.io import atomic, fs
from pipeline.shards import view
from pipeline.shards.documents import DocShard, LayerMarker


def attribute_path(step_dir: str | Path, source: str, part: int) -> Path:
    return fs.path(step_dir) / source / f"part-{part:05d}.parquet"


def write_attributes(step_dir: str | Path, doc: DocShard, table: pa.Table) -> None:
    """A stage's attribute file for one document shard, written atomically."""
    final = attribute_path(step_dir, doc["source"], doc["part"])
    fs.makedirs(final.parent)
    atomic.write_table(table, final, compression="zstd")


def stage_stats(doc: DocShard, rows: np.ndarray, chars: np.ndarray, toks: np.ndarray, kept: np.ndarray,
                removed: dict) -> LayerMarker:
    """A marker for the ledger: the rows that reached the stage, what it kept, removals by reason."""
    return {"rows": len(rows), "source": doc["source"], "part": doc["part"], "docs_in": len(rows),
            "docs_out": int(kept.sum()), "chars_in": int(chars.sum()), "chars_out": int(chars[kept].sum()),
            "tokens_in": int(toks.sum()), "tokens_out": int(toks[kept].sum()), "removed": dict(sorted(removed.items()))}


def sizes(doc: DocShard, state: view.Layers | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, n_chars, n_tokens) of the shard's kept rows, with rewritten counts (`state`: its
    layers already read, with their n_chars and n_tokens overrides)."""
    rows, chars, toks = [], [], []
    for r, b in view.kept_batches(doc["documents"], doc["layers"], ["n_chars", "n_tokens"], state=state):
        rows.append(r)
        chars.append(b.column("n_chars").to_numpy(zero_copy_only=False))
        toks.append(b.column("n_tokens").fill_null(0).to_numpy(zero_copy_only=False))
    if not rows:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(rows), np.concatenate(chars).astype(np.int64), np.concatenate(toks).astype(np.int64)


def scatter(n: int, rows: np.ndarray, values: pa.Array) -> pa.Array:
    """An array of length n: `values` at `rows`, null elsewhere."""
    pos = np.full(n, len(rows))
    pos[rows] = np.arange(len(rows))
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    return pa.concat_arrays([values, pa.nulls(1, values.type)]).take(pa.array(pos))


class ApplySpec(TypedDict):
    """A `dedup-<kind>` shard (steps/dedup/plan.py `apply_step`): one document shard and the decisions about it."""

    doc: DocShard
    decisions: str  # the reduce step's folder, or its merge tier's (steps/merge.py read_from)
    reducers: int | list[int]  # the files there (read_from)
    slot: int  # the document shard's decision slot (plan/context.py `slot_offsets`)
    columns: dict[str, str]  # the kind's detail columns -> pyarrow type names
    combined: NotRequired[bool]  # key-level decisions with the map's rest file (shards/combine.py)
    rest: NotRequired[str | None]  # that rest file (None: the map kept no rest rows)
    describe: str
    prior: NotRequired[Prior]  # from the executor: the earlier shard of the same partial key


def run_shard(spec: ApplySpec, out) -> dict:
    doc = spec["doc"]
    dec = shuffle.decisions(spec["decisions"], spec["slot"], spec["reducers"])
    if spec.get("combined"):  # key-level decisions (pipeline/shards/combine.py)
        dec = combine.resolve(dec, spec.get("rest"), list(spec["columns"]))
    # what it reads of its layers and of the reducers' folder: an earlier shard that read the same is linked
    rk, state = readkey.shard(doc, ("n_chars", "n_tokens"), dec)
    if (st := same_as_before(spec, out, rk)) is not None:
        return st
    n = len(state.keep)
    rows, chars, toks = sizes(doc, state)
    keep = np.zeros(n, dtype=bool)
    keep[rows] = True
    seen = keep.copy()
    ids = fs.read_table(doc["documents"], columns=["id"]).column("id")
    cols = {"id": ids}
    removed = np.zeros(0, np.int64)
    if dec is not None and dec.num_rows:
        removed = dec.column("row").to_numpy()
        if not seen[removed].all():
            raise ValueError(f"decisions name rows that an earlier stage removed: {doc['documents']}")
        keep[removed] = False
    keep_arr = pa.array(np.where(seen, keep, False), pa.bool_(), mask=~seen)
    cols["keep"] = keep_arr
    for c, t in spec["columns"].items():
        typ = getattr(pa, t)()
        cols[c] = scatter(n, removed, dec.column(c).cast(typ)) if len(removed) else pa.nulls(n, typ)
    table = pa.table(cols)
    write_attributes(out.dir, doc, table)
    by_kind: dict[str, int] = {}
    if len(removed):
        kinds = pa.compute.utf8_slice_codeunits(dec.column("reason"), 0, 64).to_pylist()
        for r in kinds:
            k = r.split(":", 1)[0].removesuffix("_of")
            by_kind[k] = by_kind.get(k, 0) + 1
    return {**stage_stats(doc, rows, chars, toks, keep[rows], by_kind), "read_key": rk}
