"""Shuffles through files, O(maps + reducers) of them: each map task writes one data file
sorted by partition and one offset index; each reduce task reads its byte range from
every map's data file.

    <step>/buckets/part-00012.data    map shard 12's rows, partition 0's segment first
    <step>/buckets/part-00012.index   P + 1 little-endian uint64 offsets into the .data file

A segment is an Arrow IPC stream (zstd-compressed buffers), or, when it holds at most
RAW_ROWS rows, its columns' raw bytes (numbers, strings and bytes, with their nulls) after
a header of its row count and column names and types, zstd-compressed past a KB: a
stream's schema and batch framing are ~450 bytes for two columns and ~2.5 KB for the
mixture's fourteen, while a segment of a few rows is most of what a map writes per
partition when partitions grow with the corpus (band keys, pairs, edges; the route's
documents, about one a partition at scale).
Either way a reducer decodes exactly the bytes of its partition: it reads 16 bytes of each index (offsets p and p + 1) and
then that range of the data file, two small reads per (map, partition), on local disks
and object stores alike (ranged GETs; no listing: a reducer derives the map files' names
from their count); on an object store 16 maps' reads are in flight at once, kept in map
order. Empty partitions take no bytes. Per map task the index is 8 x (P + 1)
bytes; at P = 100,000 that is 800 KB beside a data file of tens of MB.

The same layout carries decisions back to the document shards they are about
(`write_to_shards`): a reducer's output is partitioned by the document shard's slot
(sources in YAML order, each a block of its shard count rounded up to a power of two, then
its ingest shards: Context.slot_offsets), and the per-shard step that applies them reads
segment `slot` of every reducer's file.

Files are written to temporary names and renamed, the index last, so a retried task
rewrites the same names with the same bytes. A reducer concatenates segments in map
order; every reducer sorts its rows by a total key afterwards, so the result does not
depend on which task finished first.

Documents are named globally by `gid = source_index << 56 | shard << 32 | row`.
"""

from __future__ import annotations

import os
from typing import TypedDict

from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.io import atomic, fs

VERSION = "4"  # 4: small segments of any column raw, nulls and texts too (CRS2); 3: small segments of numbers and ids raw (RAW_ROWS); 2: map outputs as .data + .index files: the version of every step that writes a shuffle

_IPC = pa.ipc.IpcWriteOptions(compression="zstd")
_written = [0]  # bytes of shuffle data this process has written (`bytes_written`)
READ_THREADS = 16  # a reducer's segment reads in flight at once on an object store
INDEX_WINDOW = 64 << 20  # bytes of its maps' offset indexes a merge task holds at once (8 a partition a map)
MERGE_BUFFER = 4 << 20  # read-ahead per map file a merge streams (a group of 32: 128 MB)
_U64 = np.dtype("<u8")



class ReduceSpec(TypedDict):
    """What every dedup reducer's shard carries (steps/dedup/plan.py `reduce_specs`): one
    partition of its maps' shuffle, and where its decisions go back to (write_to_shards);
    each reducer's spec extends it with its own keys."""

    inputs: str  # the maps' (or their merge tier's) buckets folder (read_partition)
    maps: int | list[int]  # the files there (steps/merge.py read_from)
    partition: int
    offsets: list[int]  # per source, its first decision slot (plan/context.py `slot_offsets`)
    ndocs: int  # the number of slots
    sources: list[str]
    rank_source: list[str]  # rank -> source


def gid(src: int, part: int, rows: np.ndarray) -> np.ndarray:
    return (np.int64(src) << np.int64(56)) | (np.int64(part) << np.int64(32)) | rows.astype(np.int64)


