"""The current state of a document shard: which rows are still kept, and their text.

Documents are written once, by ingest; every later stage writes an attribute file with
the same rows in the same order (`keep`, `reason`, ...). A shard's *layers* are those
files in stage order. A row is still kept when no layer says `keep = false` (a null
`keep` means the stage never saw the row). A stage that rewrites text (c4_quality with
rewrite, paragraph dedup) adds `text`, `n_chars` and `n_tokens` columns, null where it
left the row alone; the latest non-null value wins.

Attribute files are read whole (one shard's `keep` and rewritten texts); documents are
streamed in batches.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.io import fs
from pipeline.shards.documents import DocShard

OVERRIDES = ("text", "n_chars", "n_tokens")
BATCH_ROWS = 4096


def num_rows(documents: str) -> int:
    return fs.parquet_metadata(documents).num_rows


class Layers:
    """The keep mask and text overrides of one document shard, from its attribute files.
    Only the overrides of `columns` are read (default: all); `columns=()` reads `keep` alone,
    which is what a pass that needs no text should ask for (a rewritten `text` column is
    most of an attribute file's bytes)."""

    def __init__(self, layers: list[str], n: int, columns=OVERRIDES):
        self.keep = np.ones(n, dtype=bool)
        self.overrides: dict[str, pa.Array] = {}
        wanted = [c for c in OVERRIDES if c in columns]
        for path in layers:
            names = fs.parquet_schema(path).names if wanted else ()
            cols = ["keep"] + [c for c in wanted if c in names]
            t = fs.read_table(path, columns=cols)
            if t.num_rows != n:
                raise ValueError(f"{path} has {t.num_rows} rows, its document shard {n}")
            self.keep &= t.column("keep").fill_null(True).to_numpy(zero_copy_only=False)
            for c in cols[1:]:
                new = t.column(c).combine_chunks()
                old = self.overrides.get(c)
                self.overrides[c] = new if old is None else pc.coalesce(new, old.cast(new.type))

    def apply(self, batch: pa.RecordBatch, start: int) -> pa.RecordBatch:
        """`batch` (rows [start, start + n) of the shard) with the overrides applied."""
        for c, arr in self.overrides.items():
            if c in batch.schema.names:
                i = batch.schema.get_field_index(c)
                new = arr.slice(start, batch.num_rows).cast(batch.schema.field(c).type)
                batch = batch.set_column(i, c, pc.coalesce(new, batch.column(c)))
        return batch


def kept_batches(documents: str, layers: list[str], columns: list[str], batch_rows: int = BATCH_ROWS,
                 state: Layers | None = None) -> Iterator[tuple[np.ndarray, pa.RecordBatch]]:
    """(row numbers in the shard, batch of those rows' current values), kept rows only;
    `state`: the shard's layers already read (readkey.shard), holding the overrides of `columns`."""
    pf = fs.parquet_file(documents)
    state = state if state is not None else Layers(layers, pf.metadata.num_rows, columns)
    start = 0
    for batch in pf.iter_batches(batch_size=batch_rows, columns=columns):
        n = batch.num_rows
        mask = state.keep[start : start + n]
        batch = state.apply(batch, start)
        rows = np.flatnonzero(mask) + start
        if len(rows) == n:
            yield rows, batch
        elif len(rows):
            yield rows, batch.filter(pa.array(mask))
        start += n


def read_rows(documents: str, layers: list[str], rows: np.ndarray, columns: list[str],
              state: Layers | None = None) -> pa.Table:
    """The current values of some rows (sorted, unique), reading only their row groups;
    `state`: the shard's layers already read (readkey.shard), holding the overrides of `columns`."""
    pf = fs.parquet_file(documents)
    md = pf.metadata
    bounds = np.cumsum([0] + [md.row_group(k).num_rows for k in range(md.num_row_groups)])
    groups = np.unique(np.searchsorted(bounds, rows, side="right") - 1)
    parts, offsets = [], []
    for g in groups:
        parts.append(pf.read_row_group(int(g), columns=columns))
        offsets.append(bounds[g])
    if not parts:
        return pf.schema_arrow.empty_table().select(columns)
    table = pa.concat_tables(parts)
    local = np.concatenate([np.arange(t.num_rows) + o for t, o in zip(parts, offsets)])
    table = table.take(pa.array(np.searchsorted(local, rows)))
    state_cols = [c for c in OVERRIDES if c in columns]
    if state is not None:  # the overrides already coalesced over the layers
        news = ((c, state.overrides[c]) for c in state_cols if c in state.overrides)
    else:  # each layer's, in order: a later one's value wins (a layer's schema read once, none without such columns)
        news = ((c, fs.read_table(path, columns=[c]).column(c)) for path in (layers if state_cols else [])
                for names in [fs.parquet_schema(path).names] for c in state_cols if c in names)
    for c, new in news:
        i = table.schema.get_field_index(c)
        table = table.set_column(i, c, pc.coalesce(new.take(pa.array(rows)).cast(table.schema.field(c).type), table.column(c)))
    return table


def shard_langs(d: DocShard) -> np.ndarray | None:
    """The language the chain's first language filter detected for every row of a document
    shard (None where unset: a row it did not see), or None without one."""
    return shard_axis(d, "lang")


def shard_axis(d: DocShard, axis: str) -> np.ndarray | None:
    """Every row's value of a mixture axis of a document shard, as text (None where unset),
    or None when no layer gives it: `lang`, the chain's first language filter's
    `<filter>.lang`; any other axis, the layer column named after it (the stage that
    declares the axis writes it: docs/extending.md)."""
    for path in d["layers"]:
        names = fs.parquet_schema(path).names
        col = next((c for c in names if c.endswith(".lang")), None) if axis == "lang" else (axis if axis in names else None)
        if col is not None:
            values = fs.read_table(path, columns=[col]).column(0)
            return np.array((values if pa.types.is_string(values.type) else values.cast(pa.string())).to_pylist(),
                            dtype=object)
    return None


def shard_axes(d: DocShard, axes: list[str]) -> dict[str, np.ndarray | None] | None:
    """shard_axis of each of `axes` (None for an axis no layer gives), or None without axes."""
    return {a: shard_axis(d, a) for a in axes} or None


def rows_of(values: dict[str, np.ndarray | None] | None, rows) -> dict[str, np.ndarray | None] | None:
    """Each axis's values (shard_axes) at `rows`."""
    return None if values is None else {a: None if v is None else v[rows] for a, v in values.items()}


# The attributes the mix reads of a document shard's layers, found by the columns the layer
# that gives them declares (never by its step's name): a classifier's quality layer has
# `score` (and `bucket` when the source has buckets), its topic layer `topic` and
# `topic_score`, a language filter's attributes `<filter>.lang`. No other layer has them.
QUALITY = ("score", "bucket")
TOPIC = ("topic", "topic_score")


def layer_with(d: DocShard, column: str) -> tuple[str, list[str]] | None:
    """(path, its columns) of the first layer of a document shard that has `column`, or None."""
    for path in d["layers"]:
        names = fs.parquet_schema(path).names
        if column in names:
            return path, names
    return None


def shard_topics(d: DocShard) -> np.ndarray | None:
    """The topic of every row of a document shard (None where unset), or None."""
    if (hit := layer_with(d, "topic")) is not None:
        return np.array(fs.read_table(hit[0], columns=["topic"]).column("topic").to_pylist(), dtype=object)
    return None


def shard_buckets(d: DocShard) -> np.ndarray | None:
    """The quality bucket of every row of a document shard (-1 where unset), or None."""
    if (hit := layer_with(d, "bucket")) is not None:
        return fs.read_table(hit[0], columns=["bucket"]).column("bucket").combine_chunks().fill_null(-1).to_numpy().astype(np.int64)
    return None
