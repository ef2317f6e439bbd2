"""The mix stage's plan: every kept document to the mixture's shards (tasks.py says how).

    mix-budget     one task: each source's cells with their epochs (cells/<source>.json), counted
                   by the driver from the shards' sums of their markers' groups
    mix-priority   per document shard: cells, priorities and tokens of the kept documents, one file
    mix-select     one task: each cell's budget and priority cutoff, exact
    mix-route      per document shard: every chosen (document, epoch) to its output shard
    mix-route-merge  the route's files joined, 32 or more at a time (pipeline/steps/merge.py; no task
                   below 33 document shards)
    mix            per output shard: its rows in order, part-XXXXX.parquet

The budget is computed here from the markers (kept tokens per cell) with the pure maths
of pipeline/mixing/budget.py; `expected` gives the dry run the mixture the current
outputs would make. What the stage publishes (mixture/, manifest.json's body) is in
publish.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import math
from collections.abc import Iterable

from pipeline.config import format_problems
from pipeline.engine.step import Step, committed, read_markers, shard_name
from pipeline.errors import RunError, UsageError
from pipeline.io import fs
from pipeline.mixing import budget as bm
from pipeline.mixing import cells
from pipeline.mixing import keys as weight_keys
from pipeline.plan.context import Context, MixSteps
from pipeline.shards.documents import slim
from pipeline.shards.select import key_files as select_files, select_entry
from pipeline.steps.merge import merge_step, read_from
from pipeline.steps.mix import tasks
from pipeline.steps.mix.publish import publish
from pipeline.plan.stage import Stage, texts


def plan(ctx: Context) -> list[Step]:
    """mix-priority, mix-select, mix-route and mix, after every step whose decisions the
    mixture reads; records them (ctx.mix) and what a document's fate depends on (ctx.fate)."""
    upstream = ctx.base() + ctx.layers + [st for _, _, st in ctx.source_layers]
    m = ctx.mixture
    mx = m.mixture
    mixed = [s for s in m.sources if s not in m.excluded()]
    every_shard = ctx.all_doc_shards()

    def raw_docs(stats):  # the document shards of the sources in the mixture, with all their layers (a generator)
        return (d for d in every_shard(stats) if d["source"] in mixed)
    ph_list = phases(ctx)
    # a source's axes: its one axis by name (as a mixture of one axis always had), several as a list
    by_axis: dict[str, str | list[str]] = {c.source: c.axes[0][0] if len(c.axes) == 1 else [a for a, _, _ in c.axes]
                                           for ph in ph_list for c in ph["cells"] if c.axes}
    langs = None
    if by_axis:  # axis cells (a language, a stage's axis): kept documents and tokens per (value, bucket) of each shard
        def axis_shards(st, stats) -> Iterator[tasks.AxisSpec]:
            return ({"doc": d, "axis": by_axis[d["source"]], "describe": f"{d['source']}/{shard_name(d['part'])}"}
                    for d in raw_docs(stats) if d["source"] in by_axis)

        langs = Step("mix-axes", "mix-axes", {"sources": by_axis}, upstream, tasks.axis_groups_shard,
                     shards=axis_shards, position_free=True)

    def mixed_docs(stats):  # ... with each axis-weighted shard's counts per value (mix-axes' markers)
        if langs is None:
            yield from raw_docs(stats)
            return
        got = iter(stats[langs.name][j] for j in sorted(stats[langs.name]))
        for d in raw_docs(stats):
            yield {**d, "axis_groups": next(got)["axis_groups"]} if d["source"] in by_axis else d
    first = [sum(len(p["cells"]) for p in ph_list[:k]) for k in range(len(ph_list))]  # key folders c<index>
    cell_dicts = [{c.name: {**c.to_dict(), "index": first[k] + i, "phase": ph["name"], "seed": ph["seed"]}
                   for i, c in enumerate(ph["cells"])} for k, ph in enumerate(ph_list)]
    cfg = {"seed": m.seed, "weights": mx.weights, "normalize": mx.normalize, "target_tokens": mx.target_tokens,
           **({"sample_rates": mx.sample_rates} if mx.sample_rates is not None else {}),
           **({"simulate_target_tokens": mx.simulate_target_tokens} if mx.simulate_target_tokens is not None else {}),
           **({"phases": [p.model_dump() for p in mx.phases], "disjoint": mx.disjoint} if mx.phases else {}),
           "max_epochs": {s: (m.sources[s].max_epochs or mx.max_epochs) for s in mixed}, "on_shortfall": mx.on_shortfall,
           "shard_tokens": mx.shard_tokens, "shard_rows": mx.shard_rows, "sources": mixed}
    if any(c.lo is not None or c.topic is not None or c.axes for ph in ph_list for c in ph["cells"]):
        cfg["cells"] = [[c.to_dict() for c in ph["cells"]] for ph in ph_list] if mx.phases else \
            [c.to_dict() for c in ph_list[0]["cells"]]  # only then: a mixture without cells keeps its config

    def cell_budgets(stats):
        out = []
        for ph in ph_list:  # a pass over the shards per phase, one shard's dict at a time
            avail, avail_docs = cell_available(mixed_docs(stats), ph["cells"])
            out.append((avail, avail_docs, budget(ctx, avail, mx.on_shortfall, ph)))
        if mx.disjoint:
            bm.share_out([b for _, _, b in out], out[0][0], [ph["name"] for ph in ph_list])
        epochs = [{c: bm.key_epoch(e, a[c]) for c, e in b.items()} for a, _, b in out]
        if mx.disjoint:  # one order shared out: the first phase's key files serve every phase (tasks._disjoint_cuts)
            epochs = epochs[:1] + [dict.fromkeys(e) for e in epochs[1:]]
        return out, epochs

    def of_source(source, epochs):
        return [{**cell_dicts[k][c.name], "epoch": epochs[k].get(c.name)}
                for k, ph in enumerate(ph_list) for c in ph["cells"] if c.source == source]

    def budget_shards(st, stats) -> list[tasks.BudgetSpec]:
        """One task: each source's cells (membership, seed, epoch) written as cells/<source>.json,
        and each phase's availability and budget in its marker. The driver counts the cells once
        from the shards' sums (cell_available), and no per-shard spec carries a cell."""
        out, epochs = cell_budgets(stats)
        return [{"sources": {s: of_source(s, epochs) for s in mixed},
                 "phases": [{"available": a, "available_docs": ad, "budget": b} for a, ad, b in out],
                 "epochs": epochs, "describe": "the mixture's budget"}]

    budget_step = Step("mix-budget", "mix-budget", cfg, upstream + ([langs] if langs else []), tasks.budget_shard,
                       shards=budget_shards, cpus=0)

    def priority_shards(st, stats) -> Iterator[tasks.PrioritySpec]:
        return ({"doc": slim(d), "seed": m.seed, "cells": ctx.mix.cells_file(ctx.store, d["source"]),
                 "describe": f"{d['source']}/{shard_name(d['part'])}"} for d in mixed_docs(stats))

    # a shard's spec names the file of its source's cells (membership, seed and epoch: all that decides its
    # keys), keyed by its bytes: a weights edit recomputes only the sources whose epochs it moves
    priority = Step("mix-priority", "mix-priority", cfg, upstream + ([langs] if langs else []) + [budget_step],
                    tasks.priority_shard, shards=priority_shards, position_free=True,
                    shard_free=tuple(k for k in cfg if k != "seed"))

    def select_shards(st, stats):
        b0 = stats[budget_step.name][0]
        out = [(ph["available"], ph["available_docs"], ph["budget"]) for ph in b0["phases"]]
        epochs = b0["epochs"]
        pdir = priority.dir(ctx.store)
        span = ctx.source_spans(stats, mixed)  # each source's shards: one run of the mixed shards' numbers
        phases = []
        for k, (ph, (avail, avail_docs, b)) in enumerate(zip(ph_list, out, strict=True)):
            keys = {c: [] for c in b}
            for c in ph["cells"]:
                if epochs[k][c.name] is not None and c.source in span:
                    keys[c.name] = select_files(str(pdir / "keys"), *span[c.source], cell=cell_dicts[k][c.name]["index"])
            phases.append({"name": ph["name"], "keys": keys, "budget": b, "available": avail, "available_docs": avail_docs,
                           "cells": cell_dicts[k], "target_tokens": ph["target"]})
        return [{"phases": phases, "seed": m.seed, "shard_tokens": mx.shard_tokens, "shard_rows": mx.shard_rows,
                 **select_entry(ctx.engine.select_group), "describe": "mixture selection"}]

    select = Step("mix-select", "mix-select", cfg, [priority], tasks.select_shard, shards=select_shards,
                  cpus=0)  # a coordinator past engine.select_group shards: its tree's tasks take the CPUs
    select.meta["engine"] = {"select_group": ctx.engine.select_group}

    def route_shards(st, stats):
        ddir = select.dir(ctx.store) / "decide"  # each source's cells cut to what decides (select writes them)
        return ({"doc": slim(d), "seed": m.seed, "phases": str(ddir / f"{d['source']}.json"),
                 **({"tokens": str(tok[d["source"]].dir(ctx.store) / f"{shard_name(d['index'])}.parquet")} if tok else {}),
                 "describe": f"{d['source']}/{shard_name(d['part'])}"}
                for d in mixed_docs(stats))

    tok = ctx.providers("token_ids")  # tokenize: the sources' token ids ride with their texts (pipeline/steps/tokenize/)
    route = Step("mix-route", "mix-route", {}, [select, *tok.values()], tasks.route_shard, shards=route_shards,
                 position_free=True, read_keyed=("layers",))

    merged = merge_step("mix-route-merge", route, ["to"], lambda stats: len(stats[route.name]), ctx.store, ctx.engine,
                        split=True)

    def write_shards(st, stats) -> list[tasks.WriteSpec]:
        folder, maps = read_from(stats, route, merged, len(stats[route.name]), ctx.store)
        root = str(fs.path(folder) / "to")
        out: list[tasks.WriteSpec] = []
        for name, sel, offset in bm.phase_selections(stats[select.name][0]):
            for p in range(sel["n_shards"]):
                out.append({"inputs": root, "maps": maps, "partition": offset + p, "phase": name,
                            "file": f"{name}/{shard_name(p)}.parquet" if name else None,
                            "describe": f"mixture shard {name + '/' if name else ''}{p}"})
        return out

    write = Step("mix", "mix", {}, [route, merged], tasks.write_shard, shards=write_shards)
    ctx.mix = MixSteps(priority, select, route, write, ph_list, mixed_docs, budget_step)
    ctx.declare("selection", select)
    ctx.fate = list(ctx.steps) + ([langs] if langs else []) + [budget_step, priority, select]  # up to the selection
    return ([langs] if langs else []) + [budget_step, priority, select, route, merged, write]



