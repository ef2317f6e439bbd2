"""Streaming readers for one split of one input file.

A *split* is the unit of ingest work (one Ray task, one output shard):
- Parquet: a run of row groups (`row_groups`, with the row number of the first row);
- uncompressed JSONL: a byte range `[start, end)` that owns every line *starting* in it;
- compressed JSONL (.gz, .zst): a record range `[first, last)` of the decompressed lines,
  the file's line count coming from a scan task (`count_lines`);
- a saved HF dataset: a row range; local data files read through `datasets` (`hf_builder`):
  a whole file, streamed (a stream cannot seek).

JSONL readers yield `(line_no, byte_offset, raw_line)` and leave parsing to ingest, so a
bad line becomes a quarantine record with its place. A line longer than `max_line` bytes is
never held whole: it is read through and yielded as a `LongLine` (its length and first
bytes), so a 1 GB line costs no more memory than a short one. A stream that breaks part way
(corrupt zstd frame, truncated gzip) yields everything before the break, then one
`StreamError` with the line where reading stopped. Memory is bounded by the batch size.
"""

from __future__ import annotations

import gzip
import io
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import zstandard

from pipeline.io import fs
from pipeline.io.faults import transient

READ_CHUNK = 1 << 20
HEAD = 800  # bytes of an over-long line kept for the quarantine excerpt


@dataclass
class StreamError:
    line_no: int  # the first line that could not be read
    offset: int  # decompressed byte offset where reading stopped
    message: str


def open_binary(path: str, compression: str | None):
    """A binary stream with `read1`: each call returns what one decompression step gave."""
    raw = fs.open_read(path)
    if compression == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if compression == "zstd":
        return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=True)
    return io.BufferedReader(raw, READ_CHUNK)


STREAM_ERRORS = (zstandard.ZstdError, EOFError, zlib.error, gzip.BadGzipFile, OSError)


@dataclass
class LongLine:
    """A line over the reader's `max_line`, read through without being kept."""

    size: int  # bytes, without its newline
    head: bytes  # its first HEAD bytes
    newline: int = 0  # 1 when it ended with a newline

    def __len__(self) -> int:  # bytes consumed from the stream, like len() of a line
        return self.size + self.newline


def _stream_lines(f, max_line: int | None = None) -> Iterator[bytes | LongLine | Exception]:
    """Lines with their newline; a broken stream yields every complete line before the break,
    then the exception (the cut line is not a record we can read). Lines over `max_line`
    bytes come as `LongLine`s."""
    pending = b""
    long: LongLine | None = None  # the over-long line being read through
    while True:
        try:
            chunk = f.read1(READ_CHUNK)
        except STREAM_ERRORS as e:
            if transient(e):  # the store's passing fault, not a damaged file: the shard tries again
                raise
            if long is None:
                *lines, pending = pending.split(b"\n")
                yield from (ln + b"\n" for ln in lines)
            yield e
            return
        if not chunk:
            if long is not None:
                yield long
            elif pending:
                yield pending
            return
        if long is not None:
            nl = chunk.find(b"\n")
            if nl < 0:
                long.size += len(chunk)
                continue
            long.size += nl
            long.newline = 1
            yield long
            long, chunk = None, chunk[nl + 1:]
        pending += chunk
        *lines, pending = pending.split(b"\n")
        yield from (ln + b"\n" if max_line is None or len(ln) <= max_line else LongLine(len(ln), ln[:HEAD], 1)
                    for ln in lines)
        if max_line is not None and len(pending) > max_line:
            long, pending = LongLine(len(pending), pending[:HEAD]), b""


def iter_lines(path: str, compression: str | None, split: dict,
               max_line: int | None = None) -> Iterator[tuple[int, int, bytes | LongLine] | StreamError]:
    """Lines of one JSONL split: (1-based line number, byte offset, line without newline, or a
    `LongLine` for a line over `max_line` bytes)."""
    if compression is None and "start" in split:
        yield from _iter_byte_range(path, split["start"], split["end"], max_line)
        return
    first = split.get("first", 0)
    last = split.get("last")  # None: to the end
    line_no, offset = 0, 0
    with open_binary(path, compression) as f:
        for line in _stream_lines(f, max_line):
            if isinstance(line, Exception):
                yield StreamError(line_no + 1, offset, f"{type(line).__name__}: {line}")
                return
            if last is not None and line_no >= last:
                return
            if line_no >= first:
                yield line_no + 1, offset, line if isinstance(line, LongLine) else line.rstrip(b"\r\n")
            line_no += 1
            offset += len(line)


