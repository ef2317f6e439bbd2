"""`report.json` and `report.html`: what a run did, in numbers and plots.

report.json holds the numbers: per source the funnel (documents and tokens after ingest
and after every stage, from the ledger), removals by stage and reason, the quality score
histogram with its threshold, the language distribution, the target and realised mixture
weights (from the manifest), the run time of every step, and the input files that were cut
or unreadable (ledger conservation "unknown"; first on the page). report.html shows the same
numbers as tables and bar charts inlined as SVG (pipeline/views/plots.py), in one self-contained page.
Score histograms and language counts are summed from the shard markers (the quality and
filter tasks count them), so the driver reads one file per step, never a column per document.
"""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np

from pipeline.shards import decisions as dec
from pipeline.shards import ledger
from pipeline.io import html as pages
from pipeline.views import plots
from pipeline.engine.step import read_markers
from pipeline.io import atomic, fs
from pipeline.steps.classify import quality
from pipeline.steps import filter as filter_step

BINS = quality.HIST_BINS


def _quality(run: dec.Run, source: str) -> dict | None:
    qdir = run.role_dir("quality", source)
    if not qdir:
        return None
    marks = read_markers(qdir)
    summed = _summed(marks.values(), ("score_histogram", "bucket_seen", "bucket_docs", "bucket_tokens"))
    if marks and summed.get("score_histogram") is not None and len(summed["score_histogram"]) == BINS:
        counts = summed["score_histogram"]
    else:  # a step cached before its markers carried histograms: what its tasks would have counted
        counts = np.zeros(BINS, np.int64)
        for f in sorted((qdir / source).glob("part-*.parquet")):
            t = fs.read_table(f, columns=["keep", "score"])
            counts += quality.score_histogram(t.filter(t.column("keep").is_valid()).column("score").to_numpy())
    thr = read_markers(run.role_dir("quality_threshold", source))[0]
    out = {"bins": [round(i / BINS, 4) for i in range(BINS + 1)], "counts": counts.tolist(),
           "threshold": thr["threshold"] if thr["kind"] != "none" else None, "kind": thr["kind"], "documents": int(counts.sum())}
    if thr.get("bucket_keys"):  # quantile buckets: each edge's score, what `edges:` takes to fix them (docs/classifiers.md)
        out["bucket_edges"] = [float(np.array([int(k) >> 32], np.uint32).view(np.float32)[0]) for k in thr["bucket_keys"]]
    if marks and summed.get("bucket_seen") is not None:  # per quality bucket: reached the stage, kept
        out["buckets"] = {"reached": summed["bucket_seen"].tolist(), "kept": summed["bucket_docs"].tolist(),
                          "kept_tokens": summed["bucket_tokens"].tolist()}
    return out


def _summed(markers, keys: tuple[str, ...]) -> dict[str, np.ndarray | None]:
    """Each key's arrays summed over the markers in one pass (None: a marker lacks it, or its
    length differs): the driver holds the sums, not a list a shard (a step of 10^5 shards)."""
    acc: dict[str, np.ndarray | None] = {}
    for m in markers:
        for k in keys:
            if k in acc and acc[k] is None:
                continue
            v = m.get(k)
            if v is None or (k in acc and len(v) != len(acc[k])):
                acc[k] = None
            elif k in acc:
                acc[k] += np.asarray(v, np.int64)
            else:
                acc[k] = np.array(v, np.int64)
    return acc


def _topics(run: dec.Run, source: str) -> dict | None:
    """Kept documents and tokens per (topic, quality bucket) of a source with a topic classifier."""
    d = run.role_dir("topic", source)
    if not d:
        return None
    cells: dict[str, dict[str, list[int]]] = {}
    titles: dict[str, list] = {}
    for m in read_markers(d).values():
        for topic, bucket, docs, toks in m.get("groups", []):
            c = cells.setdefault(topic, {}).setdefault(f"q{bucket}" if bucket > 0 else "all", [0, 0])
            c[0] += docs
            c[1] += toks
        for topic, ts in (m.get("titles") or {}).items():  # embedding clusters: each shard's first titles by hash
            titles[topic] = sorted(titles.get(topic, []) + ts)[:3]
    out = {t: {b: {"documents": v[0], "tokens": v[1]} for b, v in sorted(bs.items(), key=lambda kv: (len(kv[0]), kv[0]))}
           for t, bs in sorted(cells.items(), key=lambda kv: _topic_order(kv[0]))}
    for t, ts in titles.items():
        if t in out:
            out[t]["titles"] = [x for _, x in ts]
    return out


