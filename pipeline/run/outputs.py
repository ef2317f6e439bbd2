"""The ledger of a finished run, assembled from its markers: per source, every document in
is kept, removed by a stage with a reason, or quarantined (pipeline/shards/ledger.py does
the arithmetic). The stages after the filters are the run's layers, as the planning
context lists them per source (`Context.layer_stages`)."""

from __future__ import annotations

from pipeline.engine.step import Step
from pipeline.io import atomic
from pipeline.mixing import budget as bm
from pipeline.plan.context import Context
from pipeline.shards import ledger
from pipeline.steps.mix import publish as mix_publish


def ledger_of(ctx: Context, stats: dict) -> dict:
    """ledger.json: per source, every document in = kept + removed (by stage and reason) +
    quarantined, from the markers of every stage that decides."""
    rows = mix_publish.mixed_per_source(stats[ctx.mix.write.name])
    phases = bm.phase_selections(stats[ctx.mix.select.name][0])
    selection = phases[0][1]["sources"]
    chosen = mix_publish.chosen_docs(stats[ctx.mix.route.name]) if phases[0][0] is not None else None
    entries = {}
    layers = ctx.layer_stages()
    folded: dict[str, dict] = {}  # a layer step's markers read once and summed per source (ledger.fold), not held

    def of_source(name: str, sname: str) -> dict:
        if name not in folded:
            folded[name] = ledger.fold(stats[name].values())
        return ledger.of_source(folded[name], sname)

    for sname, spec in ctx.mixture.sources.items():
        flt = ctx.filter.get(sname)
        later = [(stage, of_source(name, sname)) for stage, name in layers[sname] if stage != "filter"]
        sel = selection.get(sname)
        r = rows.get(sname, {"docs": 0, "tokens": 0, "repeats": 0})
        mix = {"rows": r["docs"], "tokens": r["tokens"], "repeats": r["repeats"]}
        if sel is None:  # excluded from the mixture
            mix.update({"kept": 0, "excluded": "excluded" if spec.role == "train" else f"role_{spec.role}"})
        elif chosen is not None:  # phases: kept = chosen in at least one phase
            mix.update({"kept": chosen.get(sname, 0), "not_selected": sel["available_docs"] - chosen.get(sname, 0)})
        else:
            ns: dict[str, int] = {}
            for c in bm.source_cells(sel):
                why = bm.not_selected_reason(c)
                ns[why] = ns.get(why, 0) + c["available_docs"] - c["distinct_docs"]
            mix.update({"kept": sel["distinct_docs"], "not_selected": ns})
        ing = ctx.ingest[sname]
        entries[sname] = ledger.source_entry(
            sname, stats[ing.name], stats[flt.name] if flt else None, ctx.chains[sname], mix, later,
            unread_files=_unread_files(ctx, ing, stats[ing.name]),
        )
    return ledger.build(entries)


def _unread_files(ctx: Context, ingest: Step, markers: dict[int, dict]) -> list[dict]:
    """The input files of the ingest shards that stopped at a cut, a damaged part or a file that
    could not be opened ({"file", "error"}, once per file): the shard specs name them (the
    step's own, or its step.json when the step was cached)."""
    bad = {i: m["stream_error"] for i, m in sorted(markers.items()) if m.get("stream_error")}
    if not bad:
        return []
    specs = ingest.meta.get("specs") or atomic.read_json(ingest.dir(ctx.store) / "step.json")["shards"]
    out: dict[str, str] = {}
    for i, err in bad.items():
        out.setdefault(specs[i]["split"]["file"]["path"], err)
    return [{"file": f, "error": e} for f, e in out.items()]
