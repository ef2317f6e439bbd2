"""Filter: a source's filters, in order, over one document shard; decisions as attributes.

Writes `part-XXXXX.parquet` with the same rows in the same order as the document shard:

    id, keep, stage, reason, <filter>.<score>...

A document's first failing filter is its removal stage (the filter's name in the YAML)
and reason; later filters do not see it, so their scores are null for it. A rewriting
filter (a rewriter: filters/rewrite.py, or `c4_quality` with `rewrite: true`) hands its new text to the filters after it; the
shard then also gets `text` and `n_chars` columns, null where the text is unchanged,
which the mix step prefers to the document's own, and `rewritten_by` (the names of the
filters that changed it, comma-separated) for the sample browser. Token counts: ingest
leaves a filtered source's uncounted, and this step counts the documents its chain keeps,
with their final text (`n_tokens`, null for the removed: a crawl's filters drop most of
its pages, and the tokenizer was ~80% of ingest's CPU). The marker carries per-stage
counts (docs and chars in and out, tokens out of the last stage; removals by reason; what a rewriter changed:
`rewritten`, and `emptied_by_rewrite` for a document it emptied) for the ledger. Changing a
filter's parameters changes this step's hash, not ingest's; so do a filter type's
registered version, the libraries it calls and the user functions it names (plan/code.py).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, TypedDict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from filters import base as filter_base
from filters.web import EXTRACT_FILTER, EXTRACT_STAGE
from pipeline.plan import code, tokens
from pipeline.engine.step import Step, shard_name
from pipeline.io import atomic, fs
from pipeline.plan.stage import Stage, texts

if TYPE_CHECKING:  # a worker running the filter task does not load the config models
    from pipeline.plan.context import Context

BATCH_ROWS = 1024  # filters/words.py caches one batch of word lists


def plan(ctx: Context) -> list[Step]:
    """filter-<source> for every source with a filter chain; records each source's chain."""
    steps = []
    for sname, spec in ctx.mixture.sources.items():
        chain = ctx.chains[sname] = filter_chain(spec, ctx.extracts[sname])
        if not chain:
            continue
        ing = ctx.ingest[sname]
        fl = [(f, ctx.mixture.filters[f].model_dump(mode="json") if f != EXTRACT_STAGE else EXTRACT_FILTER)
              for f in chain]

        def filter_shards(st, stats, ing=ing, fl=fl) -> list[FilterSpec]:
            d = ing.dir(ctx.store)
            return [{"documents": str(d / f"{shard_name(i)}.parquet"), "filters": fl, "tokenizer": ctx.tokenizer,
                     "describe": f"{ing.name}/{shard_name(i)}"} for i in sorted(stats[ing.name])]

        files = {f"{n}.{k}": atomic.file_digest(fs.path(v))[1] for n, _ in fl if n != EXTRACT_STAGE
                 for k, v in filter_base.path_fields(ctx.mixture.filters[n]).items()}
        cfg = {"filters": fl, "files": files, "tokenizer": ctx.tokenizer_id, "count_tokens": True}  # this step counts tokens: in its hash, so no earlier output is reused
        used = code.filter_code(filter_base.parse_params(p) for _, p in fl)  # versions, libraries, user functions
        flt = Step(f"filter-{sname}", "filter", cfg, [ing], run_shard, shards=filter_shards, code=used)
        steps.append(flt)
        ctx.filter[sname] = flt
        ctx.declare("filter", flt, sname)
    return steps


def filter_chain(spec, extracts: bool) -> list[str]:
    """The stages of a source's filter step: `extract` first for web sources (it removes
    the records extraction gave no text: filters/web.py), then the YAML's filters."""
    return ([EXTRACT_STAGE] if extracts else []) + list(spec.filters)


STAGE = Stage("filter", plan, tasks=texts("filter"))


