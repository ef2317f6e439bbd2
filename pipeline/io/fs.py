"""One filesystem layer for every read and write: local paths stay `pathlib.Path`, URLs
(`s3://`, `gs://`, `hf://`, `file://`, `memory://`...) become fsspec-backed `UPath`s.

The rest of the code handles both alike: join with `/`, `open()`, `glob()`, `exists()`,
and reads or writes Parquet through `parquet_file`, `read_table`, `parquet_writer` and
`write_table` here. For URLs, reads fetch a shard file in one request (pyarrow's own reader
would make one per footer and column chunk) and writes hand pyarrow fsspec's filesystem
through `pyarrow.fs.FSSpecHandler`. Credentials and endpoints come from the usual environment (`AWS_*`,
`AWS_ENDPOINT_URL`, `GOOGLE_APPLICATION_CREDENTIALS`, `FSSPEC_<PROTOCOL>_<OPTION>`), the
same on every node of a cluster.

Writes that must be whole at their final name (every output) go through `pipeline.io.atomic`.

Example:

    d = fs.path("s3://bucket/runs/demo") / "steps"
    atomic.write_table(table, d / "part-00000.parquet", compression="zstd")
    fs.read_table(d / "part-00000.parquet", columns=["id"])
"""

from __future__ import annotations

import io
import os
import re
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import cast

import orjson
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
        return cast(Path, u)  # a UPath: the Path API over its filesystem
    return Path(s)


EXTRAS = {"s3": "curate[s3]", "s3a": "curate[s3]", "gs": "curate[gcs]", "gcs": "curate[gcs]"}


def install_hint(protocol: str) -> str:
    extra = EXTRAS.get(protocol)
    return f"pip install '{extra}'" if extra else f"install the fsspec package for {protocol}:// (see fsspec's list of implementations)"


def is_local(p) -> bool:
    """A plain local path (pathlib, or a UPath without protocol); `file://` URLs go through fsspec."""
    return not getattr(p, "protocol", "")


def arrow_target(p) -> tuple[str, object]:
    """(path, filesystem) in the form pyarrow takes them."""
    p = path(p)
    if is_local(p):
        return str(p), None
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    return p.path, PyFileSystem(FSSpecHandler(p.fs))


def open_read(p, buffering: int = -1):
    """A binary file for reading (local: a plain buffered file; URLs: fsspec's, read ahead,
    through a reference where the object is another's: `read_through`)."""
    p = path(p)
    if is_local(p):
        return open(p, "rb", buffering=buffering)
    return read_through(lambda q: q.open("rb", block_size=max(buffering, 8 << 20)), p)


WHOLE_OBJECT = 64 << 20  # remote Parquet files up to this size are fetched in one request


def makedirs(p) -> None:
    """Create a directory (object stores have none: a no-op there, which saves a request per write)."""
    p = path(p)
    if is_local(p) or p.protocol in ("file", "local", "memory"):
        p.mkdir(parents=True, exist_ok=True)


# ---- references: a reused shard's files on an object store ----------------------------------------
# A shard reused from an earlier step folder on an object store is not copied (at 10^7 reused shards a
# dump's worth of server-side copies took a day and doubled the storage): the new folder's marker lists,
# per file, the object that holds its bytes (`refs`: relative name -> URL), and the files are not
# written. A read of such a name finds no object and follows the reference (`read_through`): the
# shard's marker is read once per process. Local stores hard-link instead, and have no references.
_SHARD = re.compile(r"part-(\d{5})")
_REFS: dict[str, dict] = {}  # a shard marker's URL -> its refs, per process (markers are written once)


def ref_target(p):
    """The object a step folder's file refers to (its shard marker's `refs`), or None: `p`
    is not in a step folder of an object store, or its shard holds it itself."""
    p = path(p)
    if is_local(p):
        return None
    s = str(p)
    head, sep, tail = s.rpartition("/steps/")
    if not sep or "/" not in tail:
        return None
    folder, rel = tail.split("/", 1)
    found = _SHARD.findall(rel.rsplit("/", 1)[-1])
    marker = f"{head}/steps/{folder}/_markers/part-{int(found[0]) if found else 0:05d}.json"
    if marker not in _REFS:
        try:
            _REFS[marker] = orjson.loads(_cat(path(marker))).get("refs") or {}
        except (FileNotFoundError, ValueError):
            return None  # no marker yet (a shard not done): asked again later, not remembered
    target = _REFS[marker].get(rel)
    return path(target) if target else None


