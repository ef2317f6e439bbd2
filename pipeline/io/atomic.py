"""Atomic file writes: write a temporary name, rename into place, markers last.

A reader never sees a file that looks finished and is not: a killed task leaves only
`*.tmp-<token>` files, which the next attempt ignores and a finished step removes.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

import orjson


def tmp_path(final: Path) -> Path:
    return final.with_name(f"{final.name}.tmp-{uuid.uuid4().hex[:8]}")


def commit(tmp: Path, final: Path) -> None:
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, final)


def write_bytes(final: Path, data: bytes) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path(final)
    with open(tmp, "wb") as f:
        f.write(data)
    commit(tmp, final)


def write_json(final: Path, obj) -> None:
    write_bytes(final, orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")


def read_json(path: Path):
    return orjson.loads(Path(path).read_bytes())


def file_digest(path: Path) -> tuple[int, str]:
    """(bytes, sha256 hex) of a file, streamed."""
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            n += len(chunk)
    return n, h.hexdigest()


def clean_tmp(directory: Path) -> int:
    n = 0
    for p in Path(directory).rglob("*.tmp-*"):
        p.unlink(missing_ok=True)
        n += 1
    return n
