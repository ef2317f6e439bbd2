"""`curate explain RUN --id ID`: why one document was kept or removed, stage by stage.

Reads the run's step outputs, not the documents in memory: the source's id index
(`id-index-<source>`, pipeline/steps/ingest/idindex.py) finds the document's shard and row in a
few row groups of one file; the filter attributes of the same shard and
row say which filters it passed, with their scores, and which removed it; so do the dedup
attributes (`<step>/<source>/part-XXXXX.parquet`), with the survivor's id and, for a
near-duplicate, its cluster; the mix step's shard specs say which mixture file holds it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from pipeline.mixing import cells
from pipeline.errors import UsageError
from pipeline.engine.step import shard_name
from pipeline.io import atomic, fs
from pipeline.mixing import budget
from pipeline.shards import decisions, ledger
from pipeline.shards.ledger import filter_stage
from pipeline.steps.ingest import idindex


def _steps(run_dir: Path) -> dict:
    try:
        rj = atomic.read_json(run_dir / "run.json")
    except FileNotFoundError:
        raise UsageError(f"{run_dir}: not a run directory (no run.json); give the path `curate run` printed") from None
    return rj


def find(run_dir: Path, doc_id: str, stages=()) -> list[dict]:
    """Every document with this id (ids are unique within a source, not across sources);
    `stages` (plan/stage.py records) add the values their `explain` hooks show."""
    hooks = {st.name: st.explain for st in stages if st.explain is not None}
    rj = _steps(run_dir)
    steps = rj["steps"]
    out = []
    for source in decisions.sources_with(rj, "ingest"):
        st = steps[decisions.role_of(rj, "ingest", source)]
        d = fs.join(run_dir, st["dir"])
        index = steps.get(decisions.role_of(rj, "id_index", source) or "")
        if index and index.get("status") in ("SUCCESS", "SKIPPED"):  # a few row groups of one file
            for shard, row in idindex.lookup(fs.join(run_dir, index["dir"]), index["shards"], doc_id):
                part = d / f"{shard_name(shard)}.parquet"
                if _read_row(part, row, ["id"])["id"] == doc_id:  # a 64-bit hash may name another id
                    out.append(_explain_row(run_dir, rj, source, part, row, hooks))
            continue
        for part in sorted(d.glob("part-*.parquet")):  # a run from before the index: every shard's ids
            ids = fs.read_table(part, columns=["id"]).column("id")
            hits = pc.indices_nonzero(pc.equal(ids, doc_id)).to_pylist()
            for row in hits:
                out.append(_explain_row(run_dir, rj, source, part, row, hooks))
    return out


def _explain_row(run_dir: Path, rj: dict, source: str, part: Path, row: int, hooks: dict | None = None) -> dict:
    doc = _read_row(part, row, ["id", "source_id", "n_chars", "n_tokens", "text"])
    info = {"id": doc["id"], "source": source, "source_id": doc["source_id"], "n_chars": doc["n_chars"],
            "n_tokens": doc["n_tokens"], "excerpt": doc["text"][:200], "stages": [], "status": "kept"}
    info["stages"].append({"stage": "ingest", "result": "ok",
                           "shard": f"{rj['steps'][decisions.role_of(rj, 'ingest', source)]['dir']}/{part.name}"})
    filt = rj["steps"].get(decisions.role_of(rj, "filter", source) or "")
    if filt:
        fdir = fs.join(run_dir, filt["dir"])
        attrs = fs.read_table(fdir / part.name)
        rec = attrs.slice(row, 1).to_pylist()[0]
        step_cfg = atomic.read_json(fdir / "step.json")["config"]["filters"]
        for fname, params in step_cfg:
            scores = {k.split(".", 1)[1]: v for k, v in rec.items() if k.startswith(f"{fname}.") and v is not None}
            if "lang" in scores and "lang" not in info:  # the chain's language: its language cell
                info["lang"] = scores["lang"]
            if rec["stage"] == fname:
                info["stages"].append({"stage": filter_stage(fname), "result": "removed", "reason": rec["reason"], "scores": scores})
                info["status"] = "removed"
                info["removed_by"] = {"stage": filter_stage(fname), "reason": rec["reason"]}
                rule = _language_rule(params, rec["reason"])
                if rule is not None:  # per_language: the language whose parameters removed it, and those
                    info["removed_by"]["language_rule"] = rule
                break
            info["stages"].append({"stage": filter_stage(fname), "result": "kept", "scores": scores})
        if info["status"] == "kept" and rec.get("text") is not None:
            info["stages"].append({"stage": "text rewritten", "result": f"{doc['n_chars']:,} -> {rec['n_chars']:,} chars"})
            info["excerpt"] = rec["text"][:200]
            info["rewrite"] = _first_change(doc["text"], rec["text"])
    later: dict = {}  # every later layer's values of this row: a stage's mixture axis is one of them
    for stage, name in decisions.layer_names(rj, source):
        if stage == "filter":
            continue
        path = fs.join(run_dir, rj["steps"][name]["dir"]) / source / part.name
        if info["status"] != "kept":
            continue
        rec = fs.read_table(path).slice(row, 1).to_pylist()[0]
        later.update(rec)
        scores = {"score": rec["score"]} if rec.get("score") is not None else {}
        if rec.get("bucket") is not None:
            scores["bucket"] = info["quality_bucket"] = rec["bucket"]
        if rec.get("topic") is not None:
            scores["topic"] = info["topic"] = rec["topic"]
            scores["topic_score"] = rec["topic_score"]
        hook = (hooks or {}).get(stage.split(":")[0])  # a stage's layer (label `name` or `name:...`): its values
        if hook is not None:
            scores.update(hook(rec))
        if rec["keep"] is False:
            info["stages"].append({"stage": stage, "result": "removed", "reason": rec["reason"]})
            info["status"] = "removed"
            info["removed_by"] = {"stage": stage, "reason": rec["reason"]}
            if stage == "dedup:semantic":
                info["semantic"] = _semantic(run_dir, rj, rec)
            elif rec.get("cluster"):
                info["cluster"] = _cluster(run_dir, rj, rec["cluster"])
            if rec.get("eval_id") is not None:
                info["contamination"] = _contamination(run_dir, rj, part, row, rec)
        elif rec.get("cut_spans"):
            spans = rec["cut_spans"]
            info["stages"].append({"stage": stage, "result": f"kept, {len(spans)} repeated paragraph(s) cut "
                                   f"({rec['cut_chars']:,} chars; first kept in {spans[0]['kept_in']})"})
            info["excerpt"] = rec["text"][:200]
        elif rec.get("eval_id") is not None:  # decontaminate with action: cut
            info["stages"].append({"stage": stage, "result": f"kept, {rec['units_flagged']} contaminated unit(s) cut "
                                   f"({rec['eval_set']}:{rec['eval_id']}, overlap {rec['overlap']:.2f})"})
            info["contamination"] = _contamination(run_dir, rj, part, row, rec)
            if rec.get("text") is not None:
                info["excerpt"] = rec["text"][:200]
        else:
            info["stages"].append({"stage": stage, "result": "kept", "scores": scores})
    if info["status"] == "kept":
        info["mixture_file"], cell, phased = _mixture_file(run_dir, rj, source, doc["id"], info.get("quality_bucket"),
                                                           info.get("topic"), info.get("lang"), later)
        if cell is not None:
            info["cell"] = cell["name"] or source
        if info["mixture_file"] is None:
            info["status"] = "removed"
            why = budget.not_selected_reason(cell, phased) if cell else "not_selected"
            info["removed_by"] = {"stage": "mix", "reason": f"{why} (no weight names this cell)" if why != "not_selected"
                                  else "not_selected (down-sampled to meet the cell's token target)"}
    return info


def _contamination(run_dir: Path, rj: dict, part: Path, row: int, rec: dict) -> dict:
    """The eval item a removed document contains, its unit, and the n-grams they share."""
    from pipeline.steps import decontam

    ix = fs.join(run_dir, rj["steps"][decisions.role_of(rj, "decontaminate_index")]["dir"])
    found = fs.read_table(ix / "items" / "part-00000.parquet",
                          filters=[("set", "=", rec["eval_set"]), ("id", "=", rec["eval_id"])]).to_pylist()
    item = found[0] if found else {}
    doc = _read_row(part, row, ["text"])["text"]
    unit = doc[rec["unit_start"]:rec["unit_end"]]
    n = rj["config"]["decontaminate"]["ngram"]
    return {"eval_set": rec["eval_set"], "eval_id": rec["eval_id"], "eval_text": item.get("text"), "unit": unit,
            "overlap": rec["overlap"], "units_flagged": rec["units_flagged"],
            "shared_ngrams": decontam.shared_ngrams(unit, item.get("text") or "", n)[:20]}


def _cluster(run_dir: Path, rj: dict, cluster: str) -> dict | None:
    st = rj["steps"].get("dedup-fuzzy-clusters")
    if not st:
        return None
    t = fs.read_table(fs.join(run_dir, st["dir"]) / "clusters", filters=[("cluster", "=", cluster)])
    if not t.num_rows:
        return None
    return t.to_pylist()[0]


def _semantic(run_dir: Path, rj: dict, rec: dict) -> dict:
    """A semantic duplicate's cluster: its size, and the members it removed that share this
    document's closest earlier member, with their cosines (the reduce step's clusters/ files)."""
    out = {"cluster": rec["cluster"], "size": rec["cluster_size"], "of": rec["duplicate_of"], "cosine": rec["cosine"],
           "same": []}
    st = rj["steps"].get("dedup-semantic-reduce")
    try:
        t = fs.read_table(fs.join(run_dir, st["dir"]) / "clusters",
                          filters=[("cluster", "=", rec["cluster"]), ("duplicate_of", "=", rec["duplicate_of"])])
        out["same"] = [(r["id"], r["cosine"]) for r in t.to_pylist()]
    except (TypeError, FileNotFoundError):  # no reduce step in run.json, or its folder gone (gc)
        pass
    return out


def _read_row(path: Path, row: int, columns: list[str]) -> dict:
    """One row, reading only the row group that holds it."""
    pf = fs.parquet_file(path)
    for k in range(pf.metadata.num_row_groups):
        n = pf.metadata.row_group(k).num_rows
        if row < n:
            return pf.read_row_group(k, columns=columns).slice(row, 1).to_pylist()[0]
        row -= n
    raise IndexError(f"{path} has no row {row}")


def _language_rule(params: dict, reason: str | None) -> dict | None:
    """For a filter with per_language: the language key its reason names (`too_few_words:fr`)
    and that language's parameters that differ from the instance's own."""
    if not isinstance(params, dict) or params.get("per_language") is None or not reason or ":" not in reason:
        return None
    from filters import base as filter_base
    from filters import routing

    key = reason.rsplit(":", 1)[1]
    p = filter_base.parse_params(params)
    try:
        mine = routing.merged(p, routing.table(p), key).model_dump()
    except (ValueError, OSError):  # the file changed or is gone since the run
        return {"language": key}
    own = routing.merged(p, {}, "default").model_dump()
    return {"language": key, "parameters": {k: v for k, v in mine.items() if own.get(k) != v}}


def _first_change(old: str, new: str, before: int = 40, after: int = 100) -> dict:
    """The text around the first place a rewriter changed it: before and after."""
    from filters.rewrite import common_prefix

    i = common_prefix(old, new)
    k = max(0, i - before)
    return {"at": i, "before": old[k:i + after], "after": new[k:i + after]}


def _mixture_file(run_dir: Path, rj: dict, source: str, doc_id: str, bucket: int | None,
                  topic: str | None = None, lang: str | None = None, attrs: dict | None = None
                  ) -> tuple[str | None, dict | None, bool]:
    """Where the mixture holds this kept document, and its cell: recomputed from the
    selection (its priorities against its cell's cutoff) and the routing hash, as the mix
    steps did."""
    sel_step = rj["steps"].get(decisions.role_of(rj, "selection") or "")
    if not sel_step:
        return None, None, False
    marker = atomic.read_json(fs.join(run_dir, sel_step["dir"]) / "_markers" / "part-00000.json")
    phases = budget.phase_selections(marker)
    if phases[0][1]["sources"].get(source) is None:
        return "not in the mixture: the source is excluded", None, False
    seed = rj["config"]["seed"]
    places, cell = [], None
    for name, sel, _ in phases:
        cl = budget.source_cells(sel["sources"][source])
        got = {a: lang if a == "lang" else (attrs or {}).get(a) for a in cells.source_axes(cl)}
        c = cl[int(cells.index(cl, None if bucket is None else np.array([bucket]), 1,
                               None if topic is None else np.array([topic], dtype=object),
                               {a: np.array([None if v is None else str(v)], dtype=object) for a, v in got.items()})[0])]
        cell = cell or c
        epochs = [e for e, m in budget.cell_epochs(c, seed, source, [doc_id]) if m is None or m[0]]
        folder = f"mixture/{name}/" if name else "mixture/"
        places += [f"{folder}part-{int(budget.order_key(seed, source, [doc_id], e)[0] % sel['n_shards']):05d}.parquet"
                   + (f" (epoch {e})" if len(epochs) > 1 else "") for e in epochs]
    return (", ".join(places) or None), cell, phases[0][0] is not None


def render(infos: list[dict], doc_id: str, run_dir: Path | None = None) -> str:
    if not infos:
        led = fs.path(run_dir) / "ledger.json" if run_dir is not None else None
        unread = ledger.unread_files(atomic.read_json(led)) if led is not None and led.exists() else []
        return (f"no document with id {doc_id!r} in this run (ids are in mixture/*.parquet and the ingest steps' shards)"
                + (f"; it may be among the records never read: {ledger.describe_unread(unread)}" if unread else ""))
    lines = []
    for info in infos:
        lines.append(f"{info['id']}  source {info['source']}  ({info['source_id']}, {info['n_chars']:,} chars, "
                     f"{info['n_tokens'] if info['n_tokens'] is not None else '?'} tokens)")
        for st in info["stages"]:
            scores = ", ".join(f"{k}={_fmt(v)}" for k, v in (st.get("scores") or {}).items())
            extra = f" {st['reason']}" if st.get("reason") else ""
            where = f" [{st['shard']}]" if st.get("shard") else ""
            lines.append(f"  {st['stage']:<28} {st['result']}{extra}{('  (' + scores + ')') if scores else ''}{where}")
        if info["status"] == "removed":
            lines.append(f"  => removed at {info['removed_by']['stage']}: {info['removed_by']['reason']}")
            rule = info["removed_by"].get("language_rule")
            if rule:
                shown = ", ".join(f"{k}={_fmt(v) if not isinstance(v, (list, dict)) else v}" for k, v in
                                  (rule.get("parameters") or {}).items())
                lines.append(f"  by the rules of language {rule['language']}" + (f": {shown}" if shown else
                                                                                ": the instance's own parameters"))
            ct = info.get("contamination")
            if ct:
                lines.append(f"  eval item {ct['eval_set']}:{ct['eval_id']} (overlap {ct['overlap']:.2f}, "
                             f"{ct['units_flagged']} unit(s) flagged): {' '.join((ct['eval_text'] or '').split())[:300]!r}")
                lines.append(f"  the unit: {' '.join(ct['unit'].split())[:300]!r}")
                lines.append("  shared n-grams: " + "; ".join(ct["shared_ngrams"][:5]) + (" ..." if len(ct["shared_ngrams"]) > 5 else ""))
            sm = info.get("semantic")
            if sm:
                same = ", ".join(f"{i} ({c:.3f})" for i, c in sm["same"][:10]) + (" ..." if len(sm["same"]) > 10 else "")
                lines.append(f"  cluster {sm['cluster']} of {sm['size']:,} documents; closest earlier member {sm['of']} "
                             f"(cosine {sm['cosine']:.3f}); {len(sm['same'])} removed as its duplicates: {same}")
            cl = info.get("cluster")
            if cl:
                lines.append(f"  cluster of {cl['size']} (survivor first): " + ", ".join(cl["members"][:10])
                             + (" ..." if cl["size"] > 10 else ""))
        else:
            cell = f" (cell {info['cell']})" if info.get("cell") and info["cell"] != info["source"] else ""
            lines.append(f"  => kept, in {info.get('mixture_file') or 'the mixture'}{cell}")
        if info.get("rewrite"):
            rw = info["rewrite"]
            lines.append(f"  rewritten at character {rw['at']:,}:")
            lines.append(f"    before: {rw['before']!r}")
            lines.append(f"    after:  {rw['after']!r}")
        lines.append(f"  text: {info['excerpt']!r}")
    return "\n".join(lines)


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _source_tables(run, source: str):
    import pyarrow as pa



    schema = None
    for p in run.shards(source):
        t = decisions.shard_decisions(run, source, p)
        schema = t.schema
        yield t
    q = decisions.quarantined(run, source)
    if q:
        yield pa.Table.from_pylist([{k: v for k, v in r.items() if k != "error"} for r in q], schema=schema)


def write_all(run_dir: Path, out: Path) -> int:
    """`curate explain --all`: one row per input document (quarantined records included),
    streamed shard by shard into one Parquet file."""


    run = decisions.Run(run_dir)
    n = 0
    writer = None
    tmp = atomic.tmp_path(out)
    try:
        for source in run.all_sources:
            for t in _source_tables(run, source):  # one shard at a time
                if writer is None:
                    writer = atomic.parquet_writer(tmp, t.schema, compression="zstd")
                writer.write_table(t.cast(writer.schema))
                n += t.num_rows
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        raise UsageError(f"{run_dir}: the run has no ingested documents")
    atomic.commit(tmp, out)
    return n
