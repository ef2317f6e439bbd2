"""Atomic file writes: a file is whole at its final name or not there at all; markers last.

Locally a file is written under a temporary name next to its final one
(`<name>.tmp-<fence>-<token>`), fsynced, then renamed (`os.replace`); a killed task leaves
only such files, which the next attempt ignores and a finished step removes (its own
fence's only: engine/lease.py). On S3 and GCS (`Out`, `creating`) a file goes straight to
its final key, which a PUT or a completed multipart upload fills only whole, and a failed
write is discarded, never committed: one write request, not three (a temporary PUT, a copy,
a delete: bench/commits.py). Other fsspec stores: a temporary name, then a copy and a delete.
Every commit inside `fs.recording()` notes the file's digest (a shard's marker lists them:
engine/reuse.py).
"""

from __future__ import annotations

import contextlib

import hashlib
import os
import re
import uuid
from contextlib import contextmanager
from pathlib import Path

import orjson
import pyarrow.parquet as pq

from pipeline.io import fs


def parquet_writer(p, schema, **kw) -> pq.ParquetWriter:
    s, fsys = fs.arrow_target(p)
    return pq.ParquetWriter(s, schema, filesystem=fsys, **kw)


_FENCE = ["x"]  # the current writer's fence token (engine/lease.py): set per shard task
TMP = re.compile(r"\.tmp-(?:([A-Za-z0-9]+)-)?[0-9a-f]{8}$")  # <name>.tmp-<fence>-<token>; old names had no fence


def set_fence(token: str) -> str:
    """Name this process's temporary files after `token` (a lease generation's fence), so a
    cleanup removes only the files of its own writer; returns the previous token."""
    if not re.fullmatch(r"[A-Za-z0-9]+", token):
        raise ValueError(f"fence token {token!r}: letters and digits only")
    prev, _FENCE[0] = _FENCE[0], token
    return prev


def tmp_path(final) -> Path:
    """`<final>.tmp-<fence>-<random>`: where a file is written before `commit` renames it."""
    final = fs.path(final)
    return final.with_name(f"{final.name}.tmp-{_FENCE[0]}-{uuid.uuid4().hex[:8]}")


def digest_bytes(data: bytes) -> str:
    import xxhash

    return xxhash.xxh3_128_hexdigest(data)


def _local_digest(f) -> str:
    import xxhash

    h = xxhash.xxh3_128()
    while chunk := f.read(1 << 22):
        h.update(chunk)
    return h.hexdigest()


DIRECT = ("s3", "s3a", "gs", "gcs")  # stores where an object appears only whole (a PUT, a finished multipart upload)


class Out:
    """A file being written to `final`, then `commit()`ed or `discard()`ed: locally under a
    temporary name renamed at the commit; on S3 and GCS straight to the final key, which a
    PUT or a completed multipart upload fills only whole (the discard is fsspec's: the
    multipart upload aborted, the buffer dropped). `open()` gives a binary file; `sink` and
    `filesystem` are what a pyarrow writer takes."""

    def __init__(self, final):
        self.final, self.file = fs.path(final), None
        self.direct = not fs.is_local(self.final) and self.final.protocol in DIRECT
        if self.direct:
            self.file = self.sink = self.final.fs.open(self.final.path, "wb")
            self.filesystem = None
        else:
            fs.makedirs(self.final.parent)
            self.tmp = tmp_path(self.final)
            self.sink, self.filesystem = fs.arrow_target(self.tmp)

    def parquet(self, schema, **kw) -> pq.ParquetWriter:
        return pq.ParquetWriter(self.sink, schema, filesystem=self.filesystem, **kw)

    def open(self):
        if self.file is None:
            self.file = self.tmp.open("wb")
        return self.file

    def commit(self) -> None:
        if self.direct:
            self.file.close()
            if fs.recording_open():
                fs.record(self.final, _remote_digest(self.final))
            return
        if self.file is not None:
            self.file.close()
        commit(self.tmp, self.final)

    def discard(self) -> None:
        """Nothing at `final` from this writer, no temporary left (a store's passing fault included)."""
        try:
            if self.direct:
                try:
                    self.file.discard()
                finally:
                    self.file.closed = True  # never committed, not even by the garbage collector's close()
                return
            if self.file is not None:
                self.file.close()
            self.tmp.unlink(missing_ok=True)
        except OSError:
            pass


