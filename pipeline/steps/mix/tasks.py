"""The weighted mixture: token targets, epochs, a deterministic global shuffle.

    mix-priority per document shard of a source that is down-sampled or needs a partial
                 epoch: its kept documents' priorities and tokens, sorted, with a histogram
    mix-select   one task: each source's budget and priority cutoff, exact, merged from the
                 priority files' histograms and one row group each (pipeline/shards/select.py)
    mix-route    per document shard: every chosen (document, epoch) goes to output shard
                 order % n_shards, where order = hash(seed, source, id, epoch)
    mix          per output shard: its rows sorted by order, written as part-XXXXX.parquet

Budget (pipeline/mixing/budget.py): per cell a token target and the epochs it needs, the
documents taken in priority order hash(seed, source, id, epoch) until the target is met.

Cells: all of the above is per cell (pipeline/mixing/cells.py): a source, or a range of its
quality buckets; a source that is one cell is mixed exactly as before cells existed.
`sample_rates` set each cell's target to rate x its kept tokens; `simulate_target_tokens`
(simulated epoching) takes the epochs from the budget of the full-size mixture and draws
each cell from a pool, the prefix of its epoch-0 priority order holding target/simulate of
its tokens, so both the pool and the partial epoch are cutoffs on the same key files.

Phases (`mixture.phases`): the same four steps do every phase at once; each phase has its
own cells, budget and priorities (salted with its name), its own range of output
partitions in the one shuffle, and its files under <phase>/. Disjoint phases share each
cell's epoch-0 order out instead: phase k takes the tokens after phase k-1's cutoff.

Nothing depends on workers, shards or retries: choices and order are hashes of ids.
"""

from __future__ import annotations

import math
from typing import NotRequired, TypedDict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.engine.cutoff import same_as_before
from pipeline.shards import readkey, shuffle
from pipeline.mixing.budget import (by_phase, cell_epochs, deciding, order_key, phase_selections, priority, selected_sources,
                                    source_cells, source_selection, split_epochs)
from pipeline.mixing import cells
from pipeline.shards import select
from pipeline.engine.step import task
from pipeline.io import atomic, fs
from pipeline.shards import view
from pipeline.shards.documents import MIX_ORDER, DocShard

MIX_SCHEMA = pa.schema([
    ("id", pa.string()), ("text", pa.string()), ("source", pa.string()), ("source_id", pa.string()),
    ("n_tokens", pa.int64()), ("epoch", pa.int32()), ("quality_score", pa.float32()), ("quality_bucket", pa.int16()),
    ("topic", pa.string()), ("topic_score", pa.float32()), ("lang", pa.string()),
])
ROW_GROUP = 2048
ALL = pc.CountOptions(mode="all")  # rows, null token counts included


class PrioritySpec(TypedDict):
    """A `mix-priority` shard (steps/mix/plan.py `priority_shards`): one document shard and its source's cells."""

    doc: DocShard  # with `axis_groups` when its source is weighted by an axis
    seed: int  # the mixture's (a cell's own `seed` comes first)
    cells: str | list[dict]  # mix-budget's cells/<source>.json: the source's cells in every phase, each with its key
    # folder `index`, `phase`, `seed` and `epoch` (or the list itself)
    describe: str


class BudgetSpec(TypedDict):
    """The `mix-budget` step's one shard (steps/mix/plan.py `budget_shards`)."""

    sources: dict[str, list[dict]]  # per mixed source, its cells in every phase with `index`, `phase`, `seed`, `epoch`
    phases: list[dict]  # per phase: available, available_docs, budget (per cell)
    epochs: list[dict]  # per phase: cell -> the epoch its priority keys are of (None: none needed)
    describe: str


@task(version="1")
def budget_shard(spec: BudgetSpec, out) -> dict:
    """Each source's cells as `cells/<source>.json` (what a mix-priority shard reads, keyed by
    its bytes), and the phases' availability and budgets in the marker (what the select reads)."""
    for source, cl in spec["sources"].items():
        atomic.write_json(fs.path(out.dir) / "cells" / f"{source}.json", cl)
    return {"rows": 0, "phases": spec["phases"], "epochs": spec["epochs"]}


