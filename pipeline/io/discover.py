"""Input files as the filesystem sees them: formats and compressions from names, saved HF
dataset folders, whether a file opens, and the fixed folder of a glob. It knows nothing
of the mixture YAML: pipeline/plan/sources.py turns a source's `paths` into files with
errors naming the YAML key.

`**` is expanded here, not by glob.glob: glob follows a symlink to a folder it is already
inside until the OS's symlink limit, so one loop repeats every file forty times and two
loops make the walk exponential (discovery never ended)."""

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
    ctime_ns: int = 0  # its inode's change time (local files): no tool can set it back, as rsync -t does mtime

    def to_dict(self) -> dict:
        """The file as a split names it (plan/sources.file_dict says what of it a spec holds)."""
        d = asdict(self)
        d.pop("ctime_ns")
        return d


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


def expand(pattern: str) -> tuple[list[str], list[tuple[str, str]]]:
    """What glob.glob(pattern, recursive=True) matches, except that `**` never follows a
    symlink into a folder it is already inside: such a loop is skipped and returned as
    (the link, the folder it points at). Other symlinks are followed, as glob does."""
    parts = Path(pattern).parts
    if "**" not in parts:
        return glob.glob(pattern, recursive=True), []
    i = parts.index("**")
    head, rest = (os.path.join(*parts[:i]) if i else ""), parts[i + 1:]
    slash = os.sep if pattern.endswith(os.sep) else ""  # `a/**/`: folders only (Path.parts drops the slash)
    bases = glob.glob(head) if glob.has_magic(head) else [head]
    matches: list[str] = []
    loops: list[tuple[str, str]] = []
    for base in bases:
        if not os.path.isdir(base or os.curdir):
            if not rest and os.path.isfile(base):  # glob's `file/**` is `file/`: the file
                matches.append(os.path.join(base, ""))
            continue
        for d, files in _walk(base, loops):
            if rest:
                found, more = expand(os.path.join(glob.escape(d) if d else "", *rest) + slash)
                matches += found
                loops += more
            else:  # a trailing `**`: `base/`, every folder under it and (without the slash) every file
                matches.append(os.path.join(d, "") if d == base or slash else d)
                matches += [] if slash else [os.path.join(d, f) for f in files]
    return [m for m in dict.fromkeys(matches) if m], list(dict.fromkeys(loops))


def _walk(top: str, loops: list) -> list[tuple[str, list[str]]]:
    """`top` and every folder under it (names starting with '.' left out, as glob does),
    each with its files, following symlinks except into a folder on the way to them."""
    out = []
    stack = [(top, frozenset({os.path.realpath(top or os.curdir)}))]
    while stack:
        d, inside = stack.pop()
        files = []
        out.append((d, files))
        try:
            entries = sorted(os.scandir(d or os.curdir), key=lambda e: e.name)
        except OSError:  # unreadable: glob lists nothing there either
            continue
        for e in entries:
            if e.name.startswith("."):
                continue
            path = os.path.join(d, e.name)
            try:
                is_dir = e.is_dir()
            except OSError:
                is_dir = False
            if not is_dir:
                files.append(e.name)
                continue
            real = os.path.realpath(path)
            if real in inside:
                loops.append((path, real))
                continue
            stack.append((path, inside | {real}))
    return out


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