class FilterSpec(TypedDict):
    """A `filter-<source>` shard (filter.py `plan`): one ingest shard and the source's chain."""

    documents: str  # the ingest shard's Parquet file
    filters: list[list]  # [stage name, filter params] in chain order (`extract` first for web sources)
    tokenizer: str | None  # what the kept documents are counted with (plan/tokens.py)
    describe: str


def run_shard(spec: FilterSpec, out) -> dict:
    filters = [(name, filter_base.build(filter_base.parse_params(p))) for name, p in spec["filters"]]
    lid = None  # the chain's language filter so far: what routes a filter with per_language
    for (name, p), (_, flt) in zip(spec["filters"], filters):
        if getattr(flt, "routed", False):
            flt.routes_by = lid
        if p.get("type") == "language":
            lid = name
    pf = fs.parquet_file(spec["documents"])
    # tokens are unknown until the end of the chain, where the kept documents are counted
    stages = {name: {"docs_in": 0, "docs_out": 0, "chars_in": 0, "chars_out": 0, "tokens_in": None, "tokens_out": None,
                     "removed": {}} for name, _ in filters}
    if filters:
        stages[filters[-1][0]]["tokens_out"] = 0
    tables = []
    for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=["id", "text", "metadata", "n_chars", "n_tokens"]):
        tables.append(filter_batch(batch, filters, stages, spec.get("tokenizer")))
    table = pa.concat_tables(tables, promote_options="default") if tables else pa.table(
        {"id": pa.array([], pa.string()), "keep": pa.array([], pa.bool_()), "stage": pa.array([], pa.string()), "reason": pa.array([], pa.string())}
    )
    final = out.path(".parquet")
    atomic.write_table(table, final, compression="zstd")
    kept = int(pa.compute.sum(table.column("keep")).as_py() or 0)
    return {"rows": table.num_rows, "docs_in": table.num_rows, "docs_out": kept, "stages": stages,
            "languages": languages(table)}


def languages(table: pa.Table) -> dict[str, int]:
    """Documents per language of the shard's first language filter (for the report, so
    that it reads markers, not every shard's attributes)."""
    cols = [c for c in table.column_names if c.endswith(".lang")]
    if not cols:
        return {}
    vc = pa.compute.value_counts(table.column(cols[0]).drop_null())
    return {str(v["values"]): int(v["counts"]) for v in vc.to_pylist()}


