"""A mixture axis from a stage (docs/extending.md): the toy `length` stage (length_stage.py),
a module outside Curate that the YAML names under `plugins:`, declares an axis, and
`web/length=long` is a weight key with no mixing code of its own: the cells, their budgets,
the selection, the manifest, explain and the ledger follow."""

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

PLUGIN = "plugins: [tests.pipeline.run.length_stage]\n"


def _yaml(tmp_path, demo_corpus, weights: str, extra: str = PLUGIN):
    text = textwrap.dedent(small_mixture(str(demo_corpus), str(tmp_path / "out")))
    return write_yaml(tmp_path / "m.yaml", text.replace("weights: {web: 0.5, wiki: 0.5}", f"weights: {{{weights}}}")
                      + extra)


def test_a_plugin_stage_is_planned_from_the_yaml_alone_with_its_settings_checked_at_their_key(tmp_path, demo_corpus):
    weights = "web/length=long: 0.5, web/length=other: 0.1, wiki: 0.4"
    lm = config.load(_yaml(tmp_path, demo_corpus, weights, PLUGIN + "stages:\n  length: {edges: [400, 1500]}\n"))
    ctx = graph.build(lm, tmp_path / "out" / "m", tmp_path / "out" / "_store")  # graph.STAGES: no list of ours
    names = [s.name for s in ctx.stages]
    assert names.index("length") == names.index("validation") + 1  # `after`
    step = ctx.step("length")
    assert step.config == {"edges": [400, 1500]} and step.stage == "length"
    shard_mb = max(s.max_shard_bytes for s in lm.mixture.sources.values()) / 2**20
    assert step.memory_mb == int(512 + 6 * shard_mb)  # what its Stage declares of its kind of task
    assert "source" in step.code  # a task outside Curate: keyed by its file's bytes
    assert ctx.step("mix-axes") is not None and "length" in ctx.axes["web"]
    plain = graph.build(config.load(_yaml(tmp_path, demo_corpus, weights)), tmp_path / "out" / "m", tmp_path / "o2")
    assert plain.step("length").config == {"edges": [500, 2000]}  # the settings' defaults without a section
    # what is wrong is said at its key, with what to do
    for extra, want in (
            ("plugins: [no_such.module]\n", r"m.yaml:\d+: plugins\[0\]: cannot import 'no_such.module': "
                                            r"ModuleNotFoundError.*importable where the run and its workers run"),
            ("plugins: [tests.conftest]\n", r"plugins\[0\]: module 'tests.conftest' declares no STAGE"),
            (PLUGIN + "stages:\n  lenght: {}\n", r"stages\.lenght: no plugin stage is named 'lenght' "
                                                  r"\(plugins declare: length\)"),
            (PLUGIN + "stages:\n  length: {edge: [1, 2]}\n", r"m.yaml:\d+: stages\.length\.edge"),
            ("stages:\n  length: {}\n", r"no plugin stage is named 'length'; add its module to `plugins:`")):
        with pytest.raises(UsageError, match=want):
            config.load(_yaml(tmp_path, demo_corpus, "web: 0.5, wiki: 0.5", extra))


