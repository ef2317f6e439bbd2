"""Input files as the filesystem sees them: formats and compressions from names, saved HF
dataset folders, whether a file opens, and the fixed folder of a glob. It knows nothing
of the mixture YAML: pipeline/plan/sources.py turns a source's `paths` into files with
errors naming the YAML key."""

from __future__ import annotations

import glob
import os
from dataclasses import asdict, dataclass
from pathlib import Path


JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
WARC_SUFFIXES = (".warc", ".wet")
HTML_SUFFIXES = (".html", ".htm", ".xhtml")
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}


@dataclass(frozen=True)
class InputFile:
    path: str  # absolute
    rel: str  # relative to the pattern's fixed prefix: stable provenance in source_id
    format: str  # jsonl | parquet | hf | warc | html
    compression: str | None
    size: int
    mtime_ns: int
    unreadable: str | None = None  # why it cannot be opened (on_bad_record: quarantine sets it aside whole)

    def to_dict(self) -> dict:
        return asdict(self)


def is_hf_dir(p: Path) -> bool:
    return p.is_dir() and any((p / n).exists() for n in ("dataset_info.json", "state.json", "dataset_dict.json"))


def infer_format(p: Path) -> tuple[str | None, str | None]:
    """(format, compression) of a local path: a saved HF dataset directory, or what its name says."""
    if is_hf_dir(p):
        return "hf", None
    return format_from_name(p.name)


def format_from_name(name: str) -> tuple[str | None, str | None]:
    """(format, compression) from a file name alone, or (None, None) when it says nothing
    (no filesystem access: for URLs, example files, names listed in a directory)."""
    name = name.lower()
    compression = None
    for suf, comp in COMPRESSIONS.items():
        if name.endswith(suf):
            compression, name = comp, name[: -len(suf)]
            break
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl", compression
    if name.endswith(".parquet"):
        return "parquet", compression
    if name.endswith(WARC_SUFFIXES):
        return "warc", compression
    if name.endswith(HTML_SUFFIXES):
        return "html", compression
    return None, compression


def open_error(p: Path) -> str | None:
    """Why a local input cannot be opened (permissions), or None. Opening is the only true
    test: access(2) ignores capabilities and ACLs."""
    try:
        if p.is_dir():
            os.listdir(p)
        else:
            with open(p, "rb"):
                pass
    except OSError as e:
        return e.strerror or type(e).__name__
    return None


def fixed_prefix(pattern: str) -> str:
    """The folder a match's name is made relative to: the part of a glob before its first
    wildcard, or a plain path's parent (so a file or directory keeps its own name)."""
    if not glob.has_magic(pattern):
        return str(Path(pattern).parent)
    fixed = []
    for part in Path(pattern).parts:
        if glob.has_magic(part):
            break
        fixed.append(part)
    return str(Path(*fixed)) if fixed else "."
