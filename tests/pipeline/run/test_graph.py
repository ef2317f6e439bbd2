"""The run's graph planned without Ray: the demo's steps, names, hashes and inputs in a
fraction of a second, and an edit changes the hashes of exactly the steps it touches."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from pipeline import config
from pipeline.engine.step import Step
from pipeline.engine.where import task_options
from pipeline.plan.stage import TaskKind
from pipeline.run import graph
from tests.conftest import ROOT, curate, demo_mixture, write_yaml

DEMO_STEPS = [
    "ids-wiki", "merge-ids-wiki", "unique-ids-wiki", "ingest-wiki", "merge-id-index-wiki", "id-index-wiki",
    "ingest-web", "merge-id-index-web", "id-index-web",
    "ids-code", "merge-ids-code", "unique-ids-code", "ingest-code", "merge-id-index-code", "id-index-code",
    "ids-humaneval", "merge-ids-humaneval", "unique-ids-humaneval", "ingest-humaneval", "merge-id-index-humaneval",
    "id-index-humaneval",
    "filter-wiki", "filter-web", "filter-code",
    "dedup-exact-map", "dedup-exact-map-merge", "dedup-exact-reduce", "dedup-exact-reduce-merge", "dedup-exact",
    "dedup-fuzzy-sample", "dedup-fuzzy-heavy", "dedup-fuzzy-signatures", "dedup-fuzzy-signatures-merge", "dedup-fuzzy-buckets", "dedup-fuzzy-buckets-merge",
    "dedup-fuzzy-fetch", "dedup-fuzzy-fetch-merge", "dedup-fuzzy-verify", "dedup-fuzzy-clusters",
    "dedup-fuzzy-clusters-merge", "dedup-fuzzy", "dedup-paragraph-map", "dedup-paragraph-map-merge",
    "dedup-paragraph-reduce", "dedup-paragraph-reduce-merge", "dedup-paragraph",
    "decontaminate-index", "decontaminate", "validation-keys", "validation-select", "validation",
    "classify-wiki_vs_web-examples", "classify-wiki_vs_web-train", "classify-wiki_vs_web-web",
    "quality-web-threshold", "quality-web", "tokenize-wiki", "tokenize-web", "tokenize-code",
    "mix-budget", "mix-priority", "mix-select", "mix-route", "mix-route-merge", "mix",
    "tokens-megatron", "tokens-megatron-validation", "tokens-memmap", "tokens-memmap-validation",
    "samples-pick", "samples",
]

PLAN_SCRIPT = """
import json, sys, time
from pathlib import Path
t0 = time.perf_counter()
from pipeline import config
from pipeline.run import graph
ctx = graph.build(config.load(sys.argv[1]), Path(sys.argv[2]))
print(json.dumps({"seconds": time.perf_counter() - t0, "ray": "ray" in sys.modules,
                  "steps": [[s.name, s.hash, sorted(i.name for i in s.inputs), ctx.stage_of[s.name]] for s in ctx.steps]}))