def split_gid(g: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    g = np.asarray(g, dtype=np.int64)
    return g >> np.int64(56), (g >> np.int64(32)) & np.int64(0xFFFFFF), g & np.int64(0xFFFFFFFF)


def partition_of(keys: np.ndarray, nparts: int) -> np.ndarray:
    """A partition for well-mixed uint64 keys."""
    return ((keys >> np.uint64(32)) % np.uint64(nparts)).astype(np.int64)


def map_file(directory, index: int) -> Path:
    """The base name of map (or reduce) task `index`'s shuffle output in `directory`."""
    return fs.path(directory) / f"part-{index:05d}"


def _with(base: Path, suffix: str) -> Path:
    return base.with_name(base.name + suffix)


def write_partitions(table: pa.Table, part: np.ndarray, nparts: int, base: Path) -> int:
    """Rows of `table` to `base`.data, grouped by `part` (stable within a partition), with
    the offset index `base`.index. Always written, empty or not, so readers can count on
    it. Returns the number of non-empty partitions."""
    part = np.asarray(part, dtype=np.int64)
    if len(part) and (part.min() < 0 or part.max() >= nparts):
        raise ValueError(f"partition numbers outside [0, {nparts}) for {base}")
    order = np.argsort(part, kind="stable")
    sp = part[order]
    counts = np.bincount(sp, minlength=nparts)
    starts = np.r_[0, np.cumsum(counts)]
    offsets = np.zeros(nparts + 1, _U64)
    data = _with(base, ".data")
    sorted_t = table.take(pa.array(order)) if table.num_rows else table
    pos = 0
    raw = _raw_layout(table.schema) if table.num_rows else None
    with atomic.creating(data) as f:
        for p in np.flatnonzero(counts):
            seg = sorted_t.slice(int(starts[p]), int(counts[p]))
            buf = _raw(seg, raw) if raw is not None and counts[p] <= RAW_ROWS else _stream_bytes(seg)
            f.write(buf)
            offsets[p] = pos
            pos += len(buf)
            offsets[p + 1 :] = pos
    atomic.write_bytes(_with(base, ".index"), offsets.tobytes())
    _written[0] += pos
    return int((counts > 0).sum())


def bytes_written() -> int:
    """Shuffle bytes this process has written so far: a task reports the difference, so
    that the merge tier can split a group of writers whose files are large (steps/merge.py)."""
    return _written[0]


def write_empty(nparts: int, base: Path) -> int:
    """A map output with no rows (readers count on every map's files)."""
    return write_partitions(pa.table({}), np.zeros(0, np.int64), nparts, base)


def _read_range(p: Path, start: int, end: int) -> bytes:
    if fs.is_local(p):
        with open(p, "rb") as f:
            f.seek(start)
            return f.read(end - start)
    return fs.read_through(lambda q: q.fs.cat_file(q.path, start=start, end=end), p)


def read_segment(base: Path, p: int) -> pa.Table | None:
    """Partition `p`'s rows in one map output (None when it has none)."""
    base = fs.path(base)
    raw = _read_range(_with(base, ".index"), 8 * p, 8 * p + 16)
    if len(raw) != 16:
        raise ValueError(f"{_with(base, '.index')} has no partition {p}")
    lo, hi = np.frombuffer(raw, _U64).tolist()
    if hi == lo:
        return None
    return _decode(_read_range(_with(base, ".data"), lo, hi))


def _decode(buf: bytes) -> pa.Table:
    """A segment: one Arrow IPC stream or raw segment, or several back to back (a merged
    output, `merge`), in order."""
    src = pa.BufferReader(pa.py_buffer(buf))
    tables = []
    while src.tell() < len(buf):
        at = src.tell()
        if buf[at:at + 4] in (_RAW_MAGIC, _RAW_MAGIC2):
            t, n = _unraw(buf, at)
            tables.append(t)
            src.seek(at + n)
        else:
            tables.append(pa.ipc.open_stream(src).read_all())
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


RAW_ROWS = 256  # a segment of at most this many rows is written raw (no IPC framing)
RAW_COMPRESS = 1024  # a raw segment's body past this many bytes is zstd-compressed
_RAW_MAGIC = b"CRS1"  # shuffle version 3's raw segments (no nulls, numbers and short strings), still read
_RAW_MAGIC2 = b"CRS2"  # an IPC stream starts with 0xFFFFFFFF: neither looks like it
_RAW_TYPES = {pa.int64(): "<i8", pa.uint64(): "<u8", pa.int32(): "<i4", pa.uint32(): "<u4", pa.int16(): "<i2",
              pa.uint16(): "<u2", pa.int8(): "<i1", pa.uint8(): "<u1", pa.float64(): "<f8", pa.float32(): "<f4",
              pa.string(): "str", pa.large_string(): "lst", pa.binary(): "bin", pa.large_binary(): "lbn"}
_VARLEN = ("str", "lst", "bin", "lbn")  # their values' byte lengths (uint32), then their bytes
_RAW_CODES = {v: k for k, v in _RAW_TYPES.items()}


def _stream_bytes(t: pa.Table) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema, options=_IPC) as w:
        w.write_table(t)
    return sink.getvalue()


