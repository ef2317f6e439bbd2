"""What a person sees while a run runs (pipeline/engine/progress.py): a line per stage, not
per step. The live display is rich's, recorded by rich's own Console; the text and JSON
forms are read from real runs of the small mixture."""

from __future__ import annotations

import io
import json
import time

from rich.console import Console

from pipeline.engine.progress import Progress
from tests.conftest import curate, small_mixture, write_yaml


def test_the_live_display_is_one_line_a_stage_with_notes_above_it():
    con = Console(file=io.StringIO(), force_terminal=True, width=120, record=True)
    p = Progress(mode="live", console=con)
    p.expect({"ids-wiki": "ingest", "merge-ids-wiki": "ingest", "ingest-wiki": "ingest", "filter-wiki": "filter"})
    p.start("ids-wiki", 3, 0, 0)
    for _ in range(3):
        p.update("ids-wiki", 1000)
    p.finish("ids-wiki", 0.2)
    p.start("merge-ids-wiki", 0, 0, 0)  # nothing to do: never shown
    p.finish("merge-ids-wiki", 0.0)
    p.start("ingest-wiki", 4, 1, 500)
    for _ in range(3):
        p.update("ingest-wiki", 1000)
    p.finish("ingest-wiki", 0.5)
    p.start("filter-wiki", 4, 0, 0)
    p.update("filter-wiki", 700)
    p.note("[filter-wiki] shard 2 (wiki/part-00002) failed: ValueError: boom")
    time.sleep(0.3)
    lines = [x for x in p.snapshot().splitlines() if x.strip()]
    p.close()
    text = con.export_text()  # every frame rich drew
    assert "[filter-wiki] shard 2 (wiki/part-00002) failed: ValueError: boom" in text
    assert len(lines) == 2, lines  # ingest (its steps folded) and filter
    assert lines[0].startswith("ingest done") and "7/7 shards" in lines[0] and "3,500 docs in" in lines[0]
    assert lines[1].startswith("filter ") and "1/4 shards" in lines[1] and "docs/s" in lines[1]
    assert "merge-ids" not in con.export_text()


def test_a_run_prints_a_line_a_stage_or_json_lines_a_script_can_read(demo_corpus, tmp_path, joined):
    y = write_yaml(tmp_path / "r.yaml", small_mixture(str(demo_corpus), str(tmp_path / "out")))
    r = curate("run", str(y), "--workers", "2", env=joined)
    assert r.returncode == 0, r.stderr[-3000:]
    err = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(err) <= 12, err  # the plan in a line, a line a stage (and progress every 30 s)
    assert err[0].startswith("plan: ingest ") and any(x.startswith("[filter] done: ") for x in err)
    assert not any(x.startswith("[ids-") or " run   new" in x for x in err)  # no step lines
    y2 = write_yaml(tmp_path / "j.yaml", small_mixture(str(demo_corpus), str(tmp_path / "out")).replace("name: remote", "name: j")
                    .replace("web: 0.5, wiki: 0.5", "web: 0.6, wiki: 0.4"))
    r = curate("run", str(y2), "--workers", "2", "--log-format", "json", env=joined)
    assert r.returncode == 0, r.stderr[-3000:]
    events = [json.loads(x) for x in r.stderr.splitlines() if x.strip()]  # every line is JSON
    steps = [e for e in events if e["event"] in ("step_start", "progress", "step_end")]
    assert steps and {"stage", "step", "shards_done", "shards_total", "docs_per_s", "eta_s"} <= set(steps[0])
    ends = {e["step"]: e for e in events if e["event"] == "step_end"}
    assert "mix" in ends and ends["mix"]["stage"] == "mix"
    # every step that ran ends once, done, with the shards run.json records, after it started
    rec = json.loads((tmp_path / "out" / "j" / "run.json").read_text())["steps"]
    ran = {k for k, v in rec.items() if v["status"] == "SUCCESS" and v.get("shards")}
    assert ran and ran <= set(ends), sorted(ran - set(ends))
    for k in ran:
        assert ends[k]["shards_done"] == ends[k]["shards_total"] == rec[k]["shards"], (k, ends[k], rec[k])
    order = [(e["event"], e["step"]) for e in events if e["event"] in ("step_start", "step_end")]
    for k in ends:
        assert sum(1 for ev, st in order if ev == "step_end" and st == k) == 1, k
        if ("step_start", k) in order:
            assert order.index(("step_start", k)) < order.index(("step_end", k)), k
    verbose = curate("run", str(y2), "--workers", "2", "--verbose", env=joined)
    assert verbose.returncode == 0 and "skip  done" in verbose.stderr  # the plan step by step