def upstream_steps(step: Step) -> list[Step]:
    """Every step `step` reads, directly or not, in dependency order."""
    seen: dict[str, Step] = {}

    def visit(s: Step):
        for i in s.inputs:
            if i.name not in seen:
                visit(i)
                seen[i.name] = i
    visit(step)
    return list(seen.values())


def phases(ctx: Context) -> list[dict]:
    """The mixture's phases (one, unnamed, without `mixture.phases`): weights or sample
    rates, target, cells, and the seed of their priorities (a phase's own, unless the
    phases are disjoint and share one order out)."""
    m = ctx.mixture
    mx = m.mixture
    specs = [(None, mx.weights, mx.sample_rates, mx.target_tokens, mx.simulate_target_tokens)] if not mx.phases else \
        [(p.name, p.weights, p.sample_rates, p.target_tokens, None) for p in mx.phases]
    out = []
    for k, (name, w, r, target, sim) in enumerate(specs):
        keys, field = (w, "weights") if w is not None else (r, "sample_rates")
        if keys:
            view = m.model_copy(update={"mixture": mx.model_copy(update={"weights": None, "sample_rates": None, field: keys})})
            wrong = weight_keys.problems(view, field, ctx.topic_labels, ctx.axes)
            if wrong:  # a pretrained topic model's labels are known only now
                loc = ("mixture",) if name is None else ("mixture", "phases", k)
                raise UsageError(format_problems(ctx.lm.path, ctx.lm.lines, [((*loc, *x[1:]), msg) for x, msg in wrong]))
        cl = cells.cells(m, ctx.topic_labels, keys or {})
        seed = m.seed if name is None or mx.disjoint else f"{m.seed}:{name}"
        out.append({"name": name, "cells": cl, "weights": cells.weights(m, cl, w) if w is not None else None,
                    "rates": cells.rates(m, cl, r) if r is not None else None, "target": target, "simulate": sim,
                    "seed": seed})
    return out

