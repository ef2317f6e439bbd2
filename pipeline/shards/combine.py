"""Map-side combining for exact and paragraph dedup: a heavy key (a boilerplate paragraph
in 10% of the documents, one text copied a million times) costs its reducer at most m
rows per document shard holding it, not one row per document.

Both kinds keep the first m holders of a key in a total order and act on the rest
(exact: m = 1, the rest are removed; paragraph: m = `max_occurrences`, the rest lose
the paragraph). Within one document shard the source priority is constant, so:

map     sorts its (key, order, id) rows and sends only each key's first m (`top`); the
        m-th carries `extra`, how many more of the shard's documents hold the key. The
        others (`rest`: key and row) stay in a small local file beside the map output.
reduce  sorts a key's entries from every shard; its first m are the key's first m
        overall (each shard sent its own first m, so none is missing). Where the key's
        total (entries + extras) exceeds m, it sends back to each shard every entry past
        the first m (`cut`) and, to a shard with extras, one row saying "every one of
        your rest rows with this key goes too" (`extra`): a rest row has m holders
        before it in its own shard, so it is past the first m overall.
apply   joins the `extra` rows with its rest file on the key and adds the `cut` rows:
        the row-level decisions, exactly those of a reduce over every holder.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.io import atomic, fs

VERSION = "3"  # exact and paragraph maps send each key's first holders only: the version of maps that combine

KEYS = ["h1", "h2"]


def tiebreak(spec: dict) -> str:
    """What orders one source's holders of a key (dedup.order): `gid`, the document's place
    (its ingest shard, numbered in file order, then its row: the first file's copy first),
    or `id`, its id (the default, left out of specs)."""
    return "gid" if spec.get("order") == "place" else "id"


def _groups(t: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Per row of a key-sorted table: is it its key's first row; its position in its key."""
    h1, h2 = t.column("h1").to_numpy(), t.column("h2").to_numpy()
    new = np.r_[True, (h1[1:] != h1[:-1]) | (h2[1:] != h2[:-1])] if len(h1) else np.zeros(0, bool)
    idx = np.arange(len(new))
    head = np.maximum.accumulate(np.where(new, idx, 0)) if len(new) else idx
    return new, idx - head


def local_top(table: pa.Table, order: list[str], m: int, tiebreak: str = "id") -> tuple[pa.Table, pa.Table]:
    """One document shard's (h1, h2, *order, id, gid, ...) rows -> (top, rest).

    top: each key's first m rows in (key, *order, tiebreak) order (`tiebreak(spec)`: the id,
    or the gid by place), with `extra` (int64) on its
    m-th row: the shard's holders past the first m (0 elsewhere). rest: (h1, h2, row) of
    those holders, sorted by key."""
    t = table.sort_by([("h1", "ascending"), ("h2", "ascending"), *((c, "ascending") for c in order), (tiebreak, "ascending")])
    new, pos = _groups(t)
    starts = np.flatnonzero(new)
    sizes = np.diff(np.r_[starts, len(new)])
    size = np.repeat(sizes, sizes)  # each row's key count
    keep = pos < m
    extra = np.where(pos == m - 1, size - m, 0).astype(np.int64)
    top = t.filter(pa.array(keep)).append_column("extra", pa.array(extra[keep]))
    rest_idx = pa.array(np.flatnonzero(~keep))
    rows = (t.column("gid").to_numpy() & np.int64(0xFFFFFFFF))[~keep]
    rest = pa.table({"h1": t.column("h1").take(rest_idx), "h2": t.column("h2").take(rest_idx),
                     "row": pa.array(rows, pa.int64())})
    return top, rest


def write_rest(rest: pa.Table, directory, index: int) -> int:
    """The rest file of map task `index` (written only when it has rows); its row count."""
    if rest.num_rows:
        fs.makedirs(fs.path(directory))
        atomic.write_table(rest, rest_path(directory, index), compression="zstd")
    return rest.num_rows


def rest_path(directory, index: int) -> Path:
    return fs.path(directory) / f"part-{index:05d}.parquet"


def reduce_groups(t: pa.Table, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """A reducer's entries sorted by (key, order...) -> (head, cut, emit, stats).

    head: each entry's key's first entry; cut: the entry is past its key's first m;
    emit: the entry goes back to its shard (its key has more than m holders, and the
    entry is cut or carries extras). stats: keys with more than m holders (`repeated`),
    holders past the first m (`past`), holders in all (`holders`)."""
    new, pos = _groups(t)
    starts = np.flatnonzero(new)
    extra = t.column("extra").to_numpy()
    totals = np.add.reduceat(1 + extra, starts) if len(starts) else np.zeros(0, np.int64)
    sizes = np.diff(np.r_[starts, len(new)])
    total = np.repeat(totals, sizes)
    head = np.repeat(starts, sizes)
    cut = pos >= m
    emit = (total > m) & (cut | (extra > 0))
    stats = {"repeated": int((totals > m).sum()), "past": int(np.maximum(totals - m, 0).sum()),
             "holders": int(totals.sum())}
    return head, cut, emit, stats


def resolve(dec: pa.Table | None, rest_file, columns: list[str]) -> pa.Table | None:
    """Key-level decisions for one document shard (h1, h2, cut, extra, *columns, row) ->
    row-level ones (*columns, h1, h2, row), sorted by (row, h1, h2)."""
    if dec is None or dec.num_rows == 0:
        return None
    keep = [*columns, "h1", "h2"]
    direct = dec.filter(dec.column("cut")).select([*keep, "row"])
    parts = [direct]
    keyed = dec.filter(pc.greater(dec.column("extra"), 0))
    if keyed.num_rows:
        if rest_file is None:
            raise ValueError("decisions name extra holders but the shard's map wrote no rest file")
        joined = fs.read_table(rest_file).join(keyed.select(keep), keys=KEYS, join_type="inner")
        if joined.num_rows != pc.sum(keyed.column("extra")).as_py():
            raise ValueError(f"{rest_file} does not hold the extra holders its decisions count")
        parts.append(joined.select([*keep, "row"]))
    out = pa.concat_tables([p.cast(parts[0].schema) for p in parts])
    return out.sort_by([("row", "ascending"), ("h1", "ascending"), ("h2", "ascending")])
