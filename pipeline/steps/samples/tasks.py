"""Samples of kept and removed documents: published with every run, exported on demand.

A sample is chosen by a seeded hash of each document's id (the smallest hashes win), so
the same run publishes the same samples and a slice gives the same documents however
the run was sharded. Documents are streamed shard by shard (pipeline/shards/decisions.py); only
the chosen few are held.

Published by two steps, so no task reads a whole source: `samples-pick`, one task per
document shard, keeps each group's smallest hashes (at most as many as are published) with
their texts; `samples`, one task per source, merges its shards' picks (a few records per
shard and group) and keeps the smallest of those, which are the smallest of the source.
A dedup survivor's text is read by its gid (one row group), not by scanning ids.

Published: `samples/<source>/kept.jsonl` with
`kept_per_source` kept documents, and `samples/<source>/removed.jsonl` with
`removed_per_reason` documents for each (stage, reason). A dedup removal carries its
survivor (`survivor: {source, id, text}`); a quality removal its score and threshold; a
document whose text a stage changed (a rewriter, paragraph dedup, decontamination's cuts)
its text as ingested (`original`) and what changed it (`rewritten_by`), which the sample
browser shows side by side with the changes marked.
"""

from __future__ import annotations

import heapq
from pathlib import Path
from typing import NotRequired, TypedDict

import numpy as np
import orjson
import pyarrow as pa
import xxhash

from pipeline.engine.cutoff import same_as_before
from pipeline.shards import decisions as dec
from pipeline.shards import readkey
from pipeline.engine.step import task
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
    if row["status"] == "removed" and row.get("stage") == "decontaminate" and (row.get("reason") or "").startswith("contaminated:"):
        _, es, rest = row["reason"].split(":", 2)  # contaminated:<eval set>:<item id> (overlap=0.83)
        r["eval_item"] = {"set": es, "id": rest.rsplit(" (overlap=", 1)[0]}
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
    attach_eval_items(run, out)
    return out


def attach_eval_items(run: dec.Run | None, records: list[dict], items_file: str | None = None) -> None:
    """The text of the eval item each contaminated record contains, from the eval index's
    items file (one small file a run: `items_file`, else the one `run` records), shown beside
    the document in the sample browser."""
    wanted = {(r["eval_item"]["set"], r["eval_item"]["id"]) for r in records if "eval_item" in r}
    if items_file is None and run is not None and (d := run.role_dir("decontaminate_index")) is not None:
        items_file = str(d / "items" / "part-00000.parquet")
    if not wanted or items_file is None:
        return
    items = fs.read_table(items_file, columns=["set", "id", "text"],  # only the items named
                          filters=[("id", "in", sorted({i for _, i in wanted}))])
    texts = {(a, b): t for a, b, t in zip(*(items.column(c).to_pylist() for c in ("set", "id", "text")), strict=True)
             if (a, b) in wanted}
    for r in records:
        if "eval_item" in r:
            r["eval_item"]["text"] = (texts.get((r["eval_item"]["set"], r["eval_item"]["id"])) or "")[:TEXT_LIMIT]


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


# ---------------------------------------------------------------- the published samples: a map and a merge


def _bottom(keys: np.ndarray, n: int, ids: list) -> list[int]:
    """Positions of the n smallest (key, id): ties of the 64-bit key go by id, never by
    position, so the choice does not depend on sharding."""
    if n <= 0 or len(keys) == 0:
        return []
    order = np.argsort(keys, kind="stable")
    if len(order) > n:
        order = order[keys[order] <= keys[order[n - 1]]]  # the n smallest and every key tied with the n-th
    return sorted(order.tolist(), key=lambda j: (int(keys[j]), ids[j] or ""))[:n]


