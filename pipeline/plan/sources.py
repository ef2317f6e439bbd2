"""From a source's `paths` (files, globs, directories) to a sorted list of input files,
and the one check of a mixture against this machine that `curate validate` and
`curate run` share (`check`).

Each file gets a fingerprint (size, mtime) that enters the ingest step's hash, so an
edited or replaced input file re-runs ingest; content is not read here. With
`inputs.verify: content` the fingerprint is the size and the change time (ctime, which a
tool that keeps modification times cannot set back), and where it moved the ingest task
reads the file and compares its digest with the earlier shard's (steps/ingest/verify.py). Formats are
inferred from file names when `format` is omitted. A path that matches nothing is an
error naming the YAML key.
"""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

from pipeline.config import LoadedMixture, SourceSpec, environment
from pipeline.errors import UsageError
from pipeline.io.discover import InputFile, expand, fixed_prefix, format_from_name, infer_format, is_hf_dir, open_error
from pipeline.plan import tokens


def check(lm: LoadedMixture) -> tuple[dict[str, list[InputFile]], str | None]:
    """Everything between the file and this machine, for `validate` and `run` alike: every
    source's input files, the files and packages the filters, extractors, classifiers and
    eval sets need, and the tokenizer. Returns (files per source, the tokenizer to count
    with); raises UsageError listing every problem."""
    files = resolve_inputs(lm)
    missing = environment(lm)
    if missing:
        raise UsageError("\n".join(missing))
    return files, tokens.check(lm.mixture.tokenizer, lm.base_dir)


def fingerprint(f: InputFile, verify: str = "mtime") -> dict:
    """What of an input file enters the ingest step's hash (its content is not read here):
    its size and mtime; with `inputs.verify: content`, its size and change time (a remote
    object's stamp: its store sets it)."""
    fp = {"rel": f.rel, "format": f.format, "compression": f.compression, "size": f.size, "mtime_ns": f.mtime_ns}
    if verify == "content":
        del fp["mtime_ns"]
        fp.update(ctime_ns=f.ctime_ns or f.mtime_ns, verify="content")
    if f.unreadable:  # chmod does not change mtime: a file made readable again is read again
        fp["unreadable"] = f.unreadable
    return fp


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
        found, loops = expand(full)
        matches = sorted(found)
        for link, target in loops:
            print(f"note: {where}: skipped {link}: a symlink to {target}, a folder it is inside (a loop)", file=sys.stderr)
        if not matches:
            hint = ("; this runs inside a Ray job, whose working directory is an uploaded copy without git-ignored "
                    "data: give an absolute path on a shared filesystem or a URL (s3://...)"
                    if "working_dir_files" in full else "")
            problems.append(f"{where}: {pattern!r} matches no file (looked in {Path(full).parent}){hint}")
            continue
        base = fixed_prefix(full)
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
            if fmt == "hf" and not spec.hf_builder and not is_hf_dir(p):
                problems.append(f"{where}: {m} is not a saved HF dataset directory (no dataset_info.json or state.json)")
                continue
            unreadable = open_error(p)
            if unreadable and spec.on_bad_record == "fail":
                problems.append(f"{where}: {m} cannot be read ({unreadable}); give the user running curate read access "
                                f"(e.g. chmod a+r), or set sources.{sname}.on_bad_record: quarantine to set the file aside")
                continue
            st = p.stat()
            rel = os.path.relpath(m, base)
            files[str(p.resolve())] = InputFile(str(p.resolve()), rel, fmt, comp, st.st_size, st.st_mtime_ns, unreadable,
                                                st.st_ctime_ns)
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
    base = fixed_prefix(root)
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