def read_through(fn, p, *args, **kw):
    """fn(p, ...), or, when `p` names no object but a reference (`ref_target`), fn(its target, ...)."""
    try:
        return fn(p, *args, **kw)
    except FileNotFoundError:
        t = ref_target(p)
        if t is None:
            raise
        return fn(t, *args, **kw)


def read_bytes(p) -> bytes:
    p = path(p)
    return p.read_bytes() if is_local(p) else read_through(_cat, p)


def _cat(p, end: int | None = None) -> bytes:
    """A remote object's bytes (its first `end`), in one ranged GET: s3fs asks the size (a
    HEAD) before a whole-object GET, to split a large one into parts; a range never does.
    An empty object refuses a range: read whole."""
    try:
        return p.fs.cat_file(p.path, start=0, end=end)
    except FileNotFoundError:
        raise
    except (OSError, ValueError):  # 416 InvalidRange: the object is empty
        return p.fs.cat_file(p.path)


def _remote_source(p):
    """A remote Parquet file in few requests: shard files (a few MB) in one GET; larger ones
    through a read-ahead file, so memory stays bounded. (pyarrow's own reader over fsspec
    makes one request per footer and column chunk: ~30 ms each on an object store.)"""
    import pyarrow as pa

    try:
        head = _cat(p, WHOLE_OBJECT)
    except FileNotFoundError:  # a reference (a reused shard's file): its object
        if (t := ref_target(p)) is None:
            raise
        p, head = t, _cat(t, WHOLE_OBJECT)
    if len(head) < WHOLE_OBJECT:  # the whole object: no HEAD asked its size
        return pa.BufferReader(head)
    return pa.PythonFile(_Prefixed(head, p), mode="r")  # larger: the rest read ahead, the first 64 MB not again


class _Prefixed(io.RawIOBase):
    """A remote file whose first bytes are at hand: reads below them are served from memory,
    the rest from fsspec's read-ahead file (opened at the first such read: one HEAD)."""

    def __init__(self, head: bytes, p):
        self.head, self.p, self.pos, self._f = head, p, 0, None

    def _file(self):
        if self._f is None:
            self._f = self.p.fs.open(self.p.path, "rb", block_size=16 << 20, cache_type="readahead")
        return self._f

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self._file().size}[whence]
        self.pos = base + offset
        return self.pos

    def readinto(self, b) -> int:
        n = len(b)
        got = self.head[self.pos:self.pos + n] if self.pos < len(self.head) else b""
        if len(got) < n:  # past the head: the rest from the file
            f = self._file()
            f.seek(self.pos + len(got))
            got += f.read(n - len(got))
        b[:len(got)] = got
        self.pos += len(got)
        return len(got)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
        super().close()


FOOTER_READ = 64 << 10  # a Parquet footer's first ranged read: most footers fit; a larger one takes one more


def parquet_metadata(p, size: int | None = None) -> pq.FileMetaData:
    """A Parquet file's footer alone: on an object store one GET of its last 64 KB (a
    suffix range: no HEAD for the size; two GETs for a larger footer), never the object.
    What planning reads of an input file (its row groups), and a step of a file's schema."""
    p = path(p)
    if is_local(p):
        return pq.read_metadata(str(p))
    return read_through(_remote_metadata, p, size)