"""


@pytest.fixture(scope="module")
def demo_yaml(demo_corpus, tmp_path_factory):
    d = tmp_path_factory.mktemp("graph")
    return write_yaml(d / "demo.yaml", demo_mixture(demo_corpus))


def _plan(yaml_path) -> dict:
    r = subprocess.run([sys.executable, "-c", PLAN_SCRIPT, str(yaml_path), str(yaml_path.parent / "run")],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_the_demo_graph_is_planned_without_ray(demo_yaml):
    """A fresh process plans the demo (imports included) without importing Ray, and twice
    gives the same names, hashes and inputs. (About 1 s here; the bound only catches a plan
    that starts doing work per document: CI does not gate on a timing.)"""
    a, b = _plan(demo_yaml), _plan(demo_yaml)
    assert not a["ray"], "planning imported Ray"
    assert a["seconds"] < 15.0, a["seconds"]
    assert [s[0] for s in a["steps"]] == DEMO_STEPS
    assert a["steps"] == b["steps"]
    steps = {name: (h, inputs, stage) for name, h, inputs, stage in a["steps"]}
    assert len({h for h, _, _ in steps.values()}) == len(steps)  # every step its own hash
    assert steps["filter-web"][1] == ["ingest-web"] and steps["ingest-web"][2] == "ingest"
    assert steps["mix"][1] == ["mix-route", "mix-route-merge"] and steps["mix"][2] == "mix"
    assert steps["dedup-exact-map"][1] == ["filter-code", "filter-web", "filter-wiki", "ingest-humaneval"]
    assert steps["quality-web"][1] == ["quality-web-threshold"]
    # the samples read every decision up to the mixture's selection, not the mixture's files
    assert "mix-select" in steps["samples-pick"][1] and "mix" not in steps["samples-pick"][1]
    assert {s for s, (_, _, stage) in steps.items() if stage == "samples"} == {"samples-pick", "samples"}


def _hashes(text: str, path) -> dict[str, str]:
    ctx = graph.build(config.load(write_yaml(path, text)), path.parent / "run")
    return {s.name: s.hash for s in ctx.steps}


def _downstream(text: str, path, name: str) -> set[str]:
    """`name` and every step that reads it, directly or not, by the plan's inputs."""
    ctx = graph.build(config.load(write_yaml(path, text)), path.parent / "run")
    out = {name}
    for s in ctx.steps:  # in plan order: a step's inputs come before it
        if any(i.name in out for i in s.inputs):
            out.add(s.name)
    return out


def test_an_edit_changes_the_hashes_of_exactly_the_steps_it_touches(demo_yaml, tmp_path):
    """The experiment loop's promise, checked on the plan: a weight edit re-runs only the
    mix and the samples; a filter threshold re-runs its source's filter and what reads it."""
    text = demo_yaml.read_text()
    base = _hashes(text, tmp_path / "a.yaml")
    weights = _hashes(text.replace("web/q5: 0.25, web/q3-q4: 0.35", "web/q5: 0.2, web/q3-q4: 0.4"), tmp_path / "b.yaml")
    changed = {s for s in base if base[s] != weights[s]}
    assert changed == {"mix-budget", "mix-priority", "mix-select", "mix-route", "mix-route-merge", "mix", "tokens-megatron",
                       "tokens-memmap", "samples-pick", "samples"}  # the token files are gathered again, never encoded (tokenize-*)
    threshold = _hashes(text.replace("not_huge: {type: length, max_chars: 20000}", "not_huge: {type: length, max_chars: 15000}"),
                        tmp_path / "c.yaml")
    changed = {s for s in base if base[s] != threshold[s]}
    assert changed == _downstream(text, tmp_path / "d.yaml", "filter-code"), sorted(changed)
    assert {"dedup-exact-map", "classify-wiki_vs_web-train", "mix", "samples"} <= changed
    assert not {s for s in changed if s.startswith(("ingest-", "ids-", "unique-ids-", "id-index-", "filter-w"))}


def _not_a_module_function():
    def inner(spec, out):
        return {}
    return inner


def test_a_task_must_be_a_module_level_function():
    """A worker imports a task by module and qualified name: a closure is refused when the
    plan is built, not in a worker."""
    with pytest.raises(TypeError, match="not a module-level function"):
        Step("x", "x", {}, [], _not_a_module_function(), shards=lambda st, stats: [])
    with pytest.raises(TypeError, match="not a module-level function"):
        Step("x", "x", {}, [], lambda spec, out: {}, shards=lambda st, stats: [])
    s = Step("x", "x", {}, [], test_a_task_must_be_a_module_level_function, shards=lambda st, stats: [])
    assert s.task == "tests.pipeline.run.test_graph:test_a_task_must_be_a_module_level_function" and s.version == "1"