def _raw_layout(schema: pa.Schema) -> bytes | None:
    """The header tail of a raw segment of this schema (column count, then per column its
    type and name), or None when a column is not a number, a string or bytes, or the
    schema has metadata (what a raw segment cannot carry, so it could not give the same
    table back)."""
    if schema.metadata or not len(schema) or len(schema) > 255 or len(set(schema.names)) < len(schema):
        return None
    head = bytes([len(schema)])
    for f in schema:
        code, name = _RAW_TYPES.get(f.type), f.name.encode()
        if code is None or not f.nullable or f.metadata or len(name) > 255:
            return None
        head += code.encode() + bytes([len(name)]) + name
    return head


def _raw(t: pa.Table, layout: bytes) -> bytes:
    """A raw segment (CRS2): magic, row count (uint32), a flags byte, the layout, the body's
    stored length (uint32), then the body: per column a nulls flag (and its validity bits),
    then its values (little-endian numbers; a string's or bytes' lengths as uint32, then
    their bytes), zstd-compressed past RAW_COMPRESS bytes (a page's text compresses; a
    stream's framing is ~2.5 KB a segment where the mixture's route writes about a
    document a segment at scale)."""
    n = t.num_rows
    parts = []
    for c in t.columns:
        a = c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c
        if a.null_count:
            parts.append(b"\x01" + np.packbits(np.asarray(a.is_valid()), bitorder="little").tobytes())
        else:
            parts.append(b"\x00")
        code = _RAW_TYPES[a.type]
        if code in _VARLEN:
            wide = code in ("lst", "lbn")
            bufs = a.buffers()
            offs = np.frombuffer(bufs[1], np.int64 if wide else np.int32, n + 1, (8 if wide else 4) * a.offset) \
                if n else np.zeros(1, np.int64)
            parts.append(np.diff(offs).astype("<u4").tobytes())
            # the segment's bytes only: a slice of the map's whole column shares its buffer
            parts.append(bufs[2].slice(int(offs[0]), int(offs[-1] - offs[0])).to_pybytes() if n and bufs[2] is not None else b"")
        else:
            parts.append(np.ascontiguousarray(a.fill_null(0).to_numpy(zero_copy_only=False), dtype=code).tobytes())
    body = b"".join(parts)
    flags = 0
    if len(body) > RAW_COMPRESS:
        import zstandard

        body, flags = zstandard.ZstdCompressor(level=1).compress(body), 1
    return b"".join([_RAW_MAGIC2, np.uint32(n).tobytes(), bytes([flags]), layout, np.uint32(len(body)).tobytes(), body])


def _unraw(buf: bytes, at: int) -> tuple[pa.Table, int]:
    """The table of the raw segment at `at` of `buf` (CRS2, or the CRS1 of shuffle version 3),
    and its length in bytes."""
    v2 = buf[at:at + 4] == _RAW_MAGIC2
    n = int(np.frombuffer(buf, "<u4", 1, at + 4)[0])
    pos = at + 8
    flags = buf[pos] if v2 else 0
    pos += 1 if v2 else 0
    ncols = buf[pos]
    pos += 1
    fields = []
    for _ in range(ncols):
        code, k = buf[pos:pos + 3].decode(), buf[pos + 3]
        fields.append((buf[pos + 4:pos + 4 + k].decode(), code))
        pos += 4 + k
    if v2:
        stored = int(np.frombuffer(buf, "<u4", 1, pos)[0])
        pos += 4
        end = pos + stored
        body = buf[pos:end]
        if flags & 1:
            import zstandard

            body = zstandard.ZstdDecompressor().decompress(body)
        cols, used = _raw_columns(body, 0, n, fields, True)
        return pa.table(cols), end - at
    cols, used = _raw_columns(buf, pos, n, fields, False)
    return pa.table(cols), used - at