def filter_batch(batch: pa.RecordBatch, filters, stages, tokenizer: str | None = None) -> pa.Table:
    """The chain over one batch. The documents it keeps are counted once, at the end, with
    their final text (the last stage's tokens_out); the ones a filter removes are never
    tokenized (ingest leaves a filtered source's n_tokens null)."""
    n = batch.num_rows
    keep = np.ones(n, dtype=bool)
    stage = [None] * n
    reason = [None] * n
    chars = batch.column("n_chars").to_numpy(zero_copy_only=False).copy()
    scores: dict[str, pa.ChunkedArray | pa.Array] = {}
    rewritten: dict[int, str] = {}  # row -> current text, once a filter rewrote it
    by: dict[int, list[str]] = {}  # row -> the filters that rewrote it
    work = batch  # the batch with the current texts: rebuilt once after each rewriter that changed something
    for name, flt in filters:
        idx = np.flatnonzero(keep)
        st = stages[name]
        st["docs_in"] += len(idx)
        st["chars_in"] += int(chars[idx].sum())
        if len(idx):
            sub = work if len(idx) == n else work.take(pa.array(idx))
            if getattr(flt, "routed", False) and flt.routes_by is not None:  # per_language: each row's detected language
                res = flt.apply(sub, scores[f"{flt.routes_by}.lang"].take(pa.array(idx)))
            else:
                res = flt.apply(sub)
            if res.texts is not None:  # a rewriter that empties a document removes it
                for local, t in enumerate(res.texts):
                    if t is not None and res.keep[local] and not t.strip():
                        res.keep[local] = False
                        res.reasons[local] = "emptied_by_rewrite"
                _count_changes(st, res)
            dropped = idx[~res.keep]
            for local in np.flatnonzero(~res.keep):
                i = idx[local]
                r = res.reasons[local] or "removed"
                stage[i] = name
                reason[i] = r
                st["removed"][r] = st["removed"].get(r, 0) + 1
            keep[dropped] = False
            if res.texts is not None:
                changed = _apply_rewrites(res, idx, rewritten, chars)
                for i in changed:
                    by.setdefault(i, []).append(name)
                if changed:  # only the rows this rewriter changed are replaced in the current texts
                    rows = sorted(changed)
                    j = work.schema.get_field_index("text")
                    mask = np.zeros(n, dtype=bool)
                    mask[rows] = True
                    new = pa.array([rewritten[i] for i in rows], work.schema.field(j).type)
                    work = work.set_column(j, "text", pc.replace_with_mask(work.column(j), pa.array(mask), new))
            if res.scores:  # back to batch rows; rows this filter did not see point at a trailing null
                pos = np.full(n, len(idx))
                pos[idx] = np.arange(len(idx))
                where = pa.array(pos)
                for key, arr in res.scores.items():
                    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
                    scores[f"{name}.{key}"] = pa.concat_arrays([arr, pa.nulls(1, arr.type)]).take(where)
        kept_idx = np.flatnonzero(keep)
        st["docs_out"] += len(kept_idx)
        st["chars_out"] += int(chars[kept_idx].sum())
    kept_idx = np.flatnonzero(keep)
    toks = np.zeros(n, np.int64)
    if filters and len(kept_idx):
        last = stages[filters[-1][0]]
        c0 = time.process_time()
        got = tokens.count(tokenizer, work.column("text").take(pa.array(kept_idx)).to_pylist())
        last["tokenizer_seconds"] = last.get("tokenizer_seconds", 0.0) + time.process_time() - c0
        toks[kept_idx] = got if got is not None else 0
        last["tokens_out"] += int(toks[kept_idx].sum())
    cols = {
        "id": batch.column("id"),
        "keep": pa.array(keep, pa.bool_()),
        "stage": pa.array(stage, pa.string()),
        "reason": pa.array(reason, pa.string()),
    }
    if rewritten:
        cols["text"] = pa.array([rewritten.get(i) for i in range(n)], pa.string())
        cols["n_chars"] = pa.array([int(chars[i]) if i in rewritten else None for i in range(n)], pa.int64())
        cols["rewritten_by"] = pa.array([",".join(by[i]) if i in rewritten else None for i in range(n)], pa.string())
    if tokenizer is not None:  # every kept document's count (null for the removed: never tokenized)
        mask = np.zeros(n, bool)
        mask[kept_idx] = True
        cols["n_tokens"] = pa.array(toks, pa.int64(), mask=~mask)
    cols.update(scores)
    return pa.table(cols)


def _count_changes(st: dict, res) -> None:
    """A rewriter's changes on the documents it keeps, summed into its stage's counts:
    documents rewritten and, per kind, the rewriter's own counts (spans, characters...)."""
    kept = res.keep & np.array([t is not None for t in res.texts], bool)
    rw = st.setdefault("rewritten", {"docs": 0})
    rw["docs"] += int(kept.sum())
    for kind, per_row in (res.changes or {}).items():
        rw[kind] = rw.get(kind, 0) + int(np.asarray(per_row)[res.keep].sum())


def _apply_rewrites(res, idx, rewritten: dict, chars) -> list[int]:
    """Record a rewriter's new texts of the rows it keeps; returns those rows."""
    changed = [(int(idx[local]), t) for local, t in enumerate(res.texts) if t is not None and res.keep[local]]
    for i, t in changed:
        rewritten[i] = t
        chars[i] = len(t)
    return [i for i, _ in changed]