def test_validate_reports_a_missing_classifier_model_or_eval_file(tmp_path):
    """`curate validate` makes the checks `curate run` makes: a model file or an eval file
    that is not there is a config error naming the key, before anything runs."""
    (tmp_path / "a.jsonl").write_text('{"text": "hello there world"}\n')
    y = write_yaml(tmp_path / "x.yaml", """
        name: t
        sources:
          web:
            paths: ["a.jsonl"]
            quality: {classifier: clf, keep_fraction: 0.5}
        classifiers:
          clf: {type: fasttext, model: missing.bin}
        decontaminate:
          against: [{name: bench, paths: ["evals/*.jsonl"]}]
        """)
    r = curate("validate", str(y))
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{y}:7: classifiers.clf.model: no such model file: {tmp_path / 'missing.bin'}" in r.stderr
    assert f"{y}:9: decontaminate.against[0].paths[0]: no file matches evals/*.jsonl" in r.stderr


def test_text_carrying_tasks_declare_their_memory_and_a_declaration_always_fits_a_node(demo_yaml, tmp_path):
    """Ray packs tasks by CPU unless told: the steps whose tasks hold a shard of text declare
    memory from the sources' max_shard_bytes (capped at 80% of the largest node), the rest none."""
    from pipeline.engine.where import task_options

    lm = config.load(demo_yaml)
    steps = {s.name: s for s in graph.build(lm, tmp_path / "run").steps}
    shard_mb = max(s.max_shard_bytes for s in lm.mixture.sources.values()) / 2**20
    for name in ("ingest-web", "filter-web", "mix", "samples", "dedup-fuzzy-fetch", "classify-wiki_vs_web-train"):
        assert steps[name].memory_mb == int(512 + 6 * shard_mb), name
    for name in ("ids-wiki", "unique-ids-wiki", "dedup-exact-map", "mix-select", "dedup-fuzzy-clusters"):
        assert steps[name].memory_mb is None, name
    assert task_options(steps["filter-web"], node_mb=16_000) == {"memory": steps["filter-web"].memory_mb * 2**20}
    assert task_options(steps["filter-web"], node_mb=500) == {"memory": int(400 * 2**20)}  # never more than a node has
    assert task_options(steps["dedup-fuzzy-clusters"], node_mb=16_000) == {"num_cpus": 0}
    assert task_options(steps["ids-wiki"], node_mb=16_000) == {}
    assert "memory_mb" not in str(steps["filter-web"].config)  # not in the hash: the bytes never depend on it


def test_progress_folds_every_step_under_the_stage_that_planned_it(demo_yaml, tmp_path):
    """Each step shows under the stage that planned it, as its Stage record names it (a label,
    else its name): derived from graph.STAGES, never a list of step-name prefixes."""
    ctx = graph.build(config.load(demo_yaml), tmp_path / "run")
    shown = {s.name: s.stage for s in ctx.steps}
    want = {"ids-wiki": "ingest", "merge-ids-wiki": "ingest", "id-index-web": "ingest", "ingest-web": "ingest",
            "filter-web": "filter", "dedup-fuzzy-buckets": "dedup", "decontaminate-index": "decontaminate",
            "classify-wiki_vs_web-train": "classify", "quality-web": "classify", "mix-route": "mix",
            "samples-pick": "samples"}
    assert {n: shown.get(n) for n in want} == want
    assert {s.stage for s in ctx.steps} <= {st.label or st.name for st in graph.STAGES}
    assert all(shown[n] == "tokenize" for n in shown if n.startswith(("tokenize-", "tokens-"))), shown
    # a stage from elsewhere: its steps show under its own name, and what its Stage record declares of
    # their kind of task reaches Ray's options (memory from the text copies, GPUs)
    from tests.pipeline.run import length_stage

    extra = dataclasses.replace(length_stage.STAGE, tasks=(TaskKind("length", text_copies=3, gpus=1),))
    lm = config.load(demo_yaml)
    ctx = graph.build(lm, tmp_path / "run2", stages=[*graph.STAGES, extra])
    step = ctx.step("length")
    shard_mb = max(s.max_shard_bytes for s in lm.mixture.sources.values()) / 2**20
    assert step.stage == "length" and step.gpus == 1 and step.memory_mb == int(512 + 3 * shard_mb)
    assert task_options(step, node_mb=16_000) == {"num_gpus": 1, "memory": step.memory_mb * 2**20}
    assert ctx.step("filter-web").gpus == 0  # a built-in kind declares none
