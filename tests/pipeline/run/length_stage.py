"""A toy scoring stage: each kept document's length class (short, medium or long, by its
characters) as a mixture axis, so that a mixture may weight `web/length=long`. A module of
its own, outside Curate: a mixture adds it with `plugins: [tests.pipeline.run.length_stage]`
and sets it under `stages: {length: {edges: [500, 2000]}}`. The worked example of
docs/extending.md (tests/pipeline/run/test_axes.py checks the two agree and runs it)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from pipeline.engine.step import Step, read_markers, shard_name, task
from pipeline.io import fs
from pipeline.plan.context import Context
from pipeline.plan.stage import Stage, texts
from pipeline.shards import apply, view



class LengthSettings(BaseModel):
    """`stages: {length: ...}` in the YAML (all optional)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    edges: tuple[int, int] = Field((500, 2000), description="characters: short below the first, long from the second")


CLASSES = ("short", "medium", "long")


@task(version="2")  # 2: its marker counts the rows of each class
def length_shard(spec: dict, out) -> dict:
    """One document shard's layer: every row, `keep` true where the row reached this stage
    (null where an earlier layer removed it), and its class in the column named after the axis;
    its marker counts the rows of each class (what the report reads)."""
    d = spec["doc"]
    total = view.num_rows(d["documents"])
    rows, chars, toks = apply.sizes(d)  # the rows that reached the stage, their characters and tokens
    seen = np.zeros(total, bool)
    seen[rows] = True
    short, long = spec["edges"]
    length = np.full(total, None, dtype=object)
    length[rows] = np.where(chars < short, "short", np.where(chars < long, "medium", "long"))
    ids = fs.read_table(d["documents"], columns=["id"]).column("id")
    apply.write_attributes(out.dir, d, pa.table({"id": ids, "keep": pa.array(seen, pa.bool_(), mask=~seen),
                                                 "reason": pa.nulls(total, pa.string()),
                                                 "length": pa.array(length, pa.string())}))
    classes = {c: int((length[rows] == c).sum()) for c in CLASSES}
    return {**apply.stage_stats(d, rows, chars, toks, np.ones(len(rows), bool), {}), "classes": classes}


def report(run, source: str) -> dict | None:
    """report.json's `sources.<source>.stages.length`: the documents of each class, summed
    from the step's markers (no document read)."""
    d = run.step_dir("length")
    if d is None:
        return None
    got = dict.fromkeys(CLASSES, 0)
    for m in read_markers(d).values():
        if m.get("source") == source:
            for c, n in m["classes"].items():
                got[c] += n
    return {c: {"documents": n} for c, n in got.items()}


def explain(row: dict) -> dict:
    """What `curate explain` prints beside the stage: the document's class."""
    return {"length": row["length"]} if row.get("length") is not None else {}


def plan(ctx: Context) -> list[Step]:
    """`length`, a layer over every document shard that removes nothing, declared as the
    axis `length` of every source."""
    prev = list(ctx.layers)
    edges = list(ctx.mixture.stages.get("length", LengthSettings()).edges)

    def shards(step, stats):
        return ({"doc": d, "edges": edges, "describe": f"{d['source']}/{shard_name(d['part'])}"}
                for d in ctx.doc_shards(stats, prev))

    step = Step("length", "length", {"edges": edges}, ctx.base() + prev, length_shard, shards=shards,
                position_free=True)
    ctx.add_layer(step, "length")
    for source in ctx.mixture.sources:
        ctx.declare_axis("length", source)
    return [step]


# planned after validation, before classify and mix read the layers; its tasks carry text
STAGE = Stage("length", plan, config=LengthSettings, after="validation", tasks=texts("length"),
              report=report, explain=explain)