def test_the_extending_doc_shows_the_axis_stage_that_runs():
    doc = (ROOT / "docs" / "extending.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, re.S)
    assert (ROOT / "tests" / "pipeline" / "run" / "length_stage.py").read_text() in blocks


def test_an_axis_no_stage_declares_is_refused_at_plan_time(tmp_path, demo_corpus):
    lm = config.load(_yaml(tmp_path, demo_corpus, "web/size=big: 0.5, web/size=other: 0.1, wiki: 0.4"))
    with pytest.raises(UsageError, match=r"web/size=big names axis 'size', but no stage declares it for web; "
                                         r"its axes: lang, length"):
        graph.build(lm, tmp_path / "out" / "m", tmp_path / "out" / "_store")
    with pytest.raises(UsageError, match=r"m.yaml:\d+: mixture.weights.web: web: give every weight key of web the "
                                         r"same axes \(length=<value>, as web/length=long does"):  # checked as the file loads
        config.load(_yaml(tmp_path, demo_corpus, "web/length=long: 0.5, web: 0.1, wiki: 0.4"))


def test_a_stage_declared_axis_is_a_mixture_cell(tmp_path, demo_corpus, ray_local):
    lm = config.load(_yaml(tmp_path, demo_corpus, "web/length=long: 0.3, web/length=other: 0.2, wiki: 0.5"))
    ctx = graph.build(lm, lm.output_dir(), lm.store_dir())
    assert [c.name for c in ctx.mix.phases[0]["cells"] if c.source == "web"] == \
        ["web/length=long", "web/length=other"]
    run_dir = runner.run(lm, workers=2, log=lambda m: None, quiet=True)
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
    stages = graph.run_stages(run_dir)  # Curate's and the plugin run.json's config names: its hooks
    for r in [x for x in web if len(x["text"]) >= 2000][:3] + [x for x in web if len(x["text"]) < 500][:3]:
        info = explain.find(run_dir, r["id"], stages)
        got = [i for i in info if i["source"] == "web"][0]
        assert got["cell"] == ("web/length=long" if len(r["text"]) >= 2000 else "web/length=other"), got
        shown = next(st for st in got["stages"] if st["stage"] == "length")  # the stage's explain hook
        assert shown["scores"] == {"length": "long" if len(r["text"]) >= 2000 else "short"}, got["stages"]
    led = atomic.read_json(run_dir / "ledger.json")
    assert led["sources"]["web"]["conservation"] is True
    # the stage's report hook: documents per class, from its markers, in report.json and report.html
    rep = atomic.read_json(run_dir / "report.json")
    fig = rep["sources"]["web"]["stages"]["length"]
    reached = next(f["docs"] for f in rep["sources"]["web"]["funnel"] if f["stage"] == "length")
    assert set(fig) == {"short", "medium", "long"} and sum(v["documents"] for v in fig.values()) == reached > 0, (fig, reached)
    assert "<h3>length</h3>" in (run_dir / "report.html").read_text()


AXES = """
name: axes
output: {out}
tokenizer: gpt2
plugins: [tests.pipeline.run.length_stage]
stages: {{length: {{edges: [300, 600]}}}}
sources:
  wiki:
    paths: ["{c}/wiki/summaries_es.parquet", "{c}/wiki/summaries_fr.parquet", "{c}/wiki/summaries_en.parquet"]
    id_field: id
    max_shard_rows: 4000
    filters: [lid]
filters:
  lid: {{type: language, label_only: true}}
mixture:
  target_tokens: 300000
  shard_tokens: 100000
  weights: {{wiki/lang=fr/length=long: 0.15, wiki/lang=fr/length=short: 0.15, wiki/lang=fr/length=other: 0.1,
            wiki/length=long/lang=es: 0.2, wiki/lang=es/length=other: 0.1, wiki/lang=en/length=other: 0.3}}
"""


def test_a_stage_axis_and_languages_combined_are_cells_realised_within_0_003(tmp_path, demo_corpus, ray_local):
    """The plugin's `length` (edges 300 and 600 characters) and the detected language, combined
    in one key in either order: 12 cells (3 named languages and `other`, 2 named lengths and
    `other`), the named ones realised within 0.003 of their weights, the rest empty; the
    manifest and the report name each cell's language and length, and explain a document's."""
    lm = config.load(write_yaml(tmp_path / "a.yaml", AXES.format(out=tmp_path / "out", c=demo_corpus)))
    ctx = graph.build(lm, lm.output_dir(), lm.store_dir())
    names = [c.name for c in ctx.mix.phases[0]["cells"]]
    assert len(names) == 12 and "wiki/length=long/lang=es" in names and "wiki/lang=other/length=other" in names, names
    run_dir = runner.run(lm, workers=2, log=lambda m: None, quiet=True)
    man = atomic.read_json(run_dir / "manifest.json")
    weights = dict(lm.mixture.mixture.weights)
    worst = 0.0
    for name, c in man["cells"].items():
        worst = max(worst, abs(c["realized_weight"] - weights.get(name, 0.0)))
        lang, length = (kv.split("=")[1] for kv in sorted(p for p in name.split("/")[1:]))
        assert (c["lang"], c["length"]) == (lang, length), (name, c)
    print(f"\nlanguage x length cells: worst realised-weight error {worst:.5f}")
    assert worst <= 0.003, {k: (c["realized_weight"], weights.get(k)) for k, c in man["cells"].items()}
    assert atomic.read_json(run_dir / "report.json")["cells"]["cells"].keys() == man["cells"].keys()
    t = pq.read_table(run_dir / "mixture", columns=["id", "text", "lang"]).to_pylist()
    for r in t[:: max(1, len(t) // 12)]:
        got = [i for i in explain.find(run_dir, r["id"]) if i["source"] == "wiki"][0]
        n = len(r["text"])
        length = "long" if n >= 600 else "short" if n < 300 else "other"
        lang = r["lang"] if r["lang"] in ("fr", "es", "en") else "other"
        assert got["status"] == "kept" and set(got["cell"].split("/")[1:]) == {f"lang={lang}", f"length={length}"}, got
    assert atomic.read_json(run_dir / "ledger.json")["sources"]["wiki"]["conservation"] is True


def test_an_installed_package_registers_its_stage_by_an_entry_point(tmp_path, demo_corpus, monkeypatch):
    """An entry point in the group `curate.stages` (what `pip install` of a package declaring one
    writes: a dist-info folder on the path) adds its stage to every run, no `plugins:` needed."""
    dist = tmp_path / "site" / "curate_length-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: curate-length\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[curate.stages]\nlength = tests.pipeline.run.length_stage:STAGE\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    lm = config.load(_yaml(tmp_path, demo_corpus, "web/length=long: 0.5, web/length=other: 0.1, wiki: 0.4", extra=""))
    assert [s.name for s in lm.plugin_stages] == ["length"]
    assert graph.build(lm, tmp_path / "out" / "m", tmp_path / "out" / "_store").step("length") is not None
    (dist / "entry_points.txt").write_text("[curate.stages]\nlength = tests.pipeline.run.no_such_module:STAGE\n")
    with pytest.raises(UsageError, match=r"the installed stage 'length' \(tests.pipeline.run.no_such_module:STAGE, "
                                         r"entry point group curate.stages\) cannot load: ModuleNotFoundError"):
        config.load(_yaml(tmp_path, demo_corpus, "web: 0.5, wiki: 0.5", extra=""))