@contextmanager
def creating(final):
    """A binary file whose bytes land at `final` whole, or not at all if the block raises (`Out`)."""
    out = Out(final)
    f = out.open()
    try:
        yield f
    except BaseException:
        out.discard()
        raise
    try:
        out.commit()
    except BaseException:  # a rename or upload that failed: no temporary behind
        out.discard()
        raise


# CURATE_FSYNC=0: no fsync before a local rename (test suites and scratch stores: a task killed
# still leaves a whole file or none, the page cache holds what it wrote; a machine that loses
# power may not). Read once, at import.
FSYNC = os.environ.get("CURATE_FSYNC", "1") != "0"


def commit(tmp, final) -> None:
    """Move a finished temporary file to its final name (and record its digest when a
    `recording()` is open: the local file's xxh3-128, read back from the page cache at a few
    GB/s; an object's ETag, one HEAD)."""
    tmp, final = fs.path(tmp), fs.path(final)
    if fs.is_local(final):
        with open(tmp, "rb") as f:
            digest = _local_digest(f) if fs.recording_open() else None
            if FSYNC:
                os.fsync(f.fileno())
        os.replace(tmp, final)
    else:
        _copy_fresh(tmp, final)  # a server-side copy: the final key only ever holds a whole object
        _remove_retrying(tmp)
        digest = _remote_digest(final) if fs.recording_open() else None
    if fs.recording_open():
        fs.record(final, digest)


def _remote_digest(final) -> str:
    """An object's content tag: its ETag (an MD5 of the bytes, or of the parts' MD5s: the same
    bytes written the same way give the same tag) with its size, else a hash of its bytes."""
    info = final.fs.info(final.path)
    tag = info.get("ETag") or info.get("etag") or info.get("md5")
    if tag:
        return f"etag:{str(tag).strip(chr(34))}:{info.get('size')}"
    return digest_bytes(final.fs.cat_file(final.path))


def _copy_fresh(tmp, final) -> None:
    """Copy `tmp` to `final` past the client's listing cache. The copy looks the source up in
    the cache of its folder's listing, which may predate the temporary file: a listing that an
    earlier request left, or that another thread of this process (a lease's heartbeat) made
    between our write and the copy. The copy would then report the new file missing; forget
    the listing and copy again, and only a file still missing after that is an error."""
    for attempt in range(4):
        final.fs.invalidate_cache(tmp.path)
        try:
            final.fs.copy(tmp.path, final.path)
            return
        except FileNotFoundError:
            if attempt == 3:
                raise


def _remove_retrying(tmp) -> None:
    """Delete a committed temporary object, retrying transient faults: a delete that failed
    once (a throttled or reset request) would otherwise leave the object behind, since the
    caller's retry writes a new temporary name."""
    import time

    from pipeline.io.faults import transient

    for attempt in range(5):
        try:
            tmp.fs.rm_file(tmp.path)
            return
        except FileNotFoundError:
            return
        except Exception as e:  # noqa: BLE001 -- retried only when transient
            if attempt == 4 or not transient(e):
                raise
            time.sleep(0.1 * 2 ** attempt)


def write_table(table, final, **kw) -> None:
    """Write a Parquet file atomically (`Out`)."""
    out = Out(final)
    try:
        pq.write_table(table, out.sink, filesystem=out.filesystem, **kw)
        out.commit()
    except BaseException:
        out.discard()
        raise


def write_bytes(final, data: bytes) -> None:
    write_stream(final, [data])


def write_stream(final, chunks) -> None:
    """Write `final` atomically from an iterable of byte chunks (so a large file need not be
    built in memory): `creating`, so on any failure nothing is committed and no
    temporary stays."""
    with creating(final) as f:
        for chunk in chunks:
            f.write(chunk)