def _survivor_texts(spec: dict, records: list[dict]) -> None:
    """Each dedup removal's survivor text, read by the survivor's gid (one row group of its
    ingest shard); runs that predate gids fall back to a scan of the survivor's source."""
    from pipeline.shards import shuffle
    from pipeline.shards import view

    by_shard: dict[str, list] = {}
    missing = []
    for r in records:
        if "survivor" not in r:
            continue
        g = r.pop("_gid", None)
        if g is None:
            missing.append(r)
            continue
        src, part, row = (int(x[0]) for x in shuffle.split_gid(np.array([g])))
        path = f"{spec['ingest_dirs'][src]}/part-{part:05d}.parquet"
        by_shard.setdefault(path, []).append((row, r))
    for path, items in by_shard.items():
        rows = np.array(sorted({row for row, _ in items}))
        t = view.read_rows(path, [], rows, ["id", "text"])
        found = dict(zip(rows.tolist(), zip(t.column("id").to_pylist(), t.column("text").to_pylist(), strict=True), strict=True))
        for row, r in items:
            i, text = found[row]
            if i != r["survivor"]["id"]:
                raise ValueError(f"{path} row {row} holds {i!r}, not the survivor {r['survivor']['id']!r}")
            r["survivor"]["text"] = (text or "")[:TEXT_LIMIT]
    if missing:
        _attach_survivors(dec.Run(fs.path(spec["run_dir"])), missing)


class PickSpec(TypedDict):
    """A `samples-pick` shard (steps/samples/plan.py): what its decisions read, by content."""

    source: str
    seed: int
    documents: str  # the ingest shard
    layers: list[list[str]]  # [ledger stage, attribute file] in deciding order
    role: str  # the source's role (train, eval, reference)
    selection: str | dict | None  # the source's part of the selection: mix-select's sources/<source>.json, or inline
    quarantine: str  # the ingest shard's quarantine file (may not exist)
    kept_per_source: int
    removed_per_reason: int
    describe: str


@task(version="7")  # 7: read-keyed; 6: the selection by its file; 5: keyed by what it reads, survivors' texts attached by the merge (4: eval items; 3: per shard)
def pick_shard(spec: PickSpec, out) -> dict:
    """The `samples-pick` step, one task per document shard: of each group (kept; removed by
    stage and reason; quarantined by reason) the records with the smallest sample hashes,
    at most as many as the source publishes, with their texts. Writes part-XXXXX.jsonl.
    It reads only what its spec names (decisions.OneShard): a dedup removal's survivor, in
    another shard, gets its text in the per-source merge (`_gid`: where to read it)."""
    sel = spec["selection"]
    run = dec.OneShard(spec["seed"], spec["role"], atomic.read_json(sel) if isinstance(sel, str) else sel, spec["layers"])
    source, part = spec["source"], fs.path(spec["documents"])
    read: dict = {}  # the shard's files, read once for the read key and both calls
    rk = _read_key(run.layers(source, part), read)
    if (st := same_as_before(spec, out, rk)) is not None:
        return st
    t = dec.shard_decisions(run, source, part, score_rows=(), tables=read)  # the picks' scores only, below
    ids = t.column("id").to_pylist()
    keys = np.array([_h(run.seed, source, i) for i in ids], np.uint64)
    status = np.array(t.column("status").to_pylist(), dtype=object)
    groups: dict[tuple, np.ndarray] = {}
    kept = np.flatnonzero(status == "kept")
    if len(kept):
        groups[("kept",)] = kept
    removed = np.flatnonzero(status == "removed")
    if len(removed):
        stage = t.column("stage").to_pylist()
        reason = t.column("reason").to_pylist()
        labels: dict[tuple, list[int]] = {}
        for i in removed.tolist():
            labels.setdefault(("removed", stage[i], dec.reason_group(reason[i])), []).append(i)
        groups.update({k: np.array(v) for k, v in labels.items()})
    chosen: list[tuple[tuple, int]] = []
    for g, pos in groups.items():
        n = spec["kept_per_source"] if g[0] == "kept" else spec["removed_per_reason"]
        chosen += [(g, int(pos[j])) for j in _bottom(keys[pos], n, [ids[i] for i in pos.tolist()])]
    records: list[tuple[dict, int | None]] = []
    if chosen:
        rows = np.array(sorted({i for _, i in chosen}))
        layers = [str(p) for _, p in run.layers(source, part)]
        texts = view_rows(str(part), layers, rows)
        at = pa.array(rows)
        scored = dec.shard_decisions(run, source, part, score_rows=rows.tolist(), tables=read).column("scores").take(at)
        picked = t.take(at)
        cols = _columns(picked.set_column(picked.schema.get_field_index("scores"), "scores", scored))
        pos = {int(r): j for j, r in enumerate(rows.tolist())}  # shard row -> its row among the picks
        changed = originals(str(part), {i: cols["rewritten_by"][pos[i]] for i in rows.tolist()})
        for g, i in chosen:
            row = {k: v[pos[i]] for k, v in cols.items()}
            text, meta = texts[i]
            row["text"] = text
            row["url"] = dec._url(meta)
            r = _record(row)
            if i in changed:
                r.update(changed[i])
            r["_group"], r["_key"] = list(g), int(keys[i])
            if "survivor" in r and row.get("survivor_gid") is not None:
                r["_gid"] = int(row["survivor_gid"])
            records.append((r, None))
    qf = fs.path(spec["quarantine"])
    q = dec._quarantine_rows(qf, source) if qf.exists() else []
    qkeys = np.array([_h(run.seed, source, row["source_id"]) for row in q], np.uint64)
    qgroups: dict[str, list[int]] = {}
    for j, row in enumerate(q):
        qgroups.setdefault(row["reason"], []).append(j)
    for reason, pos in qgroups.items():
        pos = np.array(pos)
        for j in _bottom(qkeys[pos], spec["removed_per_reason"], [q[i]["source_id"] for i in pos.tolist()]):
            row = q[int(pos[j])]
            r = {**row, "scores": {}, "text": ""}
            r["_group"], r["_key"] = ["quarantined", "ingest", reason], int(qkeys[pos[j]])
            records.append((r, None))
    write_jsonl([r for r, _ in records], out.path(".jsonl"))
    return {"rows": t.num_rows + len(q), "source": source, "picked": len(records), "read_key": rk}