@task(version="4")  # 4: one key file a shard, the cell a column; 3: the source's cells from the file its spec names
def priority_shard(spec: PrioritySpec, out) -> dict:
    """`mix-priority`, per document shard of a source with a cell that needs a partial
    epoch: each such cell's kept documents' priorities and tokens, sorted, one file per
    shard (keys/part-XXXXX.parquet, the cell a column, each cell's histogram in its footer),
    for the select's merge (pipeline/shards/select.py write_cell_keys)."""
    if isinstance(spec["cells"], str):  # mix-budget's cells/<source>.json
        spec = {**spec, "cells": atomic.read_json(spec["cells"])}
    d, todo = spec["doc"], [c for c in spec["cells"] if c["epoch"] is not None]
    p: dict[int, list] = {c["index"]: [] for c in todo}
    t: dict[int, list] = {c["index"]: [] for c in todo}
    rows = 0
    if todo:
        buckets, topics = view.shard_buckets(d), view.shard_topics(d)
        values = view.shard_axes(d, cells.source_axes(spec["cells"]))
        for r, b in view.kept_batches(d["documents"], d["layers"], ["id", "n_tokens"]):
            ids = b.column("id").to_pylist()
            rows += len(ids)
            tok = b.column("n_tokens").fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
            for group in by_phase(spec["cells"]):  # each phase partitions the documents into its own cells
                where = cells.index(group, None if buckets is None else buckets[r], len(ids), None if topics is None else topics[r],
                                    view.rows_of(values, r))
                for pos, c in enumerate(group):
                    if c["epoch"] is None:
                        continue
                    m = np.flatnonzero(where == pos)
                    p[c["index"]].append(priority(c.get("seed", spec["seed"]), d["source"], [ids[i] for i in m], c["epoch"]))
                    t[c["index"]].append(tok[m])
    if todo:  # one file of every cell's keys (a cell column), not a file a cell
        select.write_cell_keys(out.path(".parquet", "keys"), {
            c["index"]: (np.concatenate(p[c["index"]]) if p[c["index"]] else np.zeros(0, np.uint64),
                         np.concatenate(t[c["index"]]) if t[c["index"]] else np.zeros(0, np.int64)) for c in todo})
    return {"rows": rows, "source": d["source"]}


class AxisSpec(TypedDict):
    """A `mix-axes` shard (steps/mix/plan.py `axis_shards`): one document shard of a source weighted by an axis."""

    doc: DocShard
    axis: str | list[str]  # the source's axis (lang, or one a stage declares), or its axes in the cells' order
    describe: str


@task(version="3")  # 2: any axis (`axis` in the spec), `axis_groups`; 3: per topic too
def axis_groups_shard(spec: AxisSpec, out) -> dict:
    """`mix-axes`, per document shard of a source weighted by axes (its language, an axis a
    stage declares, or several): its kept documents and tokens per (value, quality bucket; -1
    without buckets), what the budget of its axis cells is computed from (cells.available).
    A value is the row's value of the one axis, or a list of its values of each axis."""
    d = spec["doc"]
    one = isinstance(spec["axis"], str)
    names = [spec["axis"]] if one else list(spec["axis"])
    got = view.shard_axes(d, names) or {}
    cols = [got.get(a) for a in names]
    buckets = view.shard_buckets(d)
    topics = view.shard_topics(d)  # with a topic classifier: per (value, bucket, topic), for cells like web/lang=fr/code
    groups: dict[tuple, list[int]] = {}
    rows = 0
    for r, b in view.kept_batches(d["documents"], d["layers"], ["n_tokens"]):
        tok = b.column("n_tokens").fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        rows += len(r)
        for i, t in zip(r.tolist(), tok.tolist()):
            vs = tuple((col[i] or "") if col is not None else "" for col in cols)
            g = groups.setdefault((vs[0] if one else vs, int(buckets[i]) if buckets is not None else -1,
                                   (topics[i] or "") if topics is not None else None), [0, 0])
            g[0] += 1
            g[1] += t
    return {"rows": rows, "axis_groups": sorted([v if one else list(v), bk, nd, nt, *([tp] if tp is not None else [])]
                                                for (v, bk, tp), (nd, nt) in groups.items())}