def cell_max_epochs(ctx: Context, ph: dict) -> dict[str, float | None]:
    """Per cell of phase `ph`: its source's `max_epochs`, else the mixture's (None: no cap)."""
    mx = ctx.mixture.mixture
    return {c.name: (ctx.mixture.sources[c.source].max_epochs or mx.max_epochs) for c in ph["cells"]}


def budget(ctx: Context, avail: dict[str, int], on_shortfall: str, ph: dict) -> dict[str, dict]:
    """Per cell of phase `ph`: its target tokens and epochs (pipeline/mixing/budget.py: weights, sample_rates,
    simulated epoching)."""
    return bm.cell_budget(avail, ph["weights"], ph["target"], cell_max_epochs(ctx, ph), on_shortfall, ph["rates"],
                          ph["simulate"])

def cell_available(docs: Iterable[dict], cell_list: list) -> tuple[dict[str, int], dict[str, int]]:
    """Kept tokens and documents per cell, from the document shards' markers (a
    bucketed source's quality step counts them per bucket, a topic step per topic and bucket)."""
    avail, avail_docs = {c.name: 0 for c in cell_list}, {c.name: 0 for c in cell_list}
    by_source: dict[str, list] = {}
    for c in cell_list:
        by_source.setdefault(c.source, []).append(c)
    sums: dict[str, dict] = {}
    for d in docs:  # a shard's groups added to its source's sums; the cells are counted once, from the sums
        if d["source"] in by_source:
            cells.tally(sums.setdefault(d["source"], {}), d)
    for source, acc in sums.items():
        for name, (nd, nt) in cells.available(by_source[source], cells.tallied(acc)).items():
            avail[name] += nt
            avail_docs[name] += nd
    return avail, avail_docs


