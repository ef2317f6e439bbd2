"""What the mix stage publishes into the run directory: mixture/ (hard links into the mix
step, copies across filesystems) and the body of manifest.json, counted from the mix
tasks' markers (the driver reads no mixture file)."""

from __future__ import annotations

from pipeline.io import atomic
from pipeline.mixing import budget as bm
from pipeline.mixing import cells
from pipeline.plan.context import Context


def publish(ctx: Context, stats: dict) -> dict:
    """mixture/ (links to the mix step's files) and manifest.json's body: per source and
    cell, target and realised tokens and weights, epochs; per file rows, bytes, sha256."""
    mix_dir = ctx.mix.write.dir(ctx.store)
    markers = stats[ctx.mix.write.name]
    files, pairs = [], []
    for i in sorted(markers):
        m = markers[i]
        pairs.append((mix_dir / m["file"], m["file"]))
        files.append({"path": f"mixture/{m['file']}", "rows": m["rows"], "tokens": m["tokens"], "bytes": m["bytes"],
                      "sha256": m["sha256"], **({"languages": m["languages"]} if "languages" in m else {})})
    atomic.link_tree(pairs, ctx.run_dir / "mixture")
    per_source = mixed_per_source(markers)
    total = sum(v["tokens"] for v in per_source.values()) or 1
    phases = bm.phase_selections(stats[ctx.mix.select.name][0])
    selection = phases[0][1]["sources"]  # with phases: the first's (availability is every phase's)
    named = phases[0][0] is not None
    chosen = chosen_docs(stats[ctx.mix.route.name]) if named else {}
    weights = ctx.mix.phases[0]["weights"]  # per cell of the first phase, normalised when `mixture.normalize`
    sources = {}
    for sname, sel in selection.items():
        v = per_source.get(sname, {"docs": 0, "tokens": 0, "repeats": 0})
        sources[sname] = {
            "weight": round(sum(c.get("weight") or 0.0 for c in bm.source_cells(sel)), 12)
            if weights is not None and not named else None,
            "available_tokens": sel["available"], "available_docs": sel["available_docs"],
            "target_tokens": sum(ph["sources"][sname]["target"] for _, ph, _ in phases),
            "realized_tokens": v["tokens"], "realized_weight": round(v["tokens"] / total, 6),
            "docs": v["docs"], "distinct_docs": chosen.get(sname, 0) if named else sel["distinct_docs"],
            "docs_repeated": v["repeats"],
            "epochs": round(v["tokens"] / sel["available"], 6) if sel["available"] else 0.0,
            "capped": any(ph["sources"][sname].get("capped", False) for _, ph, _ in phases),
        }
    extra = {}
    if named:  # per phase: its files, tokens and cells, summed in one pass over the markers (not a dict of them a phase)
        by_phase: dict[str, dict] = {name: {"tokens": 0, "docs": 0, "files": [], "realized": {}} for name, _, _ in phases}
        for i, f in zip(sorted(markers), files, strict=True):
            m = markers[i]
            acc = by_phase[m.get("phase")]
            acc["tokens"] += m["tokens"]
            acc["docs"] += m["rows"]
            acc["files"].append(f)
            _realize(acc["realized"], m)
        targets = {p.name: p.target_tokens for p in ctx.mixture.mixture.phases}
        extra["phases"] = {name: {"target_tokens": targets[name], "total_tokens": by_phase[name]["tokens"],
                                  "total_docs": by_phase[name]["docs"], "files": by_phase[name]["files"],
                                  "cells": _cells_of(by_phase[name]["realized"], sel["sources"], by_phase[name]["tokens"] or 1)}
                           for name, sel, _ in phases}
    return {
        "name": ctx.mixture.name, "config_hash": ctx.lm.config_hash(), "seed": ctx.mixture.seed,
        "cells": _cells(markers, selection, total) if not named else {}, **extra,
        "target_tokens": ctx.mixture.mixture.target_tokens, "step": ctx.step_ref(ctx.mix.write),
        "step_hash": ctx.mix.write.hash, "steps": {s.name: s.hash for s in ctx.steps}, "sources": sources,
        "total_docs": sum(f["rows"] for f in files), "total_tokens": sum(v["tokens"] for v in per_source.values()),
        "files": files,
    }


def mixed_per_source(markers: dict[int, dict]) -> dict[str, dict]:
    """Rows (repeats included), tokens and repeated rows each source has in the mixture."""
    per_source: dict[str, dict] = {}
    for m in markers.values():
        for s, v in m["per_source"].items():
            agg = per_source.setdefault(s, {"docs": 0, "tokens": 0, "repeats": 0})
            for k in agg:
                agg[k] += v.get(k, 0)
    return per_source


def chosen_docs(route_markers: dict) -> dict[str, int]:
    """Per source, the documents chosen in at least one phase (the route tasks count them)."""
    out: dict[str, int] = {}
    for m in route_markers.values():
        out[m["source"]] = out.get(m["source"], 0) + m.get("chosen_docs", 0)
    return out


def _realize(realized: dict, m: dict) -> None:
    """Add one mixture shard's documents and tokens per cell (its marker's) to `realized`."""
    for name, v in (m.get("per_cell") or {}).items():
        r = realized.setdefault(name, {"docs": 0, "tokens": 0})
        r["docs"] += v["docs"]
        r["tokens"] += v["tokens"]


def _cells(markers: dict, selection: dict, total: int) -> dict:
    """Per cell: target and realised weight, tokens, documents (rows), distinct documents
    and epochs (realised tokens over the cell's kept tokens), counted in the mixture files."""
    realized: dict[str, dict] = {}
    for m in markers.values():
        _realize(realized, m)
    return _cells_of(realized, selection, total)


def _cells_of(realized: dict, selection: dict, total: int) -> dict:
    out = {}
    for sname, sel in selection.items():
        for c in bm.source_cells(sel):
            name = c["name"] or sname
            r = realized.get(name, {"docs": 0, "tokens": 0})
            out[name] = {"source": sname, "buckets": [c["lo"], c["hi"]] if c["lo"] is not None else None,
                         "topic": c.get("topic"), **{a: v for a, v, _ in cells.cell_axes(c)},  # lang=fr: "lang": "fr"
                         "target_weight": c.get("weight"), "realized_weight": round(r["tokens"] / total, 6),
                         "target_tokens": c["target"], "tokens": r["tokens"], "documents": r["docs"],
                         "distinct_documents": c["distinct_docs"], "available_tokens": c["available"],
                         "epochs": round(r["tokens"] / c["available"], 6) if c["available"] else 0.0}
    return out