def _count_newlines(f, upto: int) -> int:
    n, pos = 0, 0
    f.seek(0)
    while pos < upto:
        chunk = f.read(min(READ_CHUNK, upto - pos))
        if not chunk:
            break
        n += chunk.count(b"\n")
        pos += len(chunk)
    return n


def _readline(f, max_line: int | None) -> bytes | LongLine:
    """One line of a seekable file, or a `LongLine` read through in chunks."""
    if max_line is None:
        return f.readline()
    line = f.readline(max_line + 1)
    if len(line) <= max_line or line.endswith(b"\n"):
        return line
    long = LongLine(len(line), line[:HEAD])
    while True:
        part = f.readline(READ_CHUNK)
        if part.endswith(b"\n"):
            long.size += len(part) - 1
            long.newline = 1
            return long
        long.size += len(part)
        if not part:
            return long


def _iter_byte_range(path: str, start: int, end: int, max_line: int | None = None) -> Iterator[tuple[int, int, bytes | LongLine]]:
    with fs.open_read(path, READ_CHUNK) as f:
        pos = 0
        if start > 0:
            f.seek(start - 1)
            skipped = _readline(f, max_line)  # the line that started before us belongs to the previous split
            pos = start - 1 + len(skipped)
        line_no = _count_newlines(f, pos) if pos else 0
        f.seek(pos)
        while pos < end:
            line = _readline(f, max_line)
            if not line:
                return
            line_no += 1
            yield line_no, pos, line if isinstance(line, LongLine) else line.rstrip(b"\r\n")
            pos += len(line)


def count_lines(path: str, compression: str | None) -> dict:
    """Scan a (compressed) file: its line count, and whether the stream broke."""
    n, broken, last_byte = 0, None, b"\n"
    with open_binary(path, compression) as f:
        while True:
            try:
                chunk = f.read1(READ_CHUNK)
            except STREAM_ERRORS as e:
                if transient(e):
                    raise
                broken = f"{type(e).__name__}: {e}"
                break
            if not chunk:
                break
            n += chunk.count(b"\n")
            last_byte = chunk[-1:]
    if last_byte != b"\n":
        n += 1  # a last line without a newline
    return {"lines": n, "broken": broken}


# ---------------------------------------------------------------- Arrow-backed inputs


def parquet_row_groups(path: str, size: int | None = None) -> list[int]:
    """Rows per row group, from the footer alone (fs.parquet_metadata: a ranged read)."""
    md = fs.parquet_metadata(path, size)
    return [md.row_group(i).num_rows for i in range(md.num_row_groups)]


def iter_parquet(path: str, split: dict, columns: list[str] | None, batch_rows: int) -> Iterator[tuple[int, pa.RecordBatch]]:
    """(row number of the batch's first row, batch) over the split's row groups, one group at
    a time: a batch never spans two, so a damaged group loses none of the groups before it."""
    pf = fs.parquet_file(path)
    row = split["first_row"]
    for g in split["row_groups"]:
        for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[g], columns=columns):
            yield row, batch
            row += batch.num_rows


def load_hf(path: str, split_name: str | None):
    import datasets

    ds = datasets.load_from_disk(path)
    if isinstance(ds, datasets.DatasetDict):
        if split_name is None:
            raise KeyError(f"{path} is a DatasetDict with splits {', '.join(ds)}; set hf_split to one of them")
        if split_name not in ds:
            raise KeyError(f"{path} has no split {split_name!r}; splits: {', '.join(ds)}")
        ds = ds[split_name]
    return ds


def iter_hf(path: str, split_name: str | None, split: dict, batch_rows: int) -> Iterator[tuple[int, pa.RecordBatch]]:
    """(row number, batch) over rows [first_row, last_row) of a saved dataset, memory-mapped."""
    ds = load_hf(path, split_name)
    if ds._indices is not None:  # a saved select()/shuffle() view: read rows through the index
        ds = ds.flatten_indices()
    table = ds.data.table
    row = split["first_row"]
    for off in range(split["first_row"], split["last_row"], batch_rows):
        n = min(batch_rows, split["last_row"] - off)
        for b in table.slice(off, n).to_batches():
            yield row, b
            row += b.num_rows


def iter_hf_files(path: str, builder: str, batch_rows: int) -> Iterator[tuple[int, pa.RecordBatch]]:
    """(row number, batch) over one data file read by a `datasets` builder, streaming: no cache written."""
    import datasets

    ds = datasets.load_dataset(builder, data_files=[path], split="train", streaming=True)
    row = 0
    for batch in ds.iter(batch_size=batch_rows):
        rb = pa.RecordBatch.from_pydict(batch)
        yield row, rb
        row += rb.num_rows