def _read_key(layers: list, read: dict) -> str:
    """The read key of a shard's picks (engine/cutoff.py): every column of its layers that
    its decisions read, in deciding order, texts included; not the columns only explain
    reads (decisions.UNREAD: a cluster's size grows when a new page joins it, and no
    pick changes). The tables go into `read`, where shard_decisions finds them."""
    import xxhash

    h = xxhash.xxh3_128()
    for label, path in layers:
        names = fs.parquet_schema(path).names
        t = fs.read_table(path)
        read[("names", str(path))] = names
        read[(str(path), tuple(c for c in names if c != "text"))] = t.drop_columns(["text"]) if "text" in names else t
        h.update(b"\x00layer:" + label.encode())
        h.update(readkey.of_tables(t.drop_columns([c for c in dec.UNREAD if c in names])).encode())
    return h.hexdigest()


def _columns(t) -> dict[str, list]:
    return {c: t.column(c).to_pylist() for c in t.column_names}


def originals(documents: str, by: dict[int, list[str] | None]) -> dict[int, dict]:
    """row -> {original: its text as ingested, rewritten_by: [stages]} for the rows a stage
    rewrote (`by`: shard_decisions' `rewritten_by`); reads the ingested text of those rows only."""
    from pipeline.shards import view

    by = {i: v for i, v in by.items() if v}
    if not by:
        return {}
    changed = np.array(sorted(by))
    t = view.read_rows(documents, [], changed, ["text"])
    return {i: {"original": (o or "")[:TEXT_LIMIT], "rewritten_by": by[i]}
            for i, o in zip(changed.tolist(), t.column("text").to_pylist(), strict=True)}


