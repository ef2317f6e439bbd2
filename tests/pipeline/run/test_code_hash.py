"""Code in the step hash, checked on the plan (no Ray): a filter type's or a classifier
family's registered version, the installed version of a library whose output a step stores,
and the source of a user's function each change the hashes of exactly the steps that run
them (and what reads those), and `curate plan` says "code changed" and what changed."""

from __future__ import annotations

import re
from importlib import metadata

import pytest

from filters import base
from filters.classifiers import family
from pipeline import config
from pipeline.io import atomic
from pipeline.plan import code
from pipeline.run import graph, record
from pipeline.run.dryrun import describe_plan
from tests.conftest import demo_mixture, write_yaml


def _plan(path):
    lm = config.load(path)
    run_dir = lm.output_dir(str(path.parent / "out"))
    return lm, graph.build(lm, run_dir, lm.store_dir(str(path.parent / "out")))


def _downstream(ctx, names: set[str]) -> set[str]:
    """`names` and every step that reads one of them, directly or not."""
    out = set(names)
    for s in ctx.steps:  # in plan order: a step's inputs come before it
        if any(i.name in out for i in s.inputs):
            out.add(s.name)
    return out


def _record_run(lm, ctx, path) -> None:
    """run.json as a finished run leaves it (its steps' hashes and code), for the next plan."""
    steps = {s.name: record.step_record(ctx, s, "SUCCESS") for s in ctx.steps}
    atomic.write_json(ctx.run_dir / "run.json", {"name": lm.mixture.name, "steps": steps})


def _why(lm, path) -> dict[str, str]:
    """`curate plan`'s table: step -> why it runs."""
    text = describe_plan(lm, str(path.parent / "out"))
    lines = text.splitlines()
    head = next(i for i, x in enumerate(lines) if x.split()[:3] == ["step", "hash", "action"])
    # the reason, without what the plan adds of reuse by content (`: run K of N shards (M reused)`, `; shards ...`)
    return {x.split()[0]: re.sub(r"(: run \d+ of \d+ shards \(\d+ reused\)|; shards reused by content once .*)$", "",
                                 x.split(None, 3)[3]) for x in lines[head + 1: lines.index("", head)]}


@pytest.fixture
def demo(demo_corpus, tmp_path):
    y = write_yaml(tmp_path / "demo.yaml", demo_mixture(demo_corpus))
    lm, ctx = _plan(y)
    _record_run(lm, ctx, y)
    return y, {s.name: s.hash for s in ctx.steps}


def test_a_filter_or_family_version_bump_reruns_the_steps_that_run_it(demo, monkeypatch):
    y, before = demo
    monkeypatch.setattr(base.filter_class("gopher_repetition"), "version", "3")  # as register_filter(version="3")
    lm, ctx = _plan(y)
    changed = {s.name for s in ctx.steps if s.hash != before[s.name]}
    assert changed == _downstream(ctx, {"filter-web"}), sorted(changed)  # only the web source uses it
    assert ctx.step("filter-web").code["filters"]["gopher_repetition"] == "3"
    why = _why(lm, y)
    assert why["filter-web"] == "code changed: filters.gopher_repetition 2 -> 3", why["filter-web"]
    assert why["dedup-exact-map"] == "inputs changed" and why["filter-wiki"] == "output missing"

    monkeypatch.setattr(base.filter_class("gopher_repetition"), "version", "2")
    monkeypatch.setattr(type(family("fasttext")), "version", "3")  # as register_classifier(version="3")
    lm, ctx = _plan(y)
    changed = {s.name for s in ctx.steps if s.hash != before[s.name]}
    assert changed == _downstream(ctx, {"classify-wiki_vs_web-train"}), sorted(changed)
    assert "classify-wiki_vs_web-examples" not in changed  # the sample of examples does not use the model
    assert _why(lm, y)["classify-wiki_vs_web-train"] == "code changed: classifier.fasttext 2 -> 3"


