"""A committed step's markers are read from its marker index when a plan needs them and not
held by the driver afterwards (pipeline/engine/markers.py): a chain of steps, every shard's
marker already on disk (a run resumed at the end of each step), through the real Executor
(no task runs, so no Ray)."""

from __future__ import annotations

import orjson

from pipeline.engine import markers
from pipeline.engine.executor import Executor
from pipeline.engine.markers import StepMarkers
from pipeline.engine.progress import Progress
from pipeline.engine.step import MARKERS, Step, shard_name

SHARDS = 50


def never(spec: dict, out) -> dict:  # every shard is done already
    raise AssertionError("no shard runs")


def plan(step, stats):
    """A plan that reads its input's markers shard by shard, as a filter's reads its ingest's."""
    for i in step.inputs:
        assert sum(stats[i.name][k]["rows"] for k in range(SHARDS)) == 7 * SHARDS
    return [{"k": k} for k in range(SHARDS)]


def test_finished_steps_markers_are_read_when_planned_and_not_held(tmp_path):
    steps: list[Step] = []
    for j in range(5):
        s = Step(f"s{j}", "filter", {"j": j}, steps[-1:], never, shards=plan)
        (s.dir(tmp_path) / MARKERS).mkdir(parents=True)
        for k in range(SHARDS):
            (s.dir(tmp_path) / MARKERS / f"{shard_name(k)}.json").write_bytes(orjson.dumps({"rows": 7, "k": k}))
        steps.append(s)
    ex = Executor(tmp_path, progress=Progress(quiet=True))
    ex.run(steps)
    assert all(isinstance(ex.stats[s.name], StepMarkers) for s in steps)  # no step's markers kept as a dict
    assert markers.cached() <= markers.KEEP
    assert ex.stats["s3"][12] == {"rows": 7, "k": 12} and len(ex.stats["s4"]) == SHARDS
    again = Executor(tmp_path, progress=Progress(quiet=True))  # all done: nothing read to know it
    before = markers.cached()
    again.run(steps)
    assert all(again.status[s.name] == "SKIPPED" and isinstance(again.stats[s.name], StepMarkers) for s in steps)
    assert markers.cached() == before
