"""One filesystem layer for every read and write: local paths stay `pathlib.Path`, URLs
(`s3://`, `gs://`, `hf://`, `file://`, `memory://`...) become fsspec-backed `UPath`s.

The rest of the code handles both alike: join with `/`, `open()`, `glob()`, `exists()`,
and reads or writes Parquet through `parquet_file`, `read_table`, `parquet_writer` and
`write_table` here. For URLs, reads fetch a shard file in one request (pyarrow's own reader
would make one per footer and column chunk) and writes hand pyarrow fsspec's filesystem
through `pyarrow.fs.FSSpecHandler`. Credentials and endpoints come from the usual environment (`AWS_*`,
`AWS_ENDPOINT_URL`, `GOOGLE_APPLICATION_CREDENTIALS`, `FSSPEC_<PROTOCOL>_<OPTION>`), the
same on every node of a cluster.

Commits: a file is written under a temporary name next to its final one, then renamed (a
local `os.replace` after fsync). On S3 and GCS (`creating`) it goes straight to its final
key, which a PUT or a completed multipart upload fills only whole, and a failed write is
discarded, never committed: one write request, not three (a temporary PUT, a copy, a
delete). Other fsspec stores: a temporary name, then fsspec's `mv`. Markers are written last.

Example:

    d = fs.path("s3://bucket/runs/demo") / "steps"
    fs.write_table(table, d / "part-00000.parquet", compression="zstd")
    fs.read_table(d / "part-00000.parquet", columns=["id"])
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path

import pyarrow.parquet as pq


def is_url(p) -> bool:
    return "://" in str(p)


def path(p) -> Path:
    """A path object for a local path or a URL (an existing path object is returned as is)."""
    if isinstance(p, Path) or hasattr(p, "protocol"):
        return p
    s = str(p)
    if is_url(s):
        from upath import UPath

        u = UPath(s)
        try:
            u.fs  # noqa: B018 -- builds the filesystem now: a missing package is a config error, not a traceback later
        except ImportError as e:
            from pipeline.errors import UsageError

            raise UsageError(f"{s}: {e}; {install_hint(u.protocol)}") from None
        return u
    return Path(s)


EXTRAS = {"s3": "curate[s3]", "s3a": "curate[s3]", "gs": "curate[gcs]", "gcs": "curate[gcs]"}


def install_hint(protocol: str) -> str:
    extra = EXTRAS.get(protocol)
    return f"pip install '{extra}'" if extra else f"install the fsspec package for {protocol}:// (see fsspec's list of implementations)"


def is_local(p) -> bool:
    """A plain local path (pathlib, or a UPath without protocol); `file://` URLs go through fsspec."""
    return not getattr(p, "protocol", "")


def _arrow(p) -> tuple[str, object]:
    """(path, filesystem) in the form pyarrow takes them."""
    p = path(p)
    if is_local(p):
        return str(p), None
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    return p.path, PyFileSystem(FSSpecHandler(p.fs))


def open_read(p, buffering: int = -1):
    """A binary file for reading (local: a plain buffered file; URLs: fsspec's, read ahead)."""
    p = path(p)
    if is_local(p):
        return open(p, "rb", buffering=buffering)
    return p.open("rb", block_size=max(buffering, 8 << 20))


WHOLE_OBJECT = 64 << 20  # remote Parquet files up to this size are fetched in one request


def makedirs(p) -> None:
    """Create a directory (object stores have none: a no-op there, which saves a request per write)."""
    p = path(p)
    if is_local(p) or p.protocol in ("file", "local", "memory"):
        p.mkdir(parents=True, exist_ok=True)


def read_bytes(p) -> bytes:
    p = path(p)
    return p.read_bytes() if is_local(p) else p.fs.cat_file(p.path)  # one GET, no HEAD


def _remote_source(p):
    """A remote Parquet file in few requests: shard files (a few MB) in one GET; larger ones
    through a read-ahead file, so memory stays bounded. (pyarrow's own reader over fsspec
    makes one request per footer and column chunk: ~30 ms each on an object store.)"""
    import pyarrow as pa

    size = p.fs.size(p.path)
    if size <= WHOLE_OBJECT:
        return pa.BufferReader(p.fs.cat_file(p.path))
    return p.fs.open(p.path, "rb", block_size=16 << 20, cache_type="readahead")


FOOTER_READ = 64 << 10  # a Parquet footer's first ranged read: most footers fit; a larger one takes one more


def parquet_metadata(p, size: int | None = None) -> pq.FileMetaData:
    """A Parquet file's footer alone: on an object store one ranged GET of its last 64 KB
    (two for a larger footer), never the object (`size`: the file's, when the caller has it
    from its listing: no HEAD). What planning reads of an input file (its row groups)."""
    p = path(p)
    if is_local(p):
        return pq.read_metadata(str(p))
    import pyarrow as pa

    size = p.fs.size(p.path) if size is None else size
    tail = p.fs.cat_file(p.path, start=max(0, size - FOOTER_READ), end=size) if size >= 12 else b""
    if tail[-4:] != b"PAR1":  # pyarrow's own words for a local file
        raise pa.ArrowInvalid("Parquet magic bytes not found in footer. Either the file is corrupted or this is not a "
                              "parquet file.")
    n = int.from_bytes(tail[-8:-4], "little")
    if n + 8 > len(tail):
        if n + 8 > size:
            raise pa.ArrowInvalid(f"{p}: its footer says {n:,} bytes of metadata, more than the file's {size:,}")
        tail = p.fs.cat_file(p.path, start=size - n - 8, end=size)
    # the footer behind a magic: a file pyarrow reads the metadata of (it reads no row group here)
    return pq.read_metadata(pa.BufferReader(b"PAR1" + tail[-(n + 8):]))


def parquet_file(p) -> pq.ParquetFile:
    p = path(p)
    if is_local(p):
        return pq.ParquetFile(str(p))
    return pq.ParquetFile(_remote_source(p))


def read_table(p, **kw):
    p = path(p)
    if is_local(p):
        if set(kw) <= {"columns"} and p.is_file():  # one file: no dataset layer (its import pulls in pandas, 0.45 s a worker)
            return pq.ParquetFile(str(p)).read(columns=kw.get("columns"))
        return pq.read_table(str(p), **kw)
    if kw.get("filters") is None:  # one file, read whole anyway: one GET
        import pyarrow as pa

        kw.pop("filters", None)
        return pq.read_table(pa.BufferReader(p.fs.cat_file(p.path)), **kw)
    s, fsys = _arrow(p)  # a filtered read of a directory (a dataset): pyarrow lists and filters it
    return pq.read_table(s, filesystem=fsys, **kw)


def parquet_writer(p, schema, **kw) -> pq.ParquetWriter:
    s, fsys = _arrow(p)
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
    final = path(final)
    return final.with_name(f"{final.name}.tmp-{_FENCE[0]}-{uuid.uuid4().hex[:8]}")


_WRITTEN: list[list] = []  # stack of recorders: (final path, digest) of each file committed while one is open


@contextmanager
def recording():
    """Record the digest of every file committed inside (a shard task's outputs, which its
    marker lists so that the shards reading them are keyed by their bytes: engine/reuse.py).
    Yields the list of (final path as a string, digest) it fills."""
    got: list = []
    _WRITTEN.append(got)
    try:
        yield got
    finally:
        _WRITTEN.pop()


def recorded(items) -> None:
    """Add (path, digest) pairs committed elsewhere (a task of this task's) to the open recorder."""
    if _WRITTEN:
        _WRITTEN[-1].extend(tuple(x) for x in items)


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


@contextmanager
def creating(final):
    """A binary file whose bytes land at `final` whole, or not at all if the block raises.
    On S3 and GCS, straight to the final key (on failure fsspec's `discard`: the multipart
    upload aborted, the buffer dropped); elsewhere a temporary name, then `commit`."""
    final = path(final)
    if not is_local(final) and final.protocol in DIRECT:
        f = final.fs.open(final.path, "wb")
        try:
            yield f
        except BaseException:
            try:
                f.discard()
            finally:
                f.closed = True  # never committed, not even by the garbage collector's close()
            raise
        f.close()
        if _WRITTEN:
            _WRITTEN[-1].append((str(final), _remote_digest(final)))
        return
    makedirs(final.parent)
    tmp = tmp_path(final)
    try:
        with tmp.open("wb") as f:
            yield f
        commit(tmp, final)
    except BaseException:  # a write or rename that failed (a store's passing fault): leave no temporary behind
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise


def commit(tmp, final) -> None:
    """Move a finished temporary file to its final name (and record its digest when a
    `recording()` is open: the local file's xxh3-128, read back from the page cache at a few
    GB/s; an object's ETag, one HEAD)."""
    tmp, final = path(tmp), path(final)
    if is_local(final):
        with open(tmp, "rb") as f:
            digest = _local_digest(f) if _WRITTEN else None
            os.fsync(f.fileno())
        os.replace(tmp, final)
    else:
        _copy_fresh(tmp, final)  # a server-side copy: the final key only ever holds a whole object
        _remove_retrying(tmp)
        digest = _remote_digest(final) if _WRITTEN else None
    if _WRITTEN:
        _WRITTEN[-1].append((str(final), digest))


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
    """Write a Parquet file atomically (temporary name, then commit; S3 and GCS: `creating`)."""
    final = path(final)
    if not is_local(final) and final.protocol in DIRECT:
        with creating(final) as f:
            pq.write_table(table, f, **kw)
        return
    makedirs(final.parent)
    tmp = tmp_path(final)
    s, fsys = _arrow(tmp)
    pq.write_table(table, s, filesystem=fsys, **kw)
    commit(tmp, final)


def refresh(p) -> None:
    """Forget cached listings under `p` (fsspec caches them per filesystem): what another
    process wrote since becomes visible. A no-op on local paths."""
    p = path(p)
    if not is_local(p):
        p.fs.invalidate_cache(p.path)


def rmtree(p) -> None:
    p = path(p)
    if _WRITTEN:  # files committed and deleted again (a coordinator's work folder) are not outputs
        pre = str(p).rstrip("/") + "/"
        for got in _WRITTEN:
            got[:] = [x for x in got if not x[0].startswith(pre)]
    if is_local(p):
        shutil.rmtree(p, ignore_errors=True)
    elif p.exists():
        p.fs.rm(p.path, recursive=True)


def join(run_dir, d: str):
    """A step directory as run.json records it: relative to the run directory (local runs
    link their store steps under `steps/`), or an absolute path or URL (a store elsewhere)."""
    if is_url(d) or d.startswith("/"):
        return path(d)
    return path(run_dir) / d


def read_many(fn, items, threads: int = 32):
    """fn(item) for every item, in the items' order, up to `threads` at a time and no more
    than 4 x `threads` results held: a merge reading one small summary per shard waits on
    tens of milliseconds per object-store GET, so it keeps many in flight, not one."""
    items = list(items)
    if len(items) < 2:
        yield from (fn(x) for x in items)
        return
    from concurrent.futures import ThreadPoolExecutor

    window = 4 * threads
    with ThreadPoolExecutor(min(threads, len(items))) as pool:
        for lo in range(0, len(items), window):
            yield from pool.map(fn, items[lo:lo + window])


def copy(src, dst) -> None:
    src, dst = path(src), path(dst)
    makedirs(dst.parent)
    if is_local(src) and is_local(dst):
        shutil.copy2(src, dst)
    elif not is_local(src) and not is_local(dst) and src.fs == dst.fs:  # one object store: a server-side copy, no bytes through here
        src.fs.cp_file(src.path, dst.path)  # not `copy`: it expands the paths first (a LIST or two a file)
    else:
        with src.open("rb") as i, dst.open("wb") as o:
            shutil.copyfileobj(i, o, 1 << 20)



def link_or_copy(src, dst) -> bool:
    """`dst` as the same bytes as `src`: a hard link where both are local and on one
    filesystem (True), else a copy (False)."""
    if is_local(src) and is_local(dst):
        try:
            os.link(path(src), path(dst))
            return True
        except OSError:  # another filesystem, or one without hard links
            pass
    copy(src, dst)
    return False

def replace_dir(tmp, dest) -> None:
    """Put a finished directory in place of `dest` (local: two renames; object stores have
    no directories, so: delete the old prefix, then move the new one). Locally the old
    directory is renamed aside to a name of this call's own (`<dest>.old-<token>`), so a
    `<dest>.old` that is someone's backup is never touched; it is put back if the second
    rename fails, and deleted once the new directory is in place."""
    tmp, dest = path(tmp), path(dest)
    if is_local(dest):
        old = dest.with_name(f"{dest.name}.old-{uuid.uuid4().hex[:12]}")
        had = dest.exists()
        if had:
            os.rename(dest, old)  # rename, not replace: never onto an existing name
        try:
            os.replace(tmp, dest)
        except BaseException:
            if had:
                os.rename(old, dest)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        rmtree(dest)
        root = tmp.path.rstrip("/")
        for f in tmp.fs.find(root):
            target = dest.path.rstrip("/") + f[len(root):]
            dest.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)  # file://; a no-op on object stores
            tmp.fs.mv(f, target)
        rmtree(tmp)


@contextmanager
def local_file(p):
    """A local path holding `p`'s bytes (fastText and tokenizers only open local files)."""
    p = path(p)
    if is_local(p):
        yield p
        return
    import tempfile

    with tempfile.TemporaryDirectory(prefix="curate-") as d:
        local = Path(d) / p.name
        copy(p, local)
        yield local
