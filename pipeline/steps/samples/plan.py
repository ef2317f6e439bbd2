"""The samples stage: seeded samples of kept and removed documents (tasks.py says how).

    samples-pick   per document shard: its candidates per source, stage and reason
    samples        per source: the picks merged into kept.jsonl and removed.jsonl

It reads every step whose decisions a document's fate depends on, up to the mixture's
selection (ctx.fate), and runs beside the mixture's files, not after them.
Publishes `samples/<source>/{kept,removed}.jsonl` and `samples/index.html`.
"""

from __future__ import annotations

from collections.abc import Iterator

import orjson

from pipeline.engine.step import Step, shard_name
from pipeline.io import atomic, html
from pipeline.mixing import budget
from pipeline.plan.context import Context
from pipeline.shards.select import select_entry
from pipeline.steps.samples import tasks
from pipeline.plan.stage import Stage, texts


def plan(ctx: Context) -> list[Step]:
    m = ctx.mixture
    sm = m.samples
    cfg = {"samples": sm.model_dump(), "seed": m.seed}
    ingest_dirs = [str(ctx.ingest[s].dir(ctx.store)) for s in m.sources]
    every_shard = ctx.all_doc_shards()

    stages = ctx.layer_stages()  # the layers every_shard gives, in the same order: taken at the same time
    select = ctx.mix.select if ctx.mix is not None else None

    def pick_shards(st, stats) -> Iterator[tasks.PickSpec]:
        """Each shard's spec names what its decisions read, never the run directory: its
        layer files, its source's role and part of the selection (decisions.OneShard), so
        a variant that leaves them the same links the picks (engine/reuse.py)."""
        # a selected source's part of the selection is a file mix-select wrote (keyed by its bytes); an
        # unselected one's is a few bytes, carried inline (its documents are all `excluded`)
        sel = stats[select.name][0] if select is not None else None
        chosen = set(budget.selected_sources(sel)) if sel is not None else set()
        by_source = {s: (str(select.dir(ctx.store) / "sources" / f"{s}.json") if s in chosen else budget.source_selection(sel, s))
                     if sel is not None else None for s in m.sources}
        for d in every_shard(stats):
            s, labels = d["source"], [label for label, _ in stages[d["source"]]]
            if len(labels) != len(d["layers"]):
                raise RuntimeError(f"samples of {s}: {len(d['layers'])} layer files, {len(labels)} layer stages")
            ing = ctx.ingest[s].dir(ctx.store)
            yield {"source": s, "seed": m.seed, "documents": d["documents"], "layers": [list(x) for x in zip(labels, d["layers"], strict=True)],
                   "role": m.sources[s].role, "selection": by_source[s],
                   "quarantine": str(ing / "quarantine" / f"{shard_name(d['part'])}.jsonl"),
                   "kept_per_source": sm.kept_per_source, "removed_per_reason": sm.removed_per_reason,
                   "describe": f"samples of {s}/{shard_name(d['part'])}"}

    pick = Step("samples-pick", "samples-pick", cfg, list(ctx.fate), tasks.pick_shard, shards=pick_shards, position_free=True,
                read_keyed=("layers",))  # the picks digest the layer columns their decisions read (tasks._read_key)

    # the eval items' texts the published records show: the decontamination index's items file, named in
    # the spec so its bytes are in the key (an eval file edited to the same decisions changes the samples)
    index = ctx.step_of("decontaminate_index")
    items = {"eval_items": str(index.dir(ctx.store) / "items" / "part-00000.parquet")} if index is not None else {}

    def sample_shards(st, stats):
        offsets, _ = ctx.shard_offsets(stats)
        return [{"source": s, "picks": str(pick.dir(ctx.store)), "first": offsets[i], "run_dir": str(ctx.run_dir),
                 "ingest_dirs": ingest_dirs, **items,
                 "shards": len(stats[ctx.ingest[s].name]), "kept_per_source": sm.kept_per_source,
                 "removed_per_reason": sm.removed_per_reason, **select_entry(ctx.engine.select_group),
                 "describe": f"samples of {s}"}
                for i, s in enumerate(m.sources)]

    merge = Step("samples", "samples", cfg, [pick, *([index] if index is not None else [])], tasks.sample_shard, shards=sample_shards,
                 cpus=0)  # past engine.select_group pick files a coordinator: its tree's tasks take the CPUs
    merge.meta["engine"] = {"select_group": ctx.engine.select_group}
    ctx.provide("samples", merge)
    return [pick, merge]


def publish(ctx: Context, stats: dict) -> dict:
    """samples/<source>/{kept,removed}.jsonl (links into the samples step) and samples/index.html."""
    m = ctx.mixture
    sdir = ctx.provider("samples").dir(ctx.store)
    pairs, listed, records = [], [], []
    for source in m.sources:
        for name in ("kept.jsonl", "removed.jsonl"):
            f = sdir / source / name
            if f.exists():
                pairs.append((f, f"{source}/{name}"))
                rows = [orjson.loads(x) for x in f.read_bytes().splitlines()]
                records += rows
                listed.append({"path": f"samples/{source}/{name}", "documents": len(rows)})
    tmp_index = sdir / "index.html"
    note = (f"{len(records):,} sample documents of run {m.name}: up to {m.samples.kept_per_source} kept "
            f"per source and {m.samples.removed_per_reason} removed per stage and reason, chosen by a seeded hash")
    atomic.write_bytes(tmp_index, html.viewer(f"Samples of {m.name}", records, note).encode("utf-8"))
    pairs.append((tmp_index, "index.html"))
    atomic.link_tree(pairs, ctx.run_dir / "samples")
    return {"samples": listed + [{"path": "samples/index.html", "documents": len(records)}]}


STAGE = Stage("samples", plan, publish=publish, outputs=("samples",), tasks=texts("samples-pick", "samples"))
