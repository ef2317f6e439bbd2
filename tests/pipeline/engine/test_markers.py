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


def test_a_running_steps_markers_are_spilled_and_stream_into_its_index(tmp_path):
    """RunningMarkers: the markers of a step in flight live in a local spill file (the driver
    keeps offsets and running sums); a shard computed again counts once; the index it
    streams is the JSON object the committed step's StepMarkers reads back."""
    from pipeline.engine.executor import commit
    from pipeline.engine.markers import RunningMarkers

    m = RunningMarkers(5)
    for i in (3, 0, 4):
        m[i] = {"rows": i + 1, "seconds": 0.5, "source": f"s{i}"}
    m[3] = {"rows": 10, "seconds": 0.7, "source": "s3"}  # a retried shard: replaced, not counted twice
    assert len(m) == 3 and m.rows == 1 + 5 + 10 and 3 in m and 1 not in m and list(m) == [0, 3, 4]
    assert m[3] == {"rows": 10, "seconds": 0.7, "source": "s3"}
    whole = orjson.loads(b"".join(m.index_chunks(batch=2)))
    assert whole == {"0": {"rows": 1, "seconds": 0.5, "source": "s0"}, "3": {"rows": 10, "seconds": 0.7, "source": "s3"},
                     "4": {"rows": 5, "seconds": 0.5, "source": "s4"}}
    full = RunningMarkers(2)
    full[0], full[1] = {"rows": 1}, {"rows": 2}
    assert commit(tmp_path, "h" * 64, "f1", full)
    assert StepMarkers(tmp_path / "_markers-f1.json", 2)[1] == {"rows": 2}
    empty = RunningMarkers(0)
    assert orjson.loads(b"".join(empty.index_chunks())) == {}


def test_a_marker_index_is_read_a_line_at_a_time_into_a_spill_not_parsed_whole(tmp_path, monkeypatch):
    """The index a commit streams has a marker a line: read_index keeps where each is in a
    local spill (an _Index, 12 bytes a shard), and parses a marker when asked; an index
    written whole (json.dump) is parsed whole; a cut or foreign file is an error."""
    from pipeline.engine.markers import RunningMarkers, _Index, read_index

    monkeypatch.setattr(markers, "WHOLE", 2)  # an index of more than 2 markers is spilled (1,024 by default)
    m = RunningMarkers(4)
    for i in (2, 0, 1, 3):
        m[i] = {"rows": i, "text": "a\nb", "k": [i, {"x": ":"}]}
    (tmp_path / "ix.json").write_bytes(b"".join(m.index_chunks(batch=3)))
    got = read_index(tmp_path / "ix.json", 4)
    assert isinstance(got, _Index) and len(got) == 4 and list(got) == [0, 1, 2, 3]
    assert got[3] == {"rows": 3, "text": "a\nb", "k": [3, {"x": ":"}]} and dict(got.items()) == {
        i: {"rows": i, "text": "a\nb", "k": [i, {"x": ":"}]} for i in range(4)}
    assert orjson.loads((tmp_path / "ix.json").read_bytes())[ "1"]["rows"] == 1  # still one JSON object
    (tmp_path / "whole.json").write_bytes(orjson.dumps({"0": {"rows": 5}}, option=orjson.OPT_INDENT_2))
    assert read_index(tmp_path / "whole.json", 1) == {0: {"rows": 5}}
    (tmp_path / "indented.json").write_bytes(orjson.dumps({str(i): {"rows": i} for i in range(3)}, option=orjson.OPT_INDENT_2))
    assert read_index(tmp_path / "indented.json", 3) == {i: {"rows": i} for i in range(3)}
    (tmp_path / "cut.json").write_bytes((tmp_path / "ix.json").read_bytes()[:-3])
    for bad in ("cut.json",):
        try:
            read_index(tmp_path / bad, 4)
        except ValueError as e:
            assert "cut short" in str(e)
        else:
            raise AssertionError("a cut index was read")
    idx = tmp_path / "s" / "_markers-f.json"
    idx.parent.mkdir()
    idx.write_bytes((tmp_path / "cut.json").read_bytes())
    try:
        StepMarkers(idx, 4)[0]
    except Exception as e:  # noqa: BLE001 -- the run's error, naming the file and what to do
        assert "cannot be read" in str(e) and "_SUCCESS" in str(e) and str(idx) in str(e)
    else:
        raise AssertionError("a cut index was read")