def view_rows(documents: str, layers: list[str], rows: np.ndarray) -> dict[int, tuple[str, str | None]]:
    """row -> (current text, metadata) of some rows of a shard."""
    from pipeline.shards import view

    t = view.read_rows(documents, layers, rows, ["text", "metadata"])
    return dict(zip(rows.tolist(), zip(t.column("text").to_pylist(), t.column("metadata").to_pylist(), strict=True),
                    strict=True))


class SamplesSpec(TypedDict):
    """A `samples` shard (steps/samples/plan.py `sample_shards`): one source's picks, merged."""

    source: str
    picks: str  # the samples-pick step's folder
    first: int  # the source's first pick shard there
    shards: int  # and how many
    run_dir: str
    ingest_dirs: list[str]  # per source (YAML order), its ingest step's folder: where survivors' texts are
    eval_items: NotRequired[str]  # the decontamination index's items file: the eval items' texts records show
    kept_per_source: int
    removed_per_reason: int
    describe: str


def _order(r: dict):
    return r["_key"], r.get("id") or r.get("source_id") or ""


def pick_groups(paths: list, kept_per_source: int, removed_per_reason: int) -> dict[tuple, list[dict]]:
    """The best records (smallest hash) of each group in some pick files, at most what the
    samples keep of a group: the whole merge, or one task of its tree. Memory is bounded by
    the picks kept, not by the files read."""
    groups: dict[tuple, list[dict]] = {}

    def limit(g: tuple) -> int:
        return kept_per_source if g[0] == "kept" else removed_per_reason

    for data in fs.read_many(fs.read_bytes, paths):  # reads in flight together
        for line in data.splitlines():
            r = orjson.loads(line)
            g = tuple(r.pop("_group"))
            recs = groups.setdefault(g, [])
            recs.append(r)
            if len(recs) >= 2 * limit(g) + 64:
                recs.sort(key=_order)
                del recs[limit(g):]
    for g, recs in groups.items():
        recs.sort(key=_order)
        del recs[limit(g):]
    return groups


@task(version="5")  # 5: eval items from the file its spec names (in its key); 4: attaches survivors' texts and eval items (the picks' were)
def sample_shard(spec: SamplesSpec, out) -> dict:
    """The `samples` step, one task per source: the picks of its shards merged, the smallest
    hashes of each group kept; the same records as one pass over the source. Past
    `engine.select_group` pick files, tasks of that many files each keep their groups'
    best and this task merges theirs (a group's best of bests is its best)."""
    from pipeline.shards.select import GROUP, grouped
    from pipeline.steps.rounds import fan_out

    paths = [str(fs.path(spec["picks"]) / f"part-{k:05d}.jsonl") for k in range(spec["first"], spec["first"] + spec["shards"])]
    parts, tasks = grouped(pick_groups, paths, fan_out, spec.get("select_group", GROUP),
                           spec["kept_per_source"], spec["removed_per_reason"])
    groups: dict[tuple, list[dict]] = {}
    for part in parts:
        for g, recs in part.items():
            groups.setdefault(tuple(g), []).extend(recs)

    def best(g: tuple, n: int) -> list[dict]:
        recs = groups.get(g, [])
        recs.sort(key=_order)
        return [{k: v for k, v in r.items() if k != "_key"} for r in recs[:n]]

    source = spec["source"]
    kept = best(("kept",), spec["kept_per_source"])
    removed = []
    for kind in ("removed", "quarantined"):
        for g in sorted((g for g in groups if g[0] == kind), key=lambda g: tuple("" if x is None else x for x in g)):
            removed += best(g, spec["removed_per_reason"])
    _survivor_texts(spec, kept + removed)  # the few published records' survivors, each by its gid
    # the eval items' texts from the index file the spec names (its bytes in the key), not the run's record
    attach_eval_items(None, kept + removed, spec.get("eval_items"))
    d = fs.path(out.dir) / source
    write_jsonl(kept, d / "kept.jsonl")
    write_jsonl(removed, d / "removed.jsonl")
    return {"rows": len(kept) + len(removed), "source": source, "kept": len(kept), "removed": len(removed),
            **({"merge_tasks": tasks} if tasks else {})}
