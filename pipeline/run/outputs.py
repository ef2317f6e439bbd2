"""The ledger of a finished run, assembled from its markers: per source, every document in
is kept, removed by a stage with a reason, or quarantined (pipeline/shards/ledger.py does
the arithmetic). The stages after the filters are the run's layers, as the planning
context lists them per source (`Context.layer_stages`)."""

from __future__ import annotations

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
    for sname, spec in ctx.mixture.sources.items():
        flt = ctx.filter.get(sname)
        later = [(stage, [m for m in stats[name].values() if m.get("source", sname) == sname])
                 for stage, name in layers[sname] if stage != "filter"]
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
        entries[sname] = ledger.source_entry(
            sname, stats[ctx.ingest[sname].name], stats[flt.name] if flt else None, ctx.chains[sname], mix, later
        )
    return ledger.build(entries)
