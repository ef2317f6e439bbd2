"""A per-source statistics stage: documents, characters and tokens of every ingest shard,
one task per shard, summed into `stats/<source>.json` in the run directory. The worked
example of docs/extending.md (tests/pipeline/run/test_stages.py checks the two agree)."""

from __future__ import annotations

import pyarrow.compute as pc

from pipeline.engine.step import Step, shard_name, task
from pipeline.io import atomic, fs
from pipeline.plan.context import Context
from pipeline.plan.stage import Stage


@task(version="1")  # bump when the task's output changes for the same inputs
def count_shard(spec: dict, out) -> dict:
    """One document shard's counts; the marker is the output (no data file)."""
    t = fs.read_table(spec["documents"], columns=["n_chars", "n_tokens"])
    return {"rows": t.num_rows, "chars": pc.sum(t["n_chars"]).as_py() or 0,
            "tokens": pc.sum(t["n_tokens"]).as_py() or 0}


def plan(ctx: Context) -> list[Step]:
    """stats-<source> after each source's ingest step: one shard per ingest shard."""
    steps = []
    for source, ingest in ctx.ingest.items():
        def shards(step, stats, ingest=ingest, source=source):
            return [{"documents": str(ingest.dir(ctx.store) / f"{shard_name(i)}.parquet"),
                     "describe": f"stats of {source}/{shard_name(i)}"} for i in sorted(stats[ingest.name])]

        steps.append(Step(f"stats-{source}", "stats", {}, [ingest], count_shard, shards=shards))
    return steps


def publish(ctx: Context, stats: dict) -> dict:
    """stats/<source>.json, summed from the markers (the driver reads no document)."""
    out = {}
    for source in ctx.ingest:
        markers = stats[f"stats-{source}"].values()
        out[source] = {k: sum(m[k] for m in markers) for k in ("rows", "chars", "tokens")}
        atomic.write_json(ctx.run_dir / "stats" / f"{source}.json", out[source])
    return {"stats": out}


STAGE = Stage("stats", plan, publish=publish)
