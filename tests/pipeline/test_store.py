"""The step store (issue 19, first part): mixture files that write to one output share
every step whose hash they share, and each keeps its own run directory."""

from __future__ import annotations

import hashlib

from pipeline.io import atomic
from tests.conftest import curate, mixture_shas, write_yaml

MIX_AND_SAMPLES = {"mix-priority", "mix-select", "mix-route", "mix", "samples-pick", "samples"}


def _variant(demo_run, demo_run_yaml, name: str, old: str, new: str):
    text = demo_run_yaml.read_text()
    assert old in text
    y = write_yaml(demo_run_yaml.parent / f"{name}.yaml", text.replace("name: demo\n", f"name: {name}\n").replace(old, new))
    r = curate("run", str(y), "--workers", "2", "--output", str(demo_run.parent))
    assert r.returncode == 0, r.stderr[-3000:]
    run = demo_run.parent / name
    steps = atomic.read_json(run / "run.json")["steps"]
    return run, {k for k, v in steps.items() if v["status"] == "SUCCESS"}, r


def test_a_weights_only_variant_runs_only_the_mixture_and_keeps_its_own_run_directory(demo_run, demo_run_yaml):
    before = mixture_shas(demo_run)
    run, ran, r = _variant(demo_run, demo_run_yaml, "demo-b", "weights: {web: 0.6, wiki: 0.3, code: 0.1}",
                           "weights: {web: 0.5, wiki: 0.4, code: 0.1}")
    assert ran == MIX_AND_SAMPLES, sorted(ran)
    # both run directories keep their own mixture, each file with the sha256 its manifest records
    after, mine = mixture_shas(demo_run), mixture_shas(run)
    assert after == before and mine != before
    for d, shas in ((demo_run, after), (run, mine)):
        for p, sha in shas.items():
            assert hashlib.sha256((d / p).read_bytes()).hexdigest() == sha
    realized = atomic.read_json(run / "manifest.json")["sources"]
    assert abs(realized["wiki"]["realized_weight"] - 0.4) < 0.01
    # the shared steps are the first run's: the same store directories, linked from both runs
    a, b = (atomic.read_json(x / "run.json") for x in (demo_run, run))
    assert a["store"] == b["store"] == str(demo_run.parent / "_store")
    shared = [k for k in a["steps"] if k not in MIX_AND_SAMPLES]
    assert shared and all(a["steps"][k]["dir"] == b["steps"][k]["dir"] for k in shared)
    for k in shared:
        assert (run / b["steps"][k]["dir"]).resolve() == (demo_run / a["steps"][k]["dir"]).resolve()
    # `curate runs` lists both, side by side, with their realised weights
    import json

    listed = {x["name"]: x for x in json.loads(curate("runs", str(demo_run.parent), "--json").stdout)}
    assert {"demo", "demo-b"} <= set(listed) and "_store" not in listed
    assert listed["demo-b"]["weights"]["wiki"] == realized["wiki"]["realized_weight"]
    assert listed["demo"]["config_hash"] == a["config_hash"] and listed["demo-b"]["status"] == "SUCCESS"
    text = curate("runs", str(demo_run.parent)).stdout
    assert text.splitlines()[0].split()[:3] == ["name", "started", "status"] and "demo-b" in text
    # and `curate plan` of the variant now says every step is done
    out = curate("plan", str(demo_run_yaml.parent / "demo-b.yaml"), "--output", str(demo_run.parent)).stdout
    lines = out.splitlines()
    head = next(i for i, x in enumerate(lines) if x.split()[:3] == ["step", "hash", "action"])
    rows = lines[head + 1: lines.index("", head)]
    assert rows and {x.split()[2] for x in rows} == {"skip"}, rows
    assert f"step store:    {demo_run.parent / '_store'}" in out


def test_a_threshold_only_variant_runs_the_threshold_the_quality_step_and_what_follows(demo_run, demo_run_yaml):
    run, ran, _ = _variant(demo_run, demo_run_yaml, "demo-q", "keep_fraction: 0.5", "keep_fraction: 0.4")
    assert ran == {"quality-web-threshold", "quality-web"} | MIX_AND_SAMPLES, sorted(ran)
