"""The `engine:` section (pipeline/config/engine.py): the tunables that lay out steps are
YAML keys, the environment only overrides them, the override lands in what `curate plan`
shows and names as the reason a step runs again, and none of it changes a config hash or
the plan of a finished run at the defaults."""

from __future__ import annotations

import json
import textwrap

import pytest

from pipeline.config import engine, load
from pipeline.errors import UsageError
from pipeline.run import graph
from pipeline.run.dryrun import describe_plan
from tests.conftest import curate, small_mixture, write_yaml


def _yaml(tmp_path, demo_corpus, extra: str = ""):
    return write_yaml(tmp_path / "m.yaml", textwrap.dedent(small_mixture(str(demo_corpus), str(tmp_path / "out"))) + extra)


def test_yaml_keys_env_overrides_and_bad_values(tmp_path, demo_corpus, monkeypatch):
    for k in engine.ENV.values():
        monkeypatch.delenv(k, raising=False)
    lm = load(_yaml(tmp_path, demo_corpus, "engine: {shuffle_group: 4, merge_bytes: 3000}\n"))
    spec, came = lm.engine()
    assert (spec.shuffle_group, spec.shuffle_fanin, spec.merge_bytes, came) == (4, 64, 3000, {})
    monkeypatch.setenv("CURATE_SHUFFLE_GROUP", "2")
    spec, came = lm.engine()
    assert spec.shuffle_group == 2 and came == {"shuffle_group": "CURATE_SHUFFLE_GROUP=2"}
    assert engine.describe(spec, came) == ("engine:        shuffle_group=2 (CURATE_SHUFFLE_GROUP=2), "
                                           "merge_bytes=3,000 (YAML)")
    monkeypatch.setenv("CURATE_SHUFFLE_GROUP", "1")
    with pytest.raises(UsageError, match=r"CURATE_SHUFFLE_GROUP='1': give .* \(2 or more\), or unset it for "
                                         r"engine.shuffle_group \(4\)"):
        lm.engine()
    # a bad YAML value names the key and its line; an unknown key is refused
    with pytest.raises(UsageError, match=r"m.yaml:\d+: engine.shuffle_group"):
        load(_yaml(tmp_path, demo_corpus, "engine: {shuffle_group: 1}\n"))
    with pytest.raises(UsageError, match=r"engine.group"):
        load(_yaml(tmp_path, demo_corpus, "engine: {group: 4}\n"))


def test_engine_is_not_the_mixture_config_and_lands_in_the_planned_steps(tmp_path, demo_corpus, monkeypatch):
    """The config hash (run.json, manifest, publish) ignores `engine:`; the merge steps carry
    the settings, read on the driver, and the plan shows them."""
    for k in engine.ENV.values():
        monkeypatch.delenv(k, raising=False)
    plain = load(_yaml(tmp_path, demo_corpus))
    tuned = load(_yaml(tmp_path, demo_corpus, "engine: {shuffle_group: 3, shuffle_fanin: 5}\n"))
    assert plain.config_hash() == tuned.config_hash() and "engine" not in tuned.canonical()
    out = tmp_path / "out"
    ctx = graph.build(tuned, out / "m", out / "_store")
    merges = [s for s in ctx.steps if s.kind == "shuffle-merge"]
    assert merges and all(s.config["group"] == 3 and s.config["fanin"] == 5 for s in merges)
    assert all(s.meta["engine"]["shuffle_group"] == 3 for s in merges)
    plain_ctx = graph.build(plain, out / "m", out / "_store")
    assert {s.name for s in plain_ctx.steps} == {s.name for s in ctx.steps}
    changed = {s.name for s in plain_ctx.steps} - {s.name for s in plain_ctx.steps
                                                  if s.hash in {t.hash for t in ctx.steps}}
    assert {s.name for s in merges} <= changed  # the merges, and what reads them, are other steps
    assert "engine:        shuffle_group=3 (YAML), shuffle_fanin=5 (YAML)" in describe_plan(tuned).splitlines()
    assert not any(x.startswith("engine:") for x in describe_plan(plain).splitlines())


def test_an_env_override_on_a_finished_run_is_named_as_the_reason(demo_run, demo_run_yaml):
    """`CURATE_SHUFFLE_GROUP=2 curate plan` on the finished demo: every step it re-plans is a
    merge (or reads one), and each merge names the setting and the variable; unset, all skip."""
    record = json.loads((demo_run / "run.json").read_text())
    assert record["engine"] == engine.DEFAULTS and record["engine_from_env"] == {}
    assert record["steps"]["mix-route-merge"]["engine"] == {"shuffle_group": 32, "shuffle_fanin": 64,
                                                            "merge_bytes": 2 << 30}
    out = str(demo_run.parent)
    rows = _rows(curate("plan", str(demo_run_yaml), "--output", out).stdout)
    assert {r.split()[2] for r in rows} == {"skip"}
    text = curate("plan", str(demo_run_yaml), "--output", out, env={"CURATE_SHUFFLE_GROUP": "2"}).stdout
    assert "engine:        shuffle_group=2 (CURATE_SHUFFLE_GROUP=2)" in text
    why = {r.split()[0]: r.split(None, 3)[3] for r in _rows(text) if r.split()[2] == "run"}
    merges = [n for n in why if n.endswith("-merge") or n.startswith("merge-")]
    assert merges and all(why[n].startswith("config changed: engine.shuffle_group 32 -> 2 (CURATE_SHUFFLE_GROUP=2)")
                          for n in merges), why
    assert all("config changed" not in w for n, w in why.items() if n not in merges)


def _rows(out: str) -> list[str]:
    lines = out.splitlines()
    head = next(i for i, x in enumerate(lines) if x.split()[:3] == ["step", "hash", "action"])
    return lines[head + 1: lines.index("", head)]
