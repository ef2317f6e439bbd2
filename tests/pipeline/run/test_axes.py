"""A mixture axis from a stage (docs/extending.md): the toy `length` stage (length_stage.py)
declares an axis, and `web/length=long` is a weight key with no mixing code of its own:
the cells, their budgets, the selection, the manifest, explain and the ledger follow."""

from __future__ import annotations

import re
import textwrap

import pyarrow.parquet as pq
import pytest

from pipeline import config
from pipeline.errors import UsageError
from pipeline.io import atomic
from pipeline.run import graph, runner
from pipeline.views import explain
from tests.conftest import ROOT, small_mixture, write_yaml
from tests.pipeline.run import length_stage

STAGES = [*graph.STAGES[:graph.STAGES.index(next(s for s in graph.STAGES if s.name == "classify"))],
          length_stage.STAGE,  # the one line: before the stages that read the layers (classify, mix)
          *graph.STAGES[[s.name for s in graph.STAGES].index("classify"):]]


def _yaml(tmp_path, demo_corpus, weights: str):
    text = textwrap.dedent(small_mixture(str(demo_corpus), str(tmp_path / "out")))
    return write_yaml(tmp_path / "m.yaml", text.replace("weights: {web: 0.5, wiki: 0.5}", f"weights: {{{weights}}}"))


def test_the_extending_doc_shows_the_axis_stage_that_runs():
    doc = (ROOT / "docs" / "extending.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, re.S)
    assert (ROOT / "tests" / "pipeline" / "run" / "length_stage.py").read_text() in blocks


def test_an_axis_no_stage_declares_is_refused_at_plan_time(tmp_path, demo_corpus):
    lm = config.load(_yaml(tmp_path, demo_corpus, "web/size=big: 0.5, web/size=other: 0.1, wiki: 0.4"))
    with pytest.raises(UsageError, match=r"web/size=big names axis 'size', but no stage declares it for web; "
                                         r"its axes: lang, length"):
        graph.build(lm, tmp_path / "out" / "m", tmp_path / "out" / "_store", STAGES)
    with pytest.raises(UsageError, match=r"m.yaml:\d+: mixture.weights.web: web: give every weight key of web the "
                                         r"same axis"):  # one axis a source: checked as the file loads
        config.load(_yaml(tmp_path, demo_corpus, "web/length=long: 0.5, web: 0.1, wiki: 0.4"))


def test_a_stage_declared_axis_is_a_mixture_cell(tmp_path, demo_corpus, ray_local):
    lm = config.load(_yaml(tmp_path, demo_corpus, "web/length=long: 0.3, web/length=other: 0.2, wiki: 0.5"))
    ctx = graph.build(lm, lm.output_dir(), lm.store_dir(), STAGES)
    assert [c.name for c in ctx.mix.phases[0]["cells"] if c.source == "web"] == \
        ["web/length=long", "web/length=other"]
    run_dir = runner.run(lm, workers=2, log=lambda m: None, quiet=True, stages=STAGES)
    man = atomic.read_json(run_dir / "manifest.json")
    cells = man["cells"]
    assert cells["web/length=long"]["length"] == "long" and cells["web/length=other"]["length"] == "other"
    total = sum(c["tokens"] for c in cells.values())
    for name, want in (("web/length=long", 0.3), ("web/length=other", 0.2), ("wiki", 0.5)):
        assert abs(cells[name]["tokens"] / total - want) < 0.02, (name, cells[name])
    # every web document of the mixture is in the cell of its class: the long ones in web/length=long
    t = pq.read_table(run_dir / "mixture", columns=["id", "source", "text"]).to_pylist()
    web = [r for r in t if r["source"] == "web"]
    assert web and any(len(r["text"]) >= 2000 for r in web) and any(len(r["text"]) < 2000 for r in web)
    for r in [x for x in web if len(x["text"]) >= 2000][:3] + [x for x in web if len(x["text"]) < 500][:3]:
        info = explain.find(run_dir, r["id"])
        got = [i for i in info if i["source"] == "web"][0]
        assert got["cell"] == ("web/length=long" if len(r["text"]) >= 2000 else "web/length=other"), got
    led = atomic.read_json(run_dir / "ledger.json")
    assert led["sources"]["web"]["conservation"] is True