def _raw_columns(buf: bytes, pos: int, n: int, fields: list[tuple[str, str]], nulls: bool) -> tuple[dict, int]:
    """The columns of a raw segment's body from `pos`; and where it ends."""
    cols = {}
    for name, code in fields:
        validity = None
        if nulls:
            flag, pos = buf[pos], pos + 1
            if flag:
                k = (n + 7) // 8
                validity = pa.py_buffer(buf[pos:pos + k])
                pos += k
        if code in _VARLEN:
            lengths = np.frombuffer(buf, "<u4", n, pos)
            pos += 4 * n
            wide = code in ("lst", "lbn")
            offsets = np.zeros(n + 1, np.int64 if wide else np.int32)
            np.cumsum(lengths, out=offsets[1:])
            data = buf[pos:pos + int(offsets[-1])]
            pos += int(offsets[-1])
            arr = pa.Array.from_buffers(_RAW_CODES[code], n, [validity, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data)])
        else:
            width = np.dtype(code).itemsize
            values = np.frombuffer(buf, code, n, pos).astype(np.dtype(code).newbyteorder("="))
            pos += width * n
            arr = pa.array(values, _RAW_CODES[code]) if validity is None else \
                pa.Array.from_buffers(_RAW_CODES[code], n, [validity, pa.py_buffer(values.tobytes())])
        cols[name] = arr
    return cols, pos


def _stream(p: Path, read_ahead: int):
    """A file read front to back with `read_ahead` bytes buffered (on an object store: GETs of
    that size)."""
    p = fs.path(p)
    return open(p, "rb", buffering=read_ahead) if fs.is_local(p) else fs.open_read(p, read_ahead)