def lang_counts(col) -> dict[str, int]:
    """Rows per value of a mixture's `lang` column ("" for rows without one)."""
    return {v["values"] or "": v["counts"] for v in pc.value_counts(col).to_pylist()}


class SelectSpec(TypedDict):
    """The `mix-select` step's one shard (steps/mix/plan.py `select_shards`)."""

    phases: list[dict]  # per phase: name, keys (cell -> key files), budget, available, available_docs, cells, target_tokens
    seed: int
    shard_tokens: int | None  # tokens per mixture shard, else ...
    shard_rows: int  # ... rows per shard
    describe: str


@task(version="6")  # 6: a cell's keys in files of every cell's (select.write_cell_keys); 5: decide/<source>.json, the route's; 4: sources/<source>.json cut to what decides (budget.deciding); 3: sources/<source>.json (2: per cell)
def select_shard(spec: SelectSpec, out) -> dict:
    """The selection of every phase (one, unnamed, without phases: its marker is the phase's),
    and each selected source's part of it as `sources/<source>.json`
    (budget.source_selection): what reads one source's choices (the samples' picks) names
    that file, keyed by its bytes, not the whole marker."""
    m = selection(spec)
    for source in selected_sources(m):
        atomic.write_json(fs.path(out.dir) / "sources" / f"{source}.json", source_selection(m, source))
        # what a mix-route shard of the source reads: its cells cut to what decides its documents, per phase
        atomic.write_json(fs.path(out.dir) / "decide" / f"{source}.json", [
            {"name": name, "cells": [deciding(c) for c in source_cells(sel["sources"][source])], "n_shards": sel["n_shards"],
             "offset": offset} for name, sel, offset in phase_selections(m)])
    return m


def selection(spec: SelectSpec) -> dict:
    """The mix-select marker of a spec: pure maths over the budget and the priority keys' counts."""
    _key_sets([spec] if "phases" not in spec else spec["phases"], spec.get("select_group", select.GROUP))
    if "phases" not in spec:  # a spec of one phase
        m = _select_phase(spec)
    else:
        _disjoint_cuts(spec["phases"])
        got = [_select_phase({**ph, "shard_tokens": spec["shard_tokens"], "shard_rows": spec["shard_rows"]})
               for ph in spec["phases"]]
        m = got[0] if len(got) == 1 and spec["phases"][0]["name"] is None else {
            "phases": {ph["name"]: g for ph, g in zip(spec["phases"], got, strict=True)},
            "rows": sum(g["rows"] for g in got), "tokens": sum(g["tokens"] for g in got)}
    return m


def _key_sets(phases: list[dict], group: int = select.GROUP) -> list[select.KeySet]:
    """Each cell's key files as one select.KeySet for this task (shared by the phases that
    name the same files), so that their footers are read once however often it asks; past
    `group` files a set's reads go to tasks (select.py's tree)."""
    from pipeline.steps.rounds import fan_out

    sets: dict[str, select.KeySet] = {}
    for ph in phases:
        ph["keys"] = {c: sets.setdefault(repr(paths), select.KeySet(paths, fan_out, group))
                      for c, paths in ph.get("keys", {}).items()}
    select.prefetch(list(sets.values()))  # every cell's histograms in one pass over a source's files
    return list(sets.values())


def _disjoint_cuts(phases: list[dict]) -> None:
    """Disjoint phases: per cell, phase after phase, the cutoff where the phase's tokens are
    met counting from where the previous phase ended (each within one document above its
    target); stored in the budget entries as `cuts` (after, upto, docs, tokens)."""
    first = phases[0]
    for cname, b in first["budget"].items():
        if b.get("range") is None:
            continue
        keys = first["keys"][cname]
        after, done_docs, done_tokens = None, 0, 0
        for ph in phases:
            e = ph["budget"][cname]
            if e["target"] <= 0:
                e["cuts"] = [after, after, 0, 0]
                continue
            c, n, t = select.cutoff(keys, done_tokens + e["target"])
            e["cuts"] = [after, str(c), n - done_docs, t - done_tokens]
            after, done_docs, done_tokens = str(c), n, t


