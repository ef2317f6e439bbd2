"""How a source's input files become ingest shards, planned before any record is read:
large compressed JSONL is first scanned for a line count (`scan-<source>`, scan_shard),
Parquet splits by row groups, and every split stays under `max_shard_rows` and
`max_shard_bytes`."""

from __future__ import annotations

import math
from typing import Any, NotRequired, TypedDict

import pyarrow as pa

from pipeline.io import fs, readers

SCAN_MIN_BYTES = 8 << 20  # compressed files larger than this are scanned for a line count, then split


def needs_scan(f: dict, max_shard_bytes: int) -> bool:
    return not f.get("unreadable") and f["format"] == "jsonl" and f["compression"] is not None and f["size"] > min(SCAN_MIN_BYTES, max_shard_bytes)


def _footers(files: list[dict]) -> dict[str, list[int] | Exception]:
    """Rows per row group of every Parquet input, read many at a time (a footer's ranged GET
    waits ~20 ms on an object store: one after another, planning 10^5 files would wait
    half an hour), or the error that says it has no footer."""
    todo = [f for f in files if f["format"] == "parquet" and not f.get("unreadable")]

    def one(f):
        try:
            return readers.parquet_row_groups(f["path"], f.get("size"))
        except (OSError, pa.ArrowException) as e:
            return e
    return dict(zip((f["path"] for f in todo), fs.read_many(one, todo)))


def plan_splits(files: list[dict], spec: dict, line_counts: dict[str, int]) -> list[dict]:
    """Deterministic splits of a source's files: a function of file sizes, counts and limits."""
    max_rows, max_bytes = spec["max_shard_rows"], spec["max_shard_bytes"]
    footers = _footers(files)
    out: list[dict[str, Any]] = []
    html: list[dict] = []  # html files go in groups of up to max_rows pages
    for f in files:
        if f["format"] == "html":
            if len(html) >= max_rows:
                out.append({"file": html[0], "files": html})
                html = []
            html.append(f)
        elif f.get("unreadable") or f["format"] == "warc":
            out.append({"file": f})
        elif f["format"] == "parquet":
            group, rows, first = [], 0, 0
            groups = footers[f["path"]]
            if isinstance(groups, Exception):  # no footer: the ingest task sets the file aside (or stops)
                out.append({"file": f, "error": f"{type(groups).__name__}: {groups}"})
                continue
            for i, n in enumerate(groups):
                if group and rows + n > max_rows:
                    out.append({"file": f, "row_groups": group, "first_row": first})
                    first += rows
                    group, rows = [], 0
                group.append(i)
                rows += n
            out.append({"file": f, "row_groups": group, "first_row": first})
        elif f["format"] == "hf" and spec.get("hf_builder"):
            out.append({"file": f, "hf_builder": spec["hf_builder"]})
        elif f["format"] == "hf":
            n = len(readers.load_hf(f["path"], spec.get("hf_split")))
            for a in range(0, max(n, 1), max_rows):
                out.append({"file": f, "first_row": a, "last_row": min(n, a + max_rows)})
        elif f["compression"] is None:
            k = max(1, math.ceil(f["size"] / max_bytes))
            step = math.ceil(f["size"] / k) if f["size"] else 1
            for a in range(0, max(f["size"], 1), step):
                out.append({"file": f, "start": a, "end": min(f["size"], a + step)})
        else:
            n = line_counts.get(f["path"])
            if n is None or n <= max_rows:
                out.append({"file": f})
            else:
                for a in range(0, n, max_rows):
                    last = a + max_rows
                    out.append({"file": f, "first": a, "last": None if last >= n else last})
    if html:
        out.append({"file": html[0], "files": html})
    for s in out:
        s["describe"] = describe(s)
    return out


def paths(split: dict) -> list[str]:
    """The input files a split reads."""
    return [f["path"] for f in split["files"]] if "files" in split else [split["file"]["path"]]


def describe(split: dict) -> str:
    f = split["file"]
    if "files" in split:
        return f"{f['path']} and {len(split['files']) - 1} more html files" if len(split["files"]) > 1 else f["path"]
    if "start" in split:
        return f"{f['path']} bytes {split['start']}-{split['end']}"
    if "first" in split:
        return f"{f['path']} lines {split['first'] + 1}-{split['last'] or 'end'}"
    if "row_groups" in split:
        return f"{f['path']} row groups {split['row_groups'][:1]}..{split['row_groups'][-1:]}"
    if "first_row" in split:
        return f"{f['path']} rows {split['first_row']}-{split['last_row']}"
    return f["path"]


class ScanSpec(TypedDict):
    """A `scan-<source>` shard (steps/ingest/plan.py): one large compressed input (io/discover.py InputFile's fields)."""

    path: str
    rel: str
    format: str
    compression: str | None
    size: int
    mtime_ns: NotRequired[int]  # not with inputs.verify: content (then `stamp`)
    unreadable: str | None
    describe: str
    verify: NotRequired[str]  # content: the file's digest compared with the earlier shard's (verify.py)
    stamp: NotRequired[dict[str, int]]


def scan_shard(spec: ScanSpec, out) -> dict:
    """Scan task: the line count of one compressed file (for splitting by records)."""
    from pipeline.steps.ingest import verify

    rk, same = verify.verified(spec, out, [spec["path"]])
    if same is not None:
        return same
    res = readers.count_lines(spec["path"], spec["compression"])
    return {"path": spec["path"], **res, "rows": 0, **verify.recorded(rk)}
