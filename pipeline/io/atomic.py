"""Atomic file writes: write a temporary name, rename into place, markers last.

A reader never sees a file that looks finished and is not: a killed task leaves only
`*.tmp-<fence>-<token>` files, which the next attempt ignores and a finished step removes
(its own fence's only: engine/lease.py). Works on
local paths and on fsspec URLs alike (see `pipeline.io.fs`).
"""

from __future__ import annotations

import hashlib

import orjson

from pipeline.io import fs
from pipeline.io.fs import commit, tmp_path  # noqa: F401 -- for the writers that stream to a temporary name

__all__ = ["commit", "tmp_path"]


def write_bytes(final, data: bytes) -> None:
    write_stream(final, [data])


def write_stream(final, chunks) -> None:
    """Write `final` atomically from an iterable of byte chunks (so a large file need not be
    built in memory): `fs.creating`, so on any failure nothing is committed and no
    temporary stays."""
    with fs.creating(final) as f:
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
    with fs.path(path).open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            n += len(chunk)
    return n, h.hexdigest()


def clean_tmp(directory, fence: str | None = None) -> int:
    """Remove the temporary files a writer left under `directory`: only those of `fence` (a
    lease generation's, see fs.set_fence) when given, so a writer never deletes another's;
    every one when None (nothing else writes there: a step no lease guards). Directories are
    never touched, whatever their name."""
    n = 0
    for p in fs.path(directory).rglob("*.tmp-*"):
        m = fs.TMP.search(p.name)
        if m is None or (fence is not None and m.group(1) != fence) or not p.is_file():
            continue
        p.unlink(missing_ok=True)
        n += 1
    return n


def copy_tree(pairs: list, dest) -> None:
    """`dest` on an object store as the given (file, relative name) pairs: every file copied
    once to its final name (a server-side copy within one store: a HEAD and a copy request,
    no bytes through this process), 32 at a time; then the files `dest` held before and no
    longer names are deleted, in batches. A reader during the copies may see old and new
    files side by side, as it might during any object-store folder swap; the run's manifest,
    written after, lists exactly the new ones with their digests."""
    dest = fs.path(dest)
    root = dest.path.rstrip("/")
    names = {str(rel) for _, rel in pairs}
    try:
        before = [f for f in dest.fs.find(root) if f[len(root) + 1:] not in names]
    except FileNotFoundError:
        before = []
    for _ in fs.read_many(lambda pr: fs.copy(pr[0], dest / pr[1]), pairs):
        pass
    if before:
        dest.fs.rm(before)  # s3fs: one DeleteObjects request per 1,000 keys
    dest.fs.invalidate_cache(root)


def link_tree(pairs: list, dest) -> None:
    """Replace the folder `dest` with hard links (copies across filesystems and on object
    stores) to the given (file, relative name) pairs, in one rename. On an object store,
    which has no rename (a move is a copy and a delete) and no directory to swap, each file
    is copied once, straight to its name, many at a time (copy_tree)."""
    if not fs.is_local(dest):
        return copy_tree(pairs, dest)
    tmp = dest.with_name(dest.name + ".tmp")
    fs.rmtree(tmp)
    fs.makedirs(tmp)
    for src, rel in pairs:
        target = tmp / rel
        fs.makedirs(target.parent)
        fs.link_or_copy(src, target)
    fs.replace_dir(tmp, dest)