def _select_phase(spec: dict) -> dict:
    """The selection of every cell of one phase, and per source their sums."""
    by_cell = {}
    total_tokens = total_rows = 0
    for cname, b in spec["budget"].items():
        avail, avail_docs = spec["available"][cname], spec["available_docs"][cname]
        pool, pool_docs, pool_cut = avail, avail_docs, None  # the documents epochs repeat: all, or a simulated pool
        if b.get("pool_tokens") is not None and 0 < b["pool_tokens"] < avail:
            c, pool_docs, pool = select.cutoff(spec["keys"][cname], b["pool_tokens"])
            pool_cut = str(c)
            # the full mixture's epochs over the pool actually cut (it overshoots by less than a document)
            b = {**b, "target": int(round(b["simulated_target"] * pool / avail))}
        whole, partial = (1, 0) if b.get("all") else split_epochs(b["target"], pool)
        entry = {**spec["cells"][cname], **b, "available": avail, "available_docs": avail_docs, "whole_epochs": whole,
                 "partial_tokens": partial, "cutoff": None, "partial_docs": 0, "partial_tokens_chosen": 0}
        if b.get("pool_tokens") is not None:  # the partial epoch is a prefix of the pool's order (epoch 0's priorities)
            entry.update({"pool_cutoff": pool_cut, "pool_docs": pool_docs, "pool_tokens_chosen": pool, "priority_epoch": 0})
        if b.get("cuts") is not None and partial > 0:  # a disjoint phase: its range of epoch 0's order
            after, upto, n, t = b["cuts"]
            entry.update({"cutoff": upto, "after_cutoff": after, "partial_docs": n, "partial_tokens_chosen": t,
                          "priority_epoch": 0})
        elif partial > 0:
            c, n, t = select.cutoff(spec["keys"][cname], partial)
            entry.update({"cutoff": str(c), "partial_docs": n, "partial_tokens_chosen": t})
        entry["rows"] = whole * pool_docs + entry["partial_docs"]
        entry["tokens"] = whole * pool + entry["partial_tokens_chosen"]
        entry["distinct_docs"] = pool_docs if whole else entry["partial_docs"]
        by_cell[cname] = entry
        total_tokens += entry["tokens"]
        total_rows += entry["rows"]
    plan: dict[str, dict] = {}
    for e in by_cell.values():
        p = plan.setdefault(e["source"], {"weight": None, "target": 0, "available": 0, "available_docs": 0, "rows": 0,
                                          "tokens": 0, "distinct_docs": 0, "capped": False, "cells": []})
        for k in ("target", "available", "available_docs", "rows", "tokens", "distinct_docs"):
            p[k] += e[k]
        if e.get("weight") is not None:
            p["weight"] = (p["weight"] or 0.0) + e["weight"]
        p["capped"] = p["capped"] or bool(e.get("capped"))
        p["cells"].append(e)
    if spec["shard_tokens"]:
        n_shards = max(1, math.ceil(total_tokens / spec["shard_tokens"]))
    else:
        n_shards = max(1, math.ceil(total_rows / spec["shard_rows"]))
    return {"rows": total_rows, "sources": plan, "n_shards": n_shards, "tokens": total_tokens}


# ---------------------------------------------------------------- route and write


def _extra_columns(d: dict, n: int) -> dict[str, pa.Array]:
    """quality_score and quality_bucket (the source's quality attributes), topic and
    topic_score (its topic attributes) and lang (a language filter's), null where unset."""
    out = {"quality_score": pa.nulls(n, pa.float32()), "quality_bucket": pa.nulls(n, pa.int16()),
           "topic": pa.nulls(n, pa.string()), "topic_score": pa.nulls(n, pa.float32()), "lang": pa.nulls(n, pa.string())}
    for path in d["layers"]:  # each attribute by the columns its layer declares (shards/view.py QUALITY, TOPIC)
        names = fs.parquet_schema(path).names
        if view.QUALITY[0] in names:
            t = fs.read_table(path, columns=[c for c in view.QUALITY if c in names])
            out["quality_score"] = t.column("score").combine_chunks().cast(pa.float32())
            if "bucket" in names:
                out["quality_bucket"] = t.column("bucket").combine_chunks().cast(pa.int16())
        if all(c in names for c in view.TOPIC):
            t = fs.read_table(path, columns=list(view.TOPIC))
            out["topic"] = t.column("topic").combine_chunks().cast(pa.string())
            out["topic_score"] = t.column("topic_score").combine_chunks().cast(pa.float32())
        langs = [c for c in names if c.endswith(".lang")]
        if langs:
            out["lang"] = fs.read_table(path, columns=langs[:1]).column(0).combine_chunks().cast(pa.string())
    return out