def test_a_library_upgrade_reruns_the_steps_that_store_its_output(demo, monkeypatch):
    """ftfy's version is in the web filter step (its chain repairs text with ftfy), fastText's
    in every filter step with language ID and in the classifier's steps."""
    y, before = demo
    lm, ctx = _plan(y)
    libs = ctx.step("filter-web").code["libraries"]
    assert libs["ftfy"] == metadata.version("ftfy") and libs["spacy"] == metadata.version("spacy")
    assert libs["fasttext"] == ctx.step("classify-wiki_vs_web-train").code["libraries"]["fasttext"] is not None
    assert "libraries" not in ctx.step("filter-code").code  # a length filter calls no library

    installed = code.library_version
    monkeypatch.setattr(code, "library_version", lambda name: "6.0.0" if name == "ftfy" else installed(name))
    lm, ctx = _plan(y)
    changed = {s.name for s in ctx.steps if s.hash != before[s.name]}
    assert changed == _downstream(ctx, {"filter-web"}), sorted(changed)
    assert _why(lm, y)["filter-web"] == f"code changed: libraries.ftfy {libs['ftfy']} -> 6.0.0"

    monkeypatch.setattr(code, "library_version", lambda name: "0.9.0" if name == "fasttext" else installed(name))
    lm, ctx = _plan(y)
    changed = {s.name for s in ctx.steps if s.hash != before[s.name]}
    assert changed == _downstream(ctx, {"filter-web", "filter-wiki", "classify-wiki_vs_web-train"}), sorted(changed)
    assert "filter-code" not in changed and "classify-wiki_vs_web-examples" in changed  # it reads filter-web


USER_MODULE = '''
def keep(text):
    return len(text) > {n}


def page_text(html):
    return html.replace("<p>", "").replace("</p>", "")
'''


def test_editing_a_user_function_reruns_the_steps_that_call_it(tmp_path, monkeypatch):
    """A `type: python` filter and a `type: python` extractor name functions of the user's
    module: an edit to its file changes the filter and ingest steps that call them."""
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = tmp_path / "my_rules_for_code_hash.py"
    mod.write_text(USER_MODULE.format(n=5))
    (tmp_path / "a.jsonl").write_text('{"text": "hello there world"}\n')
    (tmp_path / "p.jsonl").write_text('{"html": "<p>a page</p>"}\n')
    y = write_yaml(tmp_path / "u.yaml", """
        name: u
        sources:
          notes: {paths: ["a.jsonl"], filters: [mine]}
          pages:
            paths: ["p.jsonl"]
            html_field: html
            extract: {type: python, callable: "my_rules_for_code_hash:page_text"}
          other: {paths: ["a.jsonl"], filters: [short]}
        filters:
          mine: {type: python, callable: "my_rules_for_code_hash:keep"}
          short: {type: length, min_chars: 3}
        mixture: {target_tokens: 10, weights: {notes: 0.4, pages: 0.3, other: 0.3}, on_shortfall: renormalize}
        """)
    lm, ctx = _plan(y)
    digest = code.source_digest("my_rules_for_code_hash:keep")
    assert ctx.step("filter-notes").code["callables"] == {"my_rules_for_code_hash:keep": digest}
    assert ctx.step("ingest-pages").code["callables"] == {"my_rules_for_code_hash:page_text": digest}
    _record_run(lm, ctx, y)
    before = {s.name: s.hash for s in ctx.steps}

    mod.write_text(USER_MODULE.format(n=50))  # the module is imported already: the file is what counts
    lm, ctx = _plan(y)
    changed = {s.name for s in ctx.steps if s.hash != before[s.name]}
    assert changed == _downstream(ctx, {"filter-notes", "ingest-pages"}), sorted(changed)
    assert "filter-other" not in changed and "ingest-notes" not in changed
    why = _why(lm, y)
    assert why["filter-notes"] == "code changed: callables.my_rules_for_code_hash:keep edited", why
    assert why["ingest-pages"] == "code changed: callables.my_rules_for_code_hash:page_text edited", why


def test_a_run_recorded_without_code_hashes_says_code_changed(demo):
    """run.json of a Curate whose hashes held no code: every step's hash changed with the
    upgrade, and the plan says it is the code, not the config."""
    y, _ = demo
    lm, ctx = _plan(y)
    rec = atomic.read_json(ctx.run_dir / "run.json")
    for r in rec["steps"].values():
        del r["code_hash"], r["code"]
    atomic.write_json(ctx.run_dir / "run.json", rec)
    assert set(_why(lm, y).values()) == {"code changed (the last run was planned by an older Curate)"}
