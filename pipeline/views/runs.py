"""`curate runs [OUTPUT] [--json]`: the runs in an output folder, one line each, so
variants of a mixture (copies of a YAML with other weights or thresholds, sharing one
step store) can be told apart at a glance.

Reads each run directory's run.json, manifest.json and ledger.json only (small files). A run
whose input files were cut or unreadable (ledger conservation "unknown") gets a line under its
own naming them.
"""

from __future__ import annotations

import time

from pipeline.errors import UsageError
from pipeline.io import atomic, fs
from pipeline.shards import ledger


def collect(output) -> list[dict]:
    root = fs.path(output)
    if not root.exists():
        raise UsageError(f"{output}: no such output folder; give the folder your runs are in (the YAML's `output`, e.g. out)")
    rows = []
    for d in sorted(root.iterdir(), key=lambda p: p.name):
        if d.name.startswith(("_", ".")) or not (d / "run.json").exists():
            continue  # the step store, or not a run directory
        rec = atomic.read_json(d / "run.json")
        man, led = (_read(d / name) for name in ("manifest.json", "ledger.json"))
        rows.append({
            "name": rec.get("name", d.name), "dir": str(d), "mixture_file": rec.get("mixture_file"),
            "started": rec.get("started"), "status": rec.get("status"), "config_hash": rec.get("config_hash"),
            "seconds": rec.get("seconds"),
            "tokens": man["total_tokens"] if man else None,
            "weights": {s: v["realized_weight"] for s, v in man["sources"].items()} if man else None,
            "conservation": led["conservation"] if led else None,
            "unread_files": ledger.unread_files(led) if led else [],
        })
    return rows


def _read(path) -> dict | None:
    try:
        return atomic.read_json(path)
    except (FileNotFoundError, ValueError):
        return None  # a run that has not finished


def render(rows: list[dict]) -> str:
    if not rows:
        return "no runs here (a run directory holds a run.json)"
    head = f"{'name':<16} {'started':<16} {'status':<9} {'config':<9} {'tokens':>12}  realised weights   mixture file"
    lines = [head]
    for r in rows:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["started"])) if r["started"] else "?"
        w = " ".join(f"{s} {v:.3f}" for s, v in (r["weights"] or {}).items()) or "-"
        tok = f"{r['tokens']:,}" if r["tokens"] is not None else "-"
        lines.append(f"{r['name']:<16} {when:<16} {r['status'] or '?':<9} {(r['config_hash'] or '?')[:8]:<9} {tok:>12}  "
                     f"{w}   {r['mixture_file'] or '?'}")
        if r.get("unread_files"):
            lines.append(f"{'':<16} ! {ledger.describe_unread(r['unread_files'])}")
    return "\n".join(lines)