class RouteSpec(TypedDict):
    """A `mix-route` shard (steps/mix/plan.py `route_shards`): one document shard and its cells' selections."""

    doc: DocShard  # with `axis_groups` when its source is weighted by an axis
    seed: int
    phases: str | list[dict]  # mix-select's decide/<source>.json: per phase, name, cells (budget.deciding), n_shards,
    # offset (its first output partition), or the list itself
    tokens: NotRequired[str]  # with a tokenize stage: the shard's token ids (tokenize-<source>)
    describe: str


@task(version=f"{shuffle.VERSION}.phases")  # per cell and phase
def route_shard(spec: RouteSpec, out) -> dict:
    """Every chosen (document, epoch) of every phase to its output partition: the phase's
    first partition + order % the phase's shards (one shuffle for all phases).
    Read-keyed (engine/cutoff.py): what it reads of the layers is the keep mask, the text
    and count overrides and the attributes the mixture files carry; an old shard whose dedup
    layer changed elsewhere (a new page joined one of its clusters) links its routes."""
    if isinstance(spec["phases"], str):  # mix-select's decide/<source>.json
        spec = {**spec, "phases": atomic.read_json(spec["phases"])}
    d, seed = spec["doc"], spec["seed"]
    n = view.num_rows(d["documents"])
    extra = _extra_columns(d, n)
    axes = cells.source_axes([c for ph in spec["phases"] for c in ph["cells"]])  # only axis cells read them
    values = {a: np.array(extra["lang"].to_pylist(), dtype=object) if a == "lang" else view.shard_axis(d, a)
              for a in axes} or None
    present = {a: v for a, v in (values or {}).items() if v is not None}
    read = pa.table({"axis" if len(axes) == 1 else a: pa.array(list(v), pa.string()) for a, v in present.items()}) \
        if present else None  # one axis: the column `axis` (the read keys routes always had)
    rk, state = readkey.shard(d, view.OVERRIDES, pa.table(extra), read)
    if (st := same_as_before(spec, out, rk)) is not None:
        return st
    bucket_all = extra["quality_bucket"]
    buckets = bucket_all.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64) if bucket_all.null_count < n else None
    topics = np.array(extra["topic"].to_pylist(), dtype=object) if extra["topic"].null_count < n else None
    parts, dests, chosen_any = [], [], 0
    tok = fs.read_table(spec["tokens"], columns=["row", "tokens"]) if spec.get("tokens") else None  # the shard's ids (tokenize-<source>)
    for rows, b in view.kept_batches(d["documents"], d["layers"], ["id", "text", "source", "source_id", "n_tokens"],
                                     state=state):
        ids = b.column("id").to_pylist()
        r = pa.array(rows)
        base = pa.table({"id": b.column("id"), "text": b.column("text"), "source": b.column("source"),
                         "source_id": b.column("source_id"), "n_tokens": b.column("n_tokens"),
                         **{k: v.take(r) for k, v in extra.items()}})
        if tok is not None:
            base = base.append_column("tokens", _token_ids(tok, rows, spec["tokens"]))
        anywhere = np.zeros(len(ids), bool)  # chosen in some phase (the ledger's kept)
        for ph in spec["phases"]:
            cl = ph["cells"]
            where = cells.index(cl, None if buckets is None else buckets[rows], len(ids), None if topics is None else topics[rows],
                                view.rows_of(values, rows))
            for pos, c in enumerate(cl):
                inside = np.flatnonzero(where == pos)
                if len(inside) == 0:
                    continue
                sub = base if len(inside) == len(ids) else base.take(pa.array(inside))
                sub_ids = ids if len(inside) == len(ids) else [ids[i] for i in inside]
                for e, mask in cell_epochs(c, seed, d["source"], sub_ids):
                    t = sub if mask is None else sub.filter(pa.array(mask))
                    if t.num_rows == 0:
                        continue
                    anywhere[inside if mask is None else inside[mask]] = True
                    chosen = sub_ids if mask is None else [i for i, m in zip(sub_ids, mask, strict=True) if m]
                    order = order_key(seed, d["source"], chosen, e)
                    parts.append(t.append_column("epoch", pa.array(np.full(t.num_rows, e, np.int32)))
                                 .append_column("order", pa.array(order))
                                 .append_column("cell", pa.array([c["name"] or d["source"]] * t.num_rows, pa.string())))
                    dests.append(ph["offset"] + (order % np.uint64(ph["n_shards"])).astype(np.int64))
        chosen_any += int(anywhere.sum())
    total = sum(ph["n_shards"] for ph in spec["phases"])
    rows = 0
    base = shuffle.map_file(fs.path(out.dir) / "to", out.index)
    b0 = shuffle.bytes_written()
    if parts:
        table = pa.concat_tables(parts)
        rows = table.num_rows
        shuffle.write_partitions(table, np.concatenate(dests), total, base)
    else:
        shuffle.write_empty(total, base)
    return {"rows": rows, "source": d["source"], "part": d["part"], "chosen_docs": chosen_any,
            "shuffle_bytes": shuffle.bytes_written() - b0, "partitions": total, "read_key": rk}


