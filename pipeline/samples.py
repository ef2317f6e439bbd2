"""Samples of kept and removed documents: published with every run, exported on demand.

A sample is chosen by a seeded hash of each document's id (the smallest hashes win), so
the same run publishes the same samples and a slice gives the same documents however
the run was sharded. Documents are streamed shard by shard (pipeline/decisions.py); only
the chosen few are held.

Published (the `samples` step, one task per source): `samples/<source>/kept.jsonl` with
`kept_per_source` kept documents, and `samples/<source>/removed.jsonl` with
`removed_per_reason` documents for each (stage, reason). A dedup removal carries its
survivor (`survivor: {source, id, text}`); a quality removal its score and threshold.
"""

from __future__ import annotations

import heapq
from pathlib import Path

import orjson
import xxhash

from pipeline import decisions as dec
from pipeline.io import atomic, fs

TEXT_LIMIT = 20_000  # characters of a document kept in a sample record


def _h(seed: int, source: str, doc_id: str) -> int:
    return xxhash.xxh3_64_intdigest(f"sample:{seed}:{source}:{doc_id}")


class _Keep:
    """The n records with the smallest keys."""

    def __init__(self, n: int):
        self.n = n
        self.heap: list = []  # (-key, arrival, record): arrival breaks ties, records never compare
        self.count = 0

    def offer(self, key: int, record_fn):
        if self.n <= 0:
            return
        self.count += 1
        if len(self.heap) < self.n:
            heapq.heappush(self.heap, (-key, -self.count, record_fn()))
        elif -self.heap[0][0] > key:
            heapq.heapreplace(self.heap, (-key, -self.count, record_fn()))

    def records(self) -> list[dict]:
        return [r for _, _, r in sorted(self.heap, key=lambda x: (-x[0], -x[1]))]


def _record(row: dict) -> dict:
    r = {k: row[k] for k in ("source", "id", "source_id", "status", "stage", "reason", "n_tokens")}
    r["scores"] = orjson.loads(row["scores"]) if row.get("scores") else {}
    text = row.get("text") or ""
    r["text"] = text[:TEXT_LIMIT]
    r["truncated"] = len(text) > TEXT_LIMIT
    if row.get("url"):
        r["url"] = row["url"]
    if row.get("survivor_id") and row["status"] == "removed" and (row["stage"] or "").startswith("dedup:"):
        r["survivor"] = {"source": row["survivor_source"], "id": row["survivor_id"]}
    if (row.get("reason") or "").startswith("quality_below:"):
        r["threshold"] = float(row["reason"].split(":", 1)[1].split(" ", 1)[0])
    return r


def matches(row: dict, stage: str | None, reason: str | None, status: tuple[str, ...] | None) -> bool:
    if status and row["status"] not in status:
        return False
    if stage:
        s = (row["stage"] or "").replace(":", "-")
        if s != stage.replace(":", "-") and not s.startswith(stage.replace(":", "-") + "-"):
            return False
    if reason and reason not in (row["reason"] or "") and reason != dec.reason_group(row["reason"]):
        return False
    return True


def sample(run: dec.Run, sources: list[str], n: int, stage: str | None = None, reason: str | None = None,
           status: str | tuple[str, ...] | None = None, per_group: bool = False) -> list[dict]:
    """The n documents with the smallest hashes among those matching; with per_group, n
    for each (source, stage, reason group). `status`: kept, removed, quarantined, or a
    tuple of them (None: all). Quarantined records are the stage `ingest`."""
    status = (status,) if isinstance(status, str) else status
    scan_shards = (not status or set(status) - {"quarantined"}) and stage != "ingest"
    scan_quarantine = (not status or "quarantined" in status) and stage in (None, "ingest")
    groups: dict = {}
    for source in sources:
        for part in run.shards(source) if scan_shards else []:
            t = dec.shard_decisions(run, source, part, with_text=True)
            for row in t.to_pylist():
                if not matches(row, stage, reason, status):
                    continue
                g = (source, row["stage"], dec.reason_group(row["reason"])) if per_group else None
                keep = groups.setdefault(g, _Keep(n))
                keep.offer(_h(run.seed, source, row["id"]), lambda row=row: _record(row))
        if scan_quarantine:
            for row in dec.quarantined(run, source):
                if matches(row, None, reason, status):
                    keep = groups.setdefault((source, "ingest", row["reason"]) if per_group else None, _Keep(n))
                    keep.offer(_h(run.seed, source, row["source_id"]), lambda row=row: {**row, "scores": {}, "text": ""})
    out = [r for k in sorted(groups, key=lambda g: tuple("" if x is None else x for x in (g or ()))) for r in groups[k].records()]
    _attach_survivors(run, out)
    return out


def _attach_survivors(run: dec.Run, records: list[dict]):
    wanted: dict[str, set[str]] = {}
    for r in records:
        if "survivor" in r:
            wanted.setdefault(r["survivor"]["source"], set()).add(r["survivor"]["id"])
    texts = dec.find_texts(run, wanted)
    for r in records:
        if "survivor" in r:
            r["survivor"]["text"] = (texts.get((r["survivor"]["source"], r["survivor"]["id"])) or "")[:TEXT_LIMIT]


def write_jsonl(records: list[dict], path: Path):
    atomic.write_bytes(path, b"".join(orjson.dumps(r) + b"\n" for r in records))


def sample_shard(spec: dict, out) -> dict:
    """The `samples` step: one source's published samples."""
    run = dec.Run(fs.path(spec["run_dir"]))
    source = spec["source"]
    kept = sample(run, [source], spec["kept_per_source"], status="kept")
    removed = sample(run, [source], spec["removed_per_reason"], status="removed", per_group=True)
    removed += sample(run, [source], spec["removed_per_reason"], status="quarantined", per_group=True)
    d = fs.path(out.dir) / source
    write_jsonl(kept, d / "kept.jsonl")
    write_jsonl(removed, d / "removed.jsonl")
    return {"rows": len(kept) + len(removed), "source": source, "kept": len(kept), "removed": len(removed)}
