"""The stage contract: a new stage is its module plus one line of the stage list. The
worked example of docs/extending.md (stats_stage.py, the same code) planned and run."""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.compute as pc

from pipeline import config
from pipeline.engine.step import read_markers
from pipeline.io import atomic, fs
from pipeline.run import graph, runner
from tests.conftest import ROOT, write_jsonl, write_yaml
from tests.pipeline.run import stats_stage


def test_the_extending_doc_shows_the_stage_that_runs():
    """docs/extending.md's step-kind example is stats_stage.py, character for character."""
    doc = (ROOT / "docs" / "extending.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, re.S)
    assert (ROOT / "tests" / "pipeline" / "run" / "stats_stage.py").read_text() in blocks
    assert "    stats_stage.STAGE,   # per-source statistics -> stats/" in doc  # the one line of STAGES


def test_a_toy_stage_plans_runs_and_publishes(ray_local, tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"text": f"document number {i} " * (i % 7 + 1)} for i in range(300)])
    write_jsonl(tmp_path / "b.jsonl", [{"text": f"another text {i}"} for i in range(120)])
    y = write_yaml(tmp_path / "t.yaml", """
        name: t
        sources:
          a: {paths: ["a.jsonl"], max_shard_bytes: 4096}
          b: {paths: ["b.jsonl"]}
        """)
    stages = [*graph.STAGES, stats_stage.STAGE]
    lm = config.load(y)
    ctx = graph.build(lm, lm.output_dir(), lm.store_dir(), stages)
    assert [s.name for s in ctx.steps if ctx.stage_of[s.name] == "stats"] == ["stats-a", "stats-b"]
    assert ctx.step("stats-a").inputs == [ctx.ingest["a"]] and ctx.step("stats-a").task.endswith("stats_stage:count_shard")
    run_dir = runner.run(lm, workers=2, log=lambda m: None, quiet=True, stages=stages)
    manifest = atomic.read_json(run_dir / "manifest.json")
    for source, n in (("a", 300), ("b", 120)):
        ing = ctx.ingest[source].dir(ctx.store)
        t = pa.concat_tables([fs.read_table(p, columns=["n_chars", "n_tokens"]) for p in sorted(ing.glob("part-*.parquet"))])
        want = {"rows": n, "chars": pc.sum(t["n_chars"]).as_py(), "tokens": pc.sum(t["n_tokens"]).as_py()}
        assert atomic.read_json(run_dir / "stats" / f"{source}.json") == want
        assert manifest["stats"][source] == want
    shards = len(read_markers(ctx.ingest["a"].dir(ctx.store)))
    assert shards > 1 and len(read_markers(ctx.step("stats-a").dir(ctx.store))) == shards  # a task per ingest shard
    assert manifest["total_docs"] == 420  # the stages before it publish as they did