def _token_ids(tok: pa.Table, rows: np.ndarray, where: str) -> pa.Array:
    """The ids of some kept rows from their shard's `tokenize-<source>` file (row, tokens)."""
    have = tok.column("row").to_numpy()
    at = np.searchsorted(have, rows)
    if len(rows) and (np.any(at >= len(have)) or np.any(have[np.minimum(at, len(have) - 1)] != rows)):
        raise RuntimeError(f"{where} lacks the token ids of rows the mixture chose; its tokenize step is stale")
    return tok.column("tokens").take(pa.array(at)).combine_chunks()


class WriteSpec(TypedDict):
    """A `mix` shard (steps/mix/plan.py `write_shards`): one output partition of the route's shuffle."""

    inputs: str  # the route's (or its merge tier's) `to` folder
    maps: int | list[int]  # the files there (steps/merge.py read_from)
    partition: int
    phase: str | None
    file: str | None  # a phase's <phase>/part-XXXXX.parquet; None: this step's own part file
    describe: str


def write_shard(spec: WriteSpec, out) -> dict:
    t = shuffle.read_partition(spec["inputs"], spec["maps"], spec["partition"])
    final = fs.path(out.dir) / spec["file"] if spec.get("file") else out.path(".parquet")  # a phase's: <phase>/part-XXXXX
    per_source: dict[str, dict] = {}
    per_cell: dict[str, dict] = {}
    if t is None:
        t = MIX_SCHEMA.empty_table()
    else:
        t = t.sort_by(MIX_ORDER)
        # one grouping each (not a filter per cell or source: a shard may hold hundreds of cells)
        for r in t.group_by("cell").aggregate([("n_tokens", "sum"), ("n_tokens", "count", ALL)]).to_pylist():
            per_cell[r["cell"]] = {"docs": r["n_tokens_count"], "tokens": int(r["n_tokens_sum"] or 0)}
        t = t.drop_columns(["order", "cell"]).select(MIX_SCHEMA.names).cast(MIX_SCHEMA)
    atomic.write_table(t, final, compression="zstd", row_group_size=ROW_GROUP)
    if t.num_rows:
        g = t.select(["source", "n_tokens"]).append_column("repeat", pc.cast(pc.greater(t.column("epoch"), 0), pa.int64()))
        for r in g.group_by("source").aggregate([("n_tokens", "sum"), ("n_tokens", "count", ALL), ("repeat", "sum")]).to_pylist():
            per_source[r["source"]] = {"docs": r["n_tokens_count"], "tokens": int(r["n_tokens_sum"] or 0),
                                       "repeats": int(r["repeat_sum"] or 0)}
    size, sha = atomic.file_digest(final)
    langs = lang_counts(t.column("lang")) if t.num_rows else {}
    return {"rows": t.num_rows, "bytes": size, "sha256": sha, "file": spec.get("file") or final.name, "per_source": per_source,
            "phase": spec.get("phase"), "languages": dict(sorted(langs.items())),
            "per_cell": per_cell, "tokens": int(pc.sum(t.column("n_tokens")).as_py() or 0) if t.num_rows else 0}

