"""`inputs.verify: content`: an input file already ingested is known unchanged by its bytes.

By default (mtime) a file is the same as before when its size and modification time are
(plan/sources.fingerprint), and a file replaced by a tool that keeps modification times
(rsync -t, cp -p, tar x) with one of the same size is never read again. In content mode
the fingerprint is the size and the change time (ctime: writing a file sets it, and no tool
can set it back), and each shard of the scan, ids and ingest steps carries its files'
stamps in its spec's `stamp`, which its partial key leaves out (Step.read_keyed). Where a
stamp moved, the shard is not linked by its content key; its task reads its files, digests
their bytes (xxh3-128) and, when the earlier shard of its partial key (the same path, size
and split) recorded the same digest, links that shard's files (engine/cutoff.same_as_before)
instead of parsing. The digest is the shard's `read_key` in its marker. A file whose stamp
did not move is trusted, as in mtime mode.

What it costs: a rerun reads the files whose change time moved (a whole-corpus copy, a
chmod), once per shard of each: xxh3 runs at several GB/s a core, far above parsing.
"""

from __future__ import annotations

import threading

import xxhash

from pipeline.engine.cutoff import same_as_before
from pipeline.io import fs

CHUNK = 8 << 20
_cache: dict[tuple, str] = {}  # (path, size, stamp) -> digest: a file split into shards read once a process
_lock = threading.Lock()


def digest(path: str, stamp=None) -> str:
    """xxh3-128 of a file's bytes (hex), read in chunks; memoised by (path, stamp) when stamped."""
    key = (path, stamp) if stamp is not None else None
    if key is not None:
        with _lock:
            got = _cache.get(key)
        if got is not None:
            return got
    h = xxhash.xxh3_128()
    with fs.open_read(path) as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    d = h.hexdigest()
    if key is not None:
        with _lock:
            if len(_cache) > 4096:
                _cache.clear()
            _cache[key] = d
    return d


def verified(spec: dict, out, paths: list[str]) -> tuple[str | None, dict | None]:
    """(the shard's read key, the stats of its earlier shard linked) in content mode; the read
    key alone when the earlier shard read other bytes (or there is none): compute; (None,
    None) in mtime mode. A file that cannot be read digests as its error (the task then
    quarantines it, as it would have)."""
    if spec.get("verify") != "content":
        return None, None
    stamps = spec.get("stamp") or {}
    h = xxhash.xxh3_128()
    for p in paths:
        try:
            d = digest(p, stamps.get(p))
        except OSError as e:
            d = f"unreadable:{type(e).__name__}"
        h.update(f"{p}\0{d}\0".encode())
    rk = "content:" + h.hexdigest()
    return rk, same_as_before(spec, out, rk)


def recorded(read_key: str | None) -> dict:
    """What a content-verified task adds to its stats: the digest its marker records."""
    return {"read_key": read_key} if read_key is not None else {}