def _remote_metadata(p, size: int | None) -> pq.FileMetaData:
    import pyarrow as pa

    if size is not None and size < 12:
        tail = b""
    elif size is None:
        tail = p.fs.cat_file(p.path, start=-FOOTER_READ)
    else:
        tail = p.fs.cat_file(p.path, start=max(0, size - FOOTER_READ), end=size)
    if tail[-4:] != b"PAR1":  # pyarrow's own words for a local file
        raise pa.ArrowInvalid("Parquet magic bytes not found in footer. Either the file is corrupted or this is not a "
                              "parquet file.")
    n = int.from_bytes(tail[-8:-4], "little")
    if n + 8 > len(tail):
        whole = size if size is not None else len(tail) if len(tail) < FOOTER_READ else None  # a short tail: the file
        if whole is not None and n + 8 > whole:
            raise pa.ArrowInvalid(f"{p}: its footer says {n:,} bytes of metadata, more than the file's {whole:,}")
        tail = p.fs.cat_file(p.path, start=-(n + 8))
    # the footer behind a magic: a file pyarrow reads the metadata of (it reads no row group here)
    return pq.read_metadata(pa.BufferReader(b"PAR1" + tail[-(n + 8):]))


def parquet_schema(p):
    """A Parquet file's Arrow schema (its metadata included) from its footer alone
    (`parquet_metadata`): a step that needs a file's column names reads no row of it."""
    p = path(p)
    if is_local(p):
        return pq.read_schema(str(p))
    import pyarrow as pa

    md = parquet_metadata(p)
    sink = pa.BufferOutputStream()  # the footer as a file pyarrow opens: its Arrow schema as written
    md.write_metadata_file(sink)
    return pq.read_schema(pa.BufferReader(sink.getvalue()))


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
        return pq.read_table(pa.BufferReader(read_bytes(p)), **kw)

    def filtered(q):  # a filtered read of a file or a directory (a dataset): pyarrow lists and filters it
        s, fsys = arrow_target(q)
        return pq.read_table(s, filesystem=fsys, **kw)
    return read_through(filtered, p)


_WRITTEN: list[list | None] = []  # stack of recorders (None: `unrecorded`): (final path, digest) of each file committed while one is open


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


@contextmanager
def unrecorded():
    """Commits inside are no task's output (a cache of Curate's own, written by the first task
    of a process that needs it): not recorded. A recorded file outside the task's folder would
    make its shard unusable for reuse (engine/task.py)."""
    _WRITTEN.append(None)
    try:
        yield
    finally:
        _WRITTEN.pop()


def recording_open() -> bool:
    """Whether a `recording()` is open (atomic.py then digests what it commits)."""
    return bool(_WRITTEN) and _WRITTEN[-1] is not None


def record(final, digest: str) -> None:
    """Note one committed file in the open recorder (atomic.py's commits)."""
    if recording_open():
        _WRITTEN[-1].append((str(final), digest))


def recorded(items) -> None:
    """Add (path, digest) pairs committed elsewhere (a task of this task's) to the open recorder;
    (path, digest, target): a reference (`link_all` on an object store), not a file."""
    if recording_open():
        _WRITTEN[-1].extend(tuple(x) for x in items)


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
            if got is not None:
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
    if not is_local(src) and (t := ref_target(src)) is not None and not src.exists():
        src = t  # a reference: the object it names
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

def link_all(pairs) -> dict[str, str] | None:
    """Every (src, dst) made to hold src's bytes, all or nothing: None when a source is gone
    (FileNotFoundError), after removing the ones made; an error raised after the same. On a
    local disk each is a hard link (`link_or_copy`; a `dst` left by a stopped run, the same
    bytes, is replaced): returns {}. On an object store nothing is written: returns
    {dst: the object holding src's bytes} (src's own reference, if it is one), the
    references its shard's marker lists (`ref_target`), each source checked to exist."""
    pairs = list(pairs)
    if pairs and not is_local(pairs[0][1]):
        refs = {}
        for src, dst in pairs:
            src = path(src)
            t = ref_target(src)
            target = t if t is not None and not src.exists() else src
            if not target.exists():
                return None
            refs[str(dst)] = str(target)
        return refs
    done = []
    try:
        for src, dst in pairs:
            makedirs(path(dst).parent)
            if is_local(dst) and os.path.lexists(dst):
                os.unlink(dst)
            link_or_copy(src, dst)
            done.append(dst)
    except BaseException as e:
        for d in done:
            try:
                d = path(d)
                d.unlink() if is_local(d) else d.fs.rm_file(d.path)
            except (OSError, ValueError):
                pass
        if isinstance(e, FileNotFoundError):
            return None
        raise
    return {}


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
