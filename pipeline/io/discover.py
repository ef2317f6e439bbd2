"""From a source's `paths` (files, globs, directories) to a sorted list of input files.

Each file gets a fingerprint (size, mtime) that enters the ingest step's hash, so an
edited or replaced input file re-runs ingest; content is not read here. Formats are
inferred from file names when `format` is omitted. A path that matches nothing is an
error naming the YAML key.
"""

from __future__ import annotations

import glob
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.config import LoadedMixture, SourceSpec
from pipeline.errors import UsageError

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


def _is_hf_dir(p: Path) -> bool:
    return p.is_dir() and any((p / n).exists() for n in ("dataset_info.json", "state.json", "dataset_dict.json"))


def infer_format(p: Path) -> tuple[str | None, str | None]:
    """(format, compression) of a local path: a saved HF dataset directory, or what its name says."""
    if _is_hf_dir(p):
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


def _open_error(p: Path) -> str | None:
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


def _fixed_prefix(pattern: str) -> str:
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


def source_files(lm: LoadedMixture, sname: str, spec: SourceSpec) -> tuple[list[InputFile], list[str]]:
    """Files of one source and a list of problems (each a located message)."""
    files: dict[str, InputFile] = {}
    problems: list[str] = []
    for i, pattern in enumerate(spec.paths):
        where = lm.where(("sources", sname, "paths", i))
        if "://" in pattern:
            _remote_matches(pattern, where, sname, spec, files, problems)
            continue
        full = pattern if os.path.isabs(pattern) else str(lm.base_dir / pattern)
        matches = sorted(glob.glob(full, recursive=True))
        if not matches:
            hint = ("; this runs inside a Ray job, whose working directory is an uploaded copy without git-ignored "
                    "data: give an absolute path on a shared filesystem or a URL (s3://...)"
                    if "working_dir_files" in full else "")
            problems.append(f"{where}: {pattern!r} matches no file (looked in {Path(full).parent}){hint}")
            continue
        base = _fixed_prefix(full)
        for m in matches:
            p = Path(m)
            fmt, comp = infer_format(p)
            fmt = "hf" if spec.hf_builder else (spec.format or fmt)
            if p.is_dir() and (fmt != "hf" or spec.hf_builder):
                inside = sorted(c.name for c in p.iterdir())
                data = [n for n in inside if format_from_name(n)[0]]
                suffix = "".join(Path(data[0]).suffixes) if data else ".jsonl.zst"
                hint = f"; it holds {', '.join(inside[:5])}" if inside else " (empty)"
                problems.append(
                    f"{where}: {m} is a directory{hint}; use a glob such as {pattern.rstrip('/')}/*{suffix}"
                    " (or format: hf for a saved HF dataset)"
                )
                continue
            if fmt is None:
                problems.append(
                    f"{where}: cannot tell the format of {m}; name it .jsonl[.gz|.zst], .parquet, .warc[.gz] or .html, "
                    f"or set sources.{sname}.format"
                )
                continue
            if spec.extract is not None and spec.html_field is None and fmt not in ("warc", "html"):
                problems.append(f"{where}: {m} is {fmt}, but sources.{sname}.extract needs HTML: set "
                                f"sources.{sname}.html_field to the field holding it")
                continue
            if fmt == "hf" and not spec.hf_builder and not _is_hf_dir(p):
                problems.append(f"{where}: {m} is not a saved HF dataset directory (no dataset_info.json or state.json)")
                continue
            unreadable = _open_error(p)
            if unreadable and spec.on_bad_record == "fail":
                problems.append(f"{where}: {m} cannot be read ({unreadable}); give the user running curate read access "
                                f"(e.g. chmod a+r), or set sources.{sname}.on_bad_record: quarantine to set the file aside")
                continue
            st = p.stat()
            rel = os.path.relpath(m, base)
            files[str(p.resolve())] = InputFile(str(p.resolve()), rel, fmt, comp, st.st_size, st.st_mtime_ns, unreadable)
    return [files[k] for k in sorted(files)], problems


def _remote_matches(pattern: str, where: str, sname: str, spec: SourceSpec, files: dict, problems: list) -> None:
    """A URL pattern (s3://bucket/crawl/*.jsonl.zst, file:///data/x.parquet ...) through fsspec.
    The fingerprint is the size and the store's modification time or ETag."""
    import fsspec
    import xxhash

    from pipeline.io.fs import install_hint

    try:
        fsys, root = fsspec.core.url_to_fs(pattern)
        matches = sorted(fsys.glob(root)) if glob.has_magic(root) else ([root] if fsys.exists(root) else [])
    except ImportError as e:
        problems.append(f"{where}: cannot read {pattern}: {e}; {install_hint(pattern.split('://')[0])}")
        return
    except (OSError, ValueError) as e:
        problems.append(f"{where}: cannot list {pattern}: {type(e).__name__}: {e} (are the store's credentials "
                        "and endpoint in the environment, e.g. AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL?)")
        return
    if not matches:
        problems.append(f"{where}: {pattern!r} matches no file")
        return
    base = _fixed_prefix(root)
    for m in matches:
        info = fsys.info(m)
        url = fsys.unstrip_protocol(m)
        if info.get("type") == "directory":
            problems.append(f"{where}: {url} is a directory; use a glob such as {pattern.rstrip('/')}/*.jsonl.zst")
            continue
        fmt, comp = format_from_name(m.rsplit("/", 1)[-1])
        fmt = spec.format or fmt
        if fmt is None or fmt == "hf":
            problems.append(f"{where}: cannot read {url} as {fmt or 'an unknown format'}; remote inputs are "
                            f".jsonl[.gz|.zst], .parquet, .warc[.gz] or .html (set sources.{sname}.format)")
            continue
        stamp = str(info.get("mtime") or info.get("LastModified") or info.get("ETag") or info.get("etag") or "")
        files[url] = InputFile(url, os.path.relpath(m, base), fmt, comp, int(info.get("size") or 0),
                               xxhash.xxh64_intdigest(stamp) >> 1)


def resolve_inputs(lm: LoadedMixture) -> dict[str, list[InputFile]]:
    """Every source's files; raises UsageError listing every path problem."""
    out, problems = {}, []
    for sname, spec in lm.mixture.sources.items():
        out[sname], p = source_files(lm, sname, spec)
        problems += p
    if problems:
        raise UsageError("\n".join(problems))
    return out