def _topic_order(t: str):
    """Clusters c0, c1, ..., c10 in number order; other topics by name."""
    return (0, int(t[1:]), "") if t[:1] == "c" and t[1:].isdigit() else (1, 0, t)


def _languages(run: dec.Run, source: str) -> dict[str, int]:
    fdir = run.role_dir("filter", source)
    marks = read_markers(fdir) if fdir else {}
    if marks and all("languages" in m for m in marks.values()):
        per_shard = (m["languages"] for m in marks.values())  # a second pass, not a list a shard
    else:  # a step cached before its markers carried languages: what its tasks would have counted
        per_shard = [filter_step.languages(fs.read_table(f, columns=[c for c in fs.parquet_schema(f).names
                                                                     if c.endswith(".lang")]))
                     for f in sorted(fdir.glob("part-*.parquet"))] if fdir else []
    out: dict[str, int] = {}
    for counts in per_shard:
        for k, v in counts.items():
            out[k] = out.get(k, 0) + v
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def _by_language(removed: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Removals by the language whose rules removed them (a per_language filter's reasons end
    in `:<lang>`, or `:default`: filters/routing.py): language -> "<stage> <reason>" -> documents."""
    import re

    key = re.compile(r"^[a-z]{2,3}(_[A-Z][a-z]{3})?$|^default$")
    out: dict[str, dict[str, int]] = {}
    for stage, reasons in removed.items():
        for r, n in (reasons or {}).items():
            head, sep, lang = r.rpartition(":")
            if sep and key.match(lang) and not head.startswith(("wrong_language", "cell_weight_0")):
                out.setdefault(lang, {})[f"{stage} {head}"] = n
    return dict(sorted(out.items(), key=lambda kv: -sum(kv[1].values())))


def _rewritten(stages: list[dict]) -> dict[str, dict[str, int]]:
    """stage -> what it changed in the text of the documents it kept: a rewriter's counts
    (documents rewritten, then per kind), paragraph dedup's and decontamination's cuts."""
    out = {}
    for st in stages:
        rw = dict(st.get("rewritten") or {})
        rw.update({k: st[k] for k in ("docs_rewritten", "paragraphs_cut", "chars_cut") if st.get(k)})
        if rw:
            out[st["stage"]] = rw
    return out


def build(run_dir: Path, stages=()) -> dict:
    """report.json's figures; `stages` (plan/stage.py records) add theirs (`Stage.report`)."""
    run = dec.Run(run_dir)
    led = atomic.read_json(run_dir / "ledger.json")
    man = atomic.read_json(run_dir / "manifest.json")
    sources = {}
    for s, e in led["sources"].items():
        sources[s] = {
            "in": e["in"], "kept": e["kept"], "removed": e["removed_total"], "quarantined": e["quarantined"],
            "conservation": e["conservation"],
            "funnel": [{"stage": st["stage"], "docs": st["docs_out"], "tokens": st.get("tokens_out")} for st in e["stages"]],
            "removed_by_reason": e["removed"], "quality": _quality(run, s), "languages": _languages(run, s),
            "removed_by_language": _by_language(e["removed"]),
            "topics": _topics(run, s), "rewritten": _rewritten(e["stages"]),
            "mixture": man["sources"].get(s),
            "extraction": e.get("extraction"), "skipped_records": e["stages"][0].get("skipped_records"),
        }
        figures = {st.name: f for st in stages if st.report is not None and (f := st.report(run, s)) is not None}
        if figures:  # only then: a run whose stages report nothing of their own keeps its report.json
            sources[s]["stages"] = figures
    steps = {k: {"status": v["status"], "seconds": v.get("seconds"), "shards": v.get("shards")} for k, v in run.steps.items()}
    return {"name": run.record["name"], "status": run.record["status"], "seconds": run.record.get("seconds"),
            "config_hash": run.record["config_hash"], "sources": sources, "totals": led["totals"],
            "conservation": led["conservation"], "unread_files": ledger.unread_files(led),
            "mixture": {"total_tokens": man["total_tokens"], "total_docs": man["total_docs"], "files": len(man["files"]),
                        "target_tokens": man.get("target_tokens")},
            "steps": steps, "contamination": _contamination(run), "cells": _cells(man, sources),
            "phases": {name: {"target_tokens": ph["target_tokens"], "total_tokens": ph["total_tokens"],
                              "total_docs": ph["total_docs"], "files": len(ph["files"]), "cells": ph["cells"]}
                       for name, ph in (man.get("phases") or {}).items()} or None}


def _cells(man: dict, sources: dict) -> dict | None:
    """The mixture's cells (pipeline/mixing/cells.py) and, per bucketed source, the documents that
    reached quality, were kept and were mixed, per bucket; None when no source has cells."""
    cells = man.get("cells") or {}
    if all(name == c["source"] for name, c in cells.items()):  # every cell a whole source: the mixture table says it
        return None
    return {"cells": cells, "buckets": {s: e["quality"]["buckets"] for s, e in sources.items()
                                        if e.get("quality") and e["quality"].get("buckets")}}


def _contamination(run: dec.Run) -> dict | None:
    """Per train source and eval set, the documents and units flagged and n-grams matched; per
    eval set, how many of its items were found anywhere (summed from the markers)."""
    d, ix = run.role_dir("decontaminate"), run.role_dir("decontaminate_index")
    if d is None or ix is None:
        return None
    sets = read_markers(ix)[0]["sets"]
    by_source: dict[str, dict] = {}
    hit: set[int] = set()
    for m in read_markers(d).values():
        for es, c in m.get("contamination", {}).items():
            e = by_source.setdefault(m["source"], {}).setdefault(es, {"documents": 0, "units": 0, "ngrams": 0})
            for k in e:
                e[k] += c[k]
        hit.update(m.get("items_hit", []))
    import pyarrow.compute as pc

    owner = fs.read_table(ix / "items" / "part-00000.parquet", columns=["set"]).column("set")
    found = {es: 0 for es in sets}
    if hit:
        for es, n in zip(*pc.value_counts(owner.take(sorted(hit))).flatten(), strict=True):
            found[es.as_py()] = n.as_py()
    return {"by_source": by_source,
            "eval_sets": {es: {**v, "items_found": found[es], "share_found": round(found[es] / v["items"], 6) if v["items"] else 0.0}
                          for es, v in sets.items()}}


def _plots(rep: dict) -> dict[str, str]:
    out = {}
    for s, e in rep["sources"].items():
        out[f"funnel-{s}"] = plots.hbar(f"{s}: funnel", [f["stage"] for f in e["funnel"]], [f["docs"] for f in e["funnel"]],
                                        "documents after the stage")
        q = e["quality"]
        if q:
            out[f"scores:{s}"] = plots.histogram(f"{s}: quality scores of the documents that reached the stage",
                                                  q["bins"], q["counts"], q["threshold"], "quality score")
    if rep.get("cells"):
        cl = rep["cells"]["cells"]
        out["cells"] = plots.grouped(
            "mixture cells (token shares)", list(cl),
            {"target weight": [v["target_weight"] or 0 for v in cl.values()],
             "realised weight": [v["realized_weight"] for v in cl.values()]}, ["#bbb", "#4a7fb5"])
    mixed = {s: e["mixture"] for s, e in rep["sources"].items() if e["mixture"]}
    if mixed:
        out["weights"] = plots.grouped(
            "mixture weights (token shares)", list(mixed),
            {"target weight": [v["weight"] if v["weight"] is not None else 0 for v in mixed.values()],
             "realised weight": [v["realized_weight"] for v in mixed.values()]}, ["#bbb", "#4a7fb5"])
    return out


def _figures(fig: dict) -> str:
    """A stage's figures as a table: a row a key; a value that is a dict gives a column a key of it."""
    cols = sorted({c for v in fig.values() if isinstance(v, dict) for c in v})
    if not cols:
        return _table(["", "value"], [[k, v] for k, v in fig.items()])
    return _table(["", *cols], [[k, *(v.get(c) for c in cols)] if isinstance(v, dict) else [k, v] for k, v in fig.items()])


def _table(head: list[str], rows: list[list]) -> str:
    h = "".join(f"<th>{html.escape(str(c))}</th>" for c in head)
    b = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{h}</tr>{b}</table>"


def _fmt(v) -> str:
    if isinstance(v, bool) or v is None:
        return "" if v is None else str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _unknown_loss(rep: dict) -> list[str]:
    """The files cut or unreadable, first on the page: the run finished, but not every record was counted."""
    files = rep.get("unread_files")
    if not files:
        return []
    n = len(files)
    return [f"<p class='warn'>Unknown loss: {n} input file{'s were' if n > 1 else ' was'} cut or could not be read; the records "
            "after the damage were neither read nor counted (ledger conservation: unknown). Re-fetch or repair "
            f"{'them' if n > 1 else 'it'} and run again; <code>curate publish</code> refuses this run without "
            "<code>--allow-unknown-loss</code>.</p>",
            _table(["source", "file", "error"], [[f["source"], f["file"] or "(path not recorded)", f["error"]] for f in files])]


def render(rep: dict) -> str:
    plots = _plots(rep)
    parts = [f"<h1>Run {html.escape(rep['name'])}: {html.escape(rep['status'])}</h1>",
             f"<p class='meta'>config {rep['config_hash'][:12]}, {rep['seconds'] or 0:.0f} s; mixture: "
             f"{rep['mixture']['total_docs']:,} rows, {rep['mixture']['total_tokens']:,} tokens in {rep['mixture']['files']} files</p>",
             *_unknown_loss(rep),
             "<h2>Sources</h2>",
             _table(["source", "in", "kept", "removed", "quarantined", "balanced"],
                    [[s, e["in"], e["kept"], e["removed"], e["quarantined"], e["conservation"]] for s, e in rep["sources"].items()])]
    if "weights" in plots:
        parts += ["<h2>Mixture</h2>", plots["weights"],
                  _table(["source", "weight", "available tokens", "target tokens", "realised tokens", "realised weight", "epochs"],
                         [[s, e["mixture"]["weight"], e["mixture"]["available_tokens"], e["mixture"]["target_tokens"],
                           e["mixture"]["realized_tokens"], e["mixture"]["realized_weight"], e["mixture"]["epochs"]]
                          for s, e in rep["sources"].items() if e["mixture"]])]
    if rep.get("cells"):
        cl = rep["cells"]["cells"]
        parts += ["<h3>Cells (a source, or a range of its quality buckets, or a topic)</h3>",
                  plots["cells"],
                  _table(["cell", "topic, buckets", "target weight", "realised weight", "available tokens", "target tokens",
                          "realised tokens", "rows", "distinct documents", "epochs"],
                         [[k, (v.get("topic") + " " if v.get("topic") else "") + (f"q{v['buckets'][0]}-q{v['buckets'][1]}" if v["buckets"] else "all"), v["target_weight"],
                           v["realized_weight"], v["available_tokens"], v["target_tokens"], v["tokens"], v["documents"],
                           v["distinct_documents"], v["epochs"]] for k, v in cl.items()])]
    for name, ph in (rep.get("phases") or {}).items():
        parts += [f"<h2>Phase {html.escape(name)}</h2>",
                  f"<p class='meta'>{ph['total_docs']:,} rows, {ph['total_tokens']:,} tokens (target {ph['target_tokens'] or 0:,}) "
                  f"in {ph['files']} files under mixture/{html.escape(name)}/</p>",
                  _table(["cell", "target weight", "realised weight", "available tokens", "target tokens", "realised tokens",
                          "rows", "distinct documents", "epochs"],
                         [[k, v["target_weight"], v["realized_weight"], v["available_tokens"], v["target_tokens"], v["tokens"],
                           v["documents"], v["distinct_documents"], v["epochs"]] for k, v in ph["cells"].items()])]
    for s, e in rep["sources"].items():
        parts += [f"<h2>{html.escape(s)}</h2>", plots[f"funnel-{s}"],
                  _table(["stage", "documents", "tokens"], [[f["stage"], f["docs"], "not counted" if f["tokens"] is None else f["tokens"]] for f in e["funnel"]])]
        for name, fig in (e.get("stages") or {}).items():  # a stage's own figures (Stage.report)
            parts += [f"<h3>{html.escape(name)}</h3>", _figures(fig)]
        x = e.get("extraction")
        if x:
            rate = x["pages"] / x["cpu_seconds"] if x["cpu_seconds"] else None
            skipped = ", ".join(f"{k} {v:,}" for k, v in (e.get("skipped_records") or {}).items()) or "none"
            parts += ["<h3>Extraction (HTML to text)</h3>",
                      _table(["extractor", "pages", "extractor CPU seconds", "pages/s per core", "timeouts", "errors", "crashes",
                              "records that are not documents"],
                             [[x["extractor"], x["pages"], x["cpu_seconds"], rate, x["timeouts"], x["errors"], x["crashes"], skipped]])]
        rw = e.get("rewritten")
        if rw:
            parts += ["<h3>Text changed, by stage (documents kept; samples marked in samples/index.html)</h3>",
                      _table(["stage", "change", "count"], [[stage, k, n] for stage, v in rw.items() for k, n in v.items()])]
        rows = [[stage, reason, n] for stage, reasons in e["removed_by_reason"].items() for reason, n in reasons.items()]
        if rows:
            parts += ["<h3>Removed, by stage and reason</h3>", _table(["stage", "reason", "documents"], rows)]
        if f"scores:{s}" in plots:
            parts += ["<h3>Quality scores</h3>", plots[f"scores:{s}"]]
        qb = (e.get("quality") or {}).get("buckets")
        if qb:
            parts += ["<h3>Quality buckets (exact quantiles of the score within the source)</h3>",
                      _table(["bucket", "reached quality", "kept", "kept tokens"],
                             [[f"q{i + 1}", a, b, t] for i, (a, b, t) in enumerate(zip(qb["reached"], qb["kept"], qb["kept_tokens"]))])]
        tp = e.get("topics")
        if tp:
            cols = sorted({b for v in tp.values() for b in v if b != "titles"}, key=lambda b: (len(b), b))
            parts += ["<h3>Kept tokens by topic x quality bucket (before the mixture's weights)</h3>",
                      _table(["topic", *cols], [[t, *[v.get(b, {}).get("tokens", 0) for b in cols]] for t, v in tp.items()])]
            if any("titles" in v for v in tp.values()):
                parts += ["<h3>Embedding clusters: size and three titles (kept train documents)</h3>",
                          _table(["cluster", "documents", "titles"],
                                 [[t, sum(x["documents"] for b, x in v.items() if b != "titles"), " | ".join(v.get("titles", []))]
                                  for t, v in tp.items()])]
        if e["languages"]:
            parts += ["<h3>Languages (language ID's best label)</h3>",
                      _table(["language", "documents"], list(e["languages"].items())[:15])]
        if e.get("removed_by_language"):
            parts += ["<h3>Removals by the language whose rules removed them (per_language filters)</h3>",
                      _table(["language", "documents removed", "stage and reason: documents"],
                             [[lang, sum(v.values()), "; ".join(f"{k}: {n:,}" for k, n in sorted(v.items(), key=lambda kv: -kv[1]))]
                              for lang, v in list(e["removed_by_language"].items())[:20]])]
    c = rep.get("contamination")
    if c:
        parts += ["<h2>Contamination</h2>",
                  _table(["eval set", "items", "items found in the corpus", "share", "n-grams indexed", "items too short to check"],
                         [[es, v["items"], v["items_found"], v["share_found"], v["ngrams"], v["too_short"]] for es, v in c["eval_sets"].items()]),
                  _table(["source", "eval set", "documents removed", "units flagged", "n-grams matched"],
                         [[s, es, v["documents"], v["units"], v["ngrams"]] for s, sets in c["by_source"].items() for es, v in sets.items()])]
    parts += ["<h2>Steps</h2>", _table(["step", "status", "shards", "seconds"],
                                       [[k, v["status"], v["shards"], v["seconds"]] for k, v in rep["steps"].items()])]
    return pages.page(f"Curate run {rep['name']}", "\n".join(parts),
                      style="svg { max-width: 100%; height: auto; } .warn { color: #a40; font-weight: 600; }")


def write(run_dir: Path, stages=()) -> Path:
    rep = build(run_dir, stages)
    atomic.write_json(run_dir / "report.json", rep)
    atomic.write_bytes(run_dir / "report.html", render(rep).encode("utf-8"))
    return run_dir / "report.html"