def merge(directory, first: int, last: int, base: Path, buffering: int | None = None,
          span: tuple[int, int] | None = None, index_window: int = INDEX_WINDOW) -> dict:
    """Map outputs first..last-1 of `directory` as one output at `base`: partition p's
    segment is their segments p back to back, in map order, so `read_partition` over the
    merged outputs gives the rows it gives over the maps, in the same order. A byte copy
    (no decoding): each map's index is read once and its data file streamed front to back
    (partitions are in file order) with `buffering` bytes of read-ahead, all of the group's
    files open at once. `span` = (r, R): only the r-th of R contiguous partition ranges
    (`span_of`), read from each data file from the range's first byte; the other partitions
    are empty in the output. The maps' offsets are read a window of partitions at a time
    (`index_window` bytes of them in all)."""
    directory = fs.path(directory)
    bases = [map_file(directory, i) for i in range(first, last)]
    indexes = [_with(b, ".index") for b in bases]
    nparts = _size(indexes[0]) // 8 - 1 if indexes else 0
    p0, p1 = span_of(span, nparts) if span else (0, nparts)
    # the maps' offsets a window of partitions at a time, read by range: a task holds at most
    # INDEX_WINDOW bytes of them whatever the group and the partitions (whole indexes of a
    # group of 7,800 maps of 125,000 partitions would be 7.8 GB), and a range reads its own
    win = max(1, index_window // (8 * max(1, len(bases))))
    data = _with(base, ".data")
    out = np.zeros(nparts + 1, _U64)
    # opened many at a time (an object store answers each open after a request: 7,800 one after another wait ~3 min)
    streams = list(fs.read_many(lambda b: _stream(_with(b, ".data"), buffering or MERGE_BUFFER), bases))
    try:
        pos = 0
        with atomic.creating(data) as f:
            for w0 in range(p0, max(p1, p0 + 1) if nparts else p0, win):
                w1 = min(p1, w0 + win)
                offs = _offsets(indexes, w0, w1, nparts, f"{directory}: maps {first}..{last - 1}")
                if w0 == p0 and p0:
                    for st, o in zip(streams, offs):
                        st.seek(int(o[0]))
                for p in range(w0, w1):
                    out[p] = pos
                    for st, o in zip(streams, offs):
                        n = int(o[p - w0 + 1] - o[p - w0])
                        if n:
                            chunk = st.read(n)
                            if len(chunk) != n:
                                raise ValueError(f"{directory}: a map's data file is shorter than its index says")
                            f.write(chunk)
                            pos += n
            out[p1:] = pos
    finally:
        for st in streams:
            st.close()
    atomic.write_bytes(_with(base, ".index"), out.tobytes())
    return {"maps": last - first, "bytes": int(pos) if nparts else 0, "partitions": nparts}


def _size(p: Path) -> int:
    p = fs.path(p)
    return os.path.getsize(p) if fs.is_local(p) else p.fs.size(p.path)


def _offsets(indexes: list[Path], w0: int, w1: int, nparts: int, where: str) -> list[np.ndarray]:
    """Each map's offsets of partitions w0..w1 (w1 - w0 + 1 values), by ranged reads, many at
    a time on an object store; a map with another number of partitions is an error (the last
    window reads one value past the end, which a longer index has)."""
    last = w1 == nparts
    want = 8 * (w1 - w0 + 1)

    def one(ix: Path) -> bytes:
        return _read_range(fs.path(ix), 8 * w0, 8 * (w1 + 1) + (8 if last else 0))
    raw = map(one, indexes) if not indexes or fs.is_local(fs.path(indexes[0])) else fs.read_many(one, indexes)
    out = []
    for b in raw:
        if len(b) != want:
            raise ValueError(f"{where} disagree on the number of partitions")
        out.append(np.frombuffer(b, _U64))
    return out


def span_of(span: tuple[int, int], nparts: int) -> tuple[int, int]:
    """Partitions [p0, p1) of the r-th of R contiguous ranges of nparts partitions."""
    r, ranges = span
    return r * nparts // ranges, (r + 1) * nparts // ranges


def files_of(nfiles, p: int) -> range:
    """The map outputs a reader of partition p reads: 0..nfiles-1, or, for a merge tier
    split by partition ranges (`nfiles` = [groups, ranges, partitions]: merged file
    r x groups + j holds group j's partitions of range r), its range's files only."""
    if isinstance(nfiles, int):
        return range(nfiles)
    groups, ranges, nparts = nfiles
    r = next(r for r in range(ranges) if span_of((r, ranges), nparts)[0] <= p < span_of((r, ranges), nparts)[1])
    return range(r * groups, (r + 1) * groups)


def read_partition(directory, nfiles, p: int, schema: pa.Schema | None = None) -> pa.Table | None:
    """Partition `p` of the map outputs in `directory` (`files_of(nfiles, p)`), in map order
    (None if none holds a row and no schema is given)."""
    directory = fs.path(directory)
    files = files_of(nfiles, p)
    if fs.is_local(directory):
        segs = (read_segment(map_file(directory, i), p) for i in files)
    else:  # each segment is two GETs of tens of ms: keep READ_THREADS of them in flight, in map order
        segs = fs.read_many(lambda i: read_segment(map_file(directory, i), p), files, threads=READ_THREADS)
    parts = [t for t in segs if t is not None]
    if not parts:
        return None if schema is None else schema.empty_table()
    return pa.concat_tables(parts)


def write_to_shards(table: pa.Table, g: np.ndarray, offsets: list[int], ndocs: int, base: Path) -> int:
    """Decision rows to the document shard they are about, partitioned by its slot
    offsets[source] + shard (see the module docstring). `table` gets a `row`
    column (the row in that shard) in place of the gids, sorted by row."""
    src, part, row = split_gid(g)
    k = np.asarray(offsets, dtype=np.int64)[src] + part if len(g) else np.zeros(0, np.int64)
    order = np.lexsort((row, k))
    table = table.take(pa.array(order)).append_column("row", pa.array(row[order], pa.int64()))
    return write_partitions(table, k[order], ndocs, base)


def decisions(step_dir, k: int, nfiles) -> pa.Table | None:
    """The decisions a reduce step wrote for document shard k: reducer by reducer, each
    reducer's sorted by row."""
    t = read_partition(fs.path(step_dir) / "to", nfiles, k)
    return None if t is None or t.num_rows == 0 else t