def available_now(ctx: Context) -> tuple[list[str], list[dict[str, int]]]:
    """The kept tokens per cell of each phase as the mix would count them from the current
    outputs: ([], one dict a phase), or (the steps the mix reads that are not done, [])."""
    upstream = [s for s in upstream_steps(ctx.mix.priority) if s.kind != "mix-budget"]  # what the counts come from
    reads = {s.name for s in upstream}
    pending = [s.name for s in ctx.steps if s.name in reads and committed(s, ctx.store) is None]
    if pending:
        return pending, []
    docs = list(ctx.mix.docs({s.name: read_markers(s.dir(ctx.store)) for s in upstream}))  # listed once, read once per phase
    return [], [cell_available(docs, ph["cells"])[0] for ph in ctx.mix.phases]


def expected(ctx: Context) -> list[str]:
    """The mixture the current outputs would give: per source, kept tokens available, the
    target and the epochs it needs; or which step must run first."""
    pending, per_phase = available_now(ctx)
    if pending:
        return [f"expected mixture: unknown until {pending[0]} runs (and {len(pending) - 1} more steps)" if len(pending) > 1
                else f"expected mixture: unknown until {pending[0]} runs"]
    mx = ctx.mixture.mixture
    lines = []
    for ph, avail in zip(ctx.mix.phases, per_phase, strict=True):
        try:
            b = budget(ctx, avail, "renormalize", ph)
            strict = budget(ctx, avail, "error", ph) if mx.on_shortfall == "error" else None
        except RunError:
            strict = "short"
        width = max([16] + [len(c) for c in avail])
        title = "expected mixture (from the kept documents now):" if ph["name"] is None else \
            f"expected phase {ph['name']} (from the kept documents now):"
        lines += ([""] if lines else []) + [title, f"{'cell':<{width}} {'weight':>7} {'available':>13} {'target':>13} {'epochs':>7}  note"]
        for c in ph["cells"]:
            e = b[c.name]
            w = f"{e['weight']:.3f}" if e["weight"] is not None else "-"
            note = "capped at max_epochs" if e.get("capped") else ""
            if e["epochs"] > 1:
                note = note or f"repeated: {math.floor(e['epochs'])} whole epochs + part"
            if not c.named and e["weight"] == 0:
                note = note or "no weight names these documents: left out"
            lines.append(f"{c.name:<{width}} {w:>7} {avail[c.name]:>13,} {e['target']:>13,} {e['epochs']:>7.2f}  {note}")
        if strict == "short":
            lines.append("shortfall: with on_shortfall: error the run will stop before writing (see the table it prints)")
    return lines


STAGE = Stage("mix", plan, publish=publish, expected=expected, outputs=("mixture",), tasks=texts("mix-route", "mix"))