def write_json(final, obj) -> None:
    write_bytes(final, orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")


def read_json(path):
    return orjson.loads(fs.read_bytes(path))


def file_digest(path) -> tuple[int, str]:
    """(bytes, sha256 hex) of a file, streamed."""
    h = hashlib.sha256()
    n = 0
    with fs.open_read(path) as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            n += len(chunk)
    return n, h.hexdigest()


def clean_tmp(directory, fence: str | None = None) -> int:
    """Remove the temporary files a writer left under `directory`: only those of `fence` (a
    lease generation's, see set_fence) when given, so a writer never deletes another's;
    every one when None (nothing else writes there: a step no lease guards). Directories are
    never touched, whatever their name."""
    n = 0
    for p in fs.path(directory).rglob("*.tmp-*"):
        m = TMP.search(p.name)
        if m is None or (fence is not None and m.group(1) != fence) or not p.is_file():
            continue
        p.unlink(missing_ok=True)
        n += 1
    return n


def copy_tree(pairs: list, dest) -> list[int]:
    """`dest` on an object store as the given (file, relative name) pairs: every file copied
    once to its final name (a server-side copy within one store: a HEAD and a copy request,
    no bytes through this process), 32 at a time; then the files `dest` held before and no
    longer names are deleted, in batches. A reader during the copies may see old and new
    files side by side, as it might during any object-store folder swap; the run's manifest,
    written after, lists exactly the new ones with their digests. Past COPY_GROUP files inside
    `copying(mapper)`, the copies are the mapper's tasks. Returns the pids that copied."""
    dest = fs.path(dest)
    root = dest.path.rstrip("/")
    names = {str(rel) for _, rel in pairs}
    try:
        before = [f for f in dest.fs.find(root) if f[len(root) + 1:] not in names]
    except FileNotFoundError:
        before = []
    mapper = _COPIERS[-1] if _COPIERS else None
    if mapper is not None and len(pairs) > COPY_GROUP:  # tasks of COPY_GROUP files each, not the driver's threads
        calls = [([(str(a), str(b)) for a, b in pairs[i:i + COPY_GROUP]], str(dest)) for i in range(0, len(pairs), COPY_GROUP)]
        pids = mapper(copy_group, calls)
    else:
        pids = [copy_group(pairs, dest)]
    if before:
        dest.fs.rm(before)  # s3fs: one DeleteObjects request per 1,000 keys
    dest.fs.invalidate_cache(root)
    return pids


COPY_GROUP = 2048  # files a publishing task copies on an object store (server-side, 32 at a time)
_COPIERS: list = []  # mapper(fn, calls) -> results: tasks that run the copies (`copying`), innermost last


def copy_group(pairs: list, dest) -> int:
    """Copy (file, relative name) pairs under `dest`, 32 at a time: a publishing task (or the
    caller's threads below COPY_GROUP files). Returns the process's pid (which ran it)."""
    dest = fs.path(dest)
    for _ in fs.read_many(lambda pr: fs.copy(pr[0], dest / pr[1]), pairs):
        pass
    return os.getpid()


@contextlib.contextmanager
def copying(mapper):
    """Inside the block, a folder published to an object store past COPY_GROUP files is copied
    by `mapper(copy_group, calls)`'s tasks (pipeline/steps/rounds.py fan_out: Ray tasks when
    Ray is up), not by this process's threads: at 2x10^7 files, the driver's 32 copies at a
    time would take a day."""
    _COPIERS.append(mapper)
    try:
        yield
    finally:
        _COPIERS.remove(mapper)


_LINKED: list[set] = []  # folders link_tree wrote while `linked_trees()` is open


@contextlib.contextmanager
def linked_trees():
    """The folders `link_tree` writes inside the block (a set, filled as they are written)."""
    got: set = set()
    _LINKED.append(got)
    try:
        yield got
    finally:
        _LINKED.remove(got)


def link_tree(pairs: list, dest) -> list[int] | None:
    """Replace the folder `dest` with hard links (copies across filesystems and on object
    stores) to the given (file, relative name) pairs, in one rename. On an object store,
    which has no rename (a move is a copy and a delete) and no directory to swap, each file
    is copied once, straight to its name, many at a time (copy_tree)."""
    for got in _LINKED:
        got.add(str(dest))
    if not fs.is_local(dest):
        return copy_tree(pairs, dest)  # the ids of the processes that copied (copy_tree)
    tmp = dest.with_name(dest.name + ".tmp")
    fs.rmtree(tmp)
    fs.makedirs(tmp)
    for src, rel in pairs:
        target = tmp / rel
        fs.makedirs(target.parent)
        fs.link_or_copy(src, target)
    fs.replace_dir(tmp, dest)
    return None
