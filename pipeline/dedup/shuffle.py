"""Shuffles through files: map tasks write rows into partition directories, reduce tasks
read one directory each.

    <map step>/buckets/p-00003/<source>-part-00012.parquet   rows of map shard (web, 12) for partition 3
    <reduce step>/to/<source>/part-00012/p-00003.parquet     decisions for document shard (web, 12)

Every file is written to a temporary name and renamed, so a retried task rewrites the
same names with the same bytes; only non-empty partitions get a file. Readers sort the
file names, so the concatenation order does not depend on which task finished first.

Documents are named globally by `gid = source_index << 56 | shard << 32 | row`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.io import fs


def gid(src: int, part: int, rows: np.ndarray) -> np.ndarray:
    return (np.int64(src) << np.int64(56)) | (np.int64(part) << np.int64(32)) | rows.astype(np.int64)


def split_gid(g: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    g = np.asarray(g, dtype=np.int64)
    return g >> np.int64(56), (g >> np.int64(32)) & np.int64(0xFFFFFF), g & np.int64(0xFFFFFFFF)


def partition_of(keys: np.ndarray, nparts: int) -> np.ndarray:
    """A partition for well-mixed uint64 keys."""
    return ((keys >> np.uint64(32)) % np.uint64(nparts)).astype(np.int64)


def _write(table: pa.Table, final: Path) -> None:
    fs.makedirs(final.parent)
    fs.write_table(table, final, compression="zstd")


def write_partitions(table: pa.Table, part: np.ndarray, root: Path, name: str) -> int:
    """Rows of `table` to root/p-XXXXX/<name>.parquet by `part`; returns files written."""
    if table.num_rows == 0:
        return 0
    order = np.argsort(part, kind="stable")
    sp = part[order]
    cuts = np.flatnonzero(np.r_[True, sp[1:] != sp[:-1], True])
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        _write(table.take(pa.array(order[lo:hi])), root / f"p-{int(sp[lo]):05d}" / f"{name}.parquet")
    return len(cuts) - 1


def write_to_shards(table: pa.Table, g: np.ndarray, sources: list[str], root: Path, name: str) -> int:
    """Decision rows to the document shard they are about: root/to/<source>/part-XXXXX/<name>.parquet.
    `table` gets a `row` column (the row in that shard) in place of the gids."""
    if table.num_rows == 0:
        return 0
    src, part, row = split_gid(g)
    key = (src << np.int64(24)) | part
    order = np.lexsort((row, key))
    table = table.take(pa.array(order)).append_column("row", pa.array(row[order]))
    sk = key[order]
    cuts = np.flatnonzero(np.r_[True, sk[1:] != sk[:-1], True])
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        s, p = int(sk[lo]) >> 24, int(sk[lo]) & 0xFFFFFF
        _write(table.slice(lo, hi - lo), root / "to" / sources[s] / f"part-{p:05d}" / f"{name}.parquet")
    return len(cuts) - 1


def read_dir(directory: Path, schema: pa.Schema | None = None) -> pa.Table | None:
    """Every finished Parquet file of a partition directory, in name order (None if none)."""
    files = sorted(p for p in fs.path(directory).glob("*.parquet")) if fs.path(directory).is_dir() else []
    if not files:
        return None if schema is None else schema.empty_table()
    return pa.concat_tables([fs.read_table(f) for f in files])


def decisions(step_dir: str, source: str, part: int) -> pa.Table | None:
    return read_dir(fs.path(step_dir) / "to" / source / f"part-{part:05d}")
