"""The step store (issue 19, first part): mixture files that write to one output share
every step whose hash they share, and each keeps its own run directory."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.engine.step import read_markers
from pipeline.io import atomic
from tests.conftest import curate, mixture_shas, write_yaml

MIX_AND_SAMPLES = {"mix-budget", "mix-priority", "mix-select", "mix-route", "mix-route-merge", "mix", "tokens-megatron", "tokens-memmap",
                   "samples-pick", "samples"}  # the demo writes token files: a weights edit gathers them again


def _variant(demo_run, demo_run_yaml, name: str, old: str, new: str, env: dict | None = None):
    text = demo_run_yaml.read_text()
    assert old in text
    y = write_yaml(demo_run_yaml.parent / f"{name}.yaml", text.replace("name: demo\n", f"name: {name}\n").replace(old, new))
    r = curate("run", str(y), "--workers", "2", "--output", str(demo_run.parent), env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    run = demo_run.parent / name
    steps = atomic.read_json(run / "run.json")["steps"]
    return run, {k for k, v in steps.items() if v["status"] == "SUCCESS"}, r


def test_a_weights_only_variant_runs_only_the_mixture_and_keeps_its_own_run_directory(demo_run, demo_run_yaml, joined):
    before = mixture_shas(demo_run)
    run, ran, r = _variant(demo_run, demo_run_yaml, "demo-b", "weights: {web/q5: 0.25, web/q3-q4: 0.35, wiki: 0.3, code: 0.1}",
                           "weights: {web/q5: 0.2, web/q3-q4: 0.3, wiki: 0.4, code: 0.1}", env=joined)
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


def test_a_threshold_only_variant_runs_the_threshold_the_quality_step_and_what_follows(demo_run, demo_run_yaml, joined):
    """The plan says which steps the variant runs (the steps whose store directory, name and
    hash, has no _SUCCESS), and the run computes exactly those: run.json counts the shards
    this run computed per step."""
    from pipeline import config
    from pipeline.engine.step import step_status
    from pipeline.run import graph

    want = {"quality-web-threshold", "quality-web"} | MIX_AND_SAMPLES
    text = demo_run_yaml.read_text()
    old, new = "buckets: 5}", "buckets: 5, keep_fraction: 0.9}"
    assert old in text
    y = write_yaml(demo_run_yaml.parent / "demo-q-plan.yaml", text.replace("name: demo\n", "name: demo-q\n").replace(old, new))
    store = demo_run.parent / "_store"
    ctx = graph.build(config.load(y), demo_run.parent / "demo-q", store)
    planned = {s.name for s in ctx.steps if step_status(s, store, None)[0] == "run"}
    assert planned == want, sorted(planned)
    # the same answer from the hashes: exactly those steps differ from the demo run's (steps/<name>-<hash8>)
    demo = {k: v["dir"] for k, v in atomic.read_json(demo_run / "run.json")["steps"].items()}
    assert {s.name for s in ctx.steps if demo[s.name] != f"steps/{s.dir(store).name}"} == want
    run, ran, _ = _variant(demo_run, demo_run_yaml, "demo-q", old, new, env=joined)
    assert ran == want, sorted(ran)


# ---------------------------------------------------------------- two runs at once (leases)


def _start(yaml, out, log, env=None):
    """`curate run` in its own session (so a SIGKILL takes its Ray with it), output to a file."""
    e = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    e.update(env or {})
    f = open(log, "w")
    return subprocess.Popen([sys.executable, "-m", "pipeline", "run", str(yaml), "--workers", "2", "--output", str(out)],
                            stdout=f, stderr=subprocess.STDOUT, env=e, start_new_session=True)


def _copy(demo_run_yaml, tmp_path, name: str, old: str = "", new: str = ""):
    text = demo_run_yaml.read_text().replace("name: demo\n", f"name: {name}\n").replace(old, new)
    return write_yaml(tmp_path / f"{name}.yaml", text)


def _leases(out) -> list:
    """The lease files now (a lease directory can vanish while we list it: a release)."""
    try:
        return list((out / "_store" / "_leases").glob("*/gen-*.json"))
    except FileNotFoundError:
        return []


def _writers(store_step) -> dict[int, str]:
    """The run id that computed each shard (a marker's writer is `<run id>g<lease generation>`)."""
    return {k: v.get("writer", "").rsplit("g", 1)[0] for k, v in read_markers(store_step).items()}


@pytest.fixture(scope="module")
def together(demo_run_yaml, tmp_path_factory, joined):
    """Two variants started at the same moment into one fresh output (and a third start of
    the first while it runs). Both drivers submit to the session's Ray, as two users' runs
    submit to one cluster; each has its own leases and run directory."""
    tmp_path = tmp_path_factory.mktemp("together")
    out = tmp_path / "out"
    y1 = _copy(demo_run_yaml, tmp_path, "c1")  # the demo under another name: the same mixture
    y2 = _copy(demo_run_yaml, tmp_path, "c2", "weights: {web/q5: 0.25, web/q3-q4: 0.35, wiki: 0.3, code: 0.1}", "weights: {web/q5: 0.2, web/q3-q4: 0.3, wiki: 0.4, code: 0.1}")
    p1, p2 = _start(y1, out, tmp_path / "c1.log", joined), _start(y2, out, tmp_path / "c2.log", joined)
    while not (out / "c1" / "_lease").exists() and p1.poll() is None:
        time.sleep(0.1)
    again = curate("run", str(y1), "--workers", "1", "--output", str(out))
    assert p1.wait(timeout=600) == 0, (tmp_path / "c1.log").read_text()[-3000:]
    assert p2.wait(timeout=600) == 0, (tmp_path / "c2.log").read_text()[-3000:]
    return out, y1, again


def test_two_runs_started_together_compute_every_shard_once_and_match_a_single_run(demo_run, together):
    out, _, again = together
    # a second run into a run directory in use is refused at once, naming the run that holds it
    assert again.returncode == 2 and "is in use: run c1" in again.stderr, again.stderr[-2000:]
    assert "Traceback" not in again.stderr
    a, b = (atomic.read_json(out / n / "run.json") for n in ("c1", "c2"))
    ids = {a["run_id"], b["run_id"]}
    shared = [k for k in a["steps"] if a["steps"][k]["dir"] == b["steps"].get(k, {}).get("dir")]
    assert len(shared) >= 20 and not set(shared) & MIX_AND_SAMPLES
    leased = {p.name for p in (out / "_store" / "_leases").iterdir()}
    for k in shared:  # every shard of a shared step computed by exactly one of the two runs
        shards = a["steps"][k]["shards"]
        name = Path(a["steps"][k]["dir"]).name
        if not shards:  # a step with nothing to do (a merge of few files): committed without a lease
            if k.endswith("-merge") or k.startswith("merge-"):
                assert name not in leased, k
            continue
        assert name in leased, k  # a step with tasks: claimed through its lease
        assert a["steps"][k]["computed"] + b["steps"][k]["computed"] == shards, (k, a["steps"][k], b["steps"][k])
        who = set(_writers(out / "c1" / a["steps"][k]["dir"]).values())
        assert len(who) == 1 and who <= ids, (k, who)
        mine = a if a["run_id"] in who else b
        assert mine["steps"][k]["status"] == "SUCCESS" and mine["steps"][k]["computed"] == shards
    for run in (a, b):  # each run's own mix steps are its own: computed by it, or linked by content (engine/reuse.py)
        for k in MIX_AND_SAMPLES:
            if not run["steps"][k]["shards"]:  # mix-route-merge below 33 document shards: nothing to write
                continue
            d = out / run["name"] / run["steps"][k]["dir"]
            linked = {i for i, m in read_markers(d).items() if m.get("reused_from")}
            assert len(linked) == run["steps"][k]["reused"], (k, run["steps"][k])
            assert {w for i, w in _writers(d).items() if i not in linked} <= {run["run_id"]}
            assert run["steps"][k]["computed"] + run["steps"][k]["reused"] == run["steps"][k]["shards"]
    assert mixture_shas(out / "c1") == mixture_shas(demo_run)  # the bytes of a single run
    assert abs(atomic.read_json(out / "c2" / "manifest.json")["sources"]["wiki"]["realized_weight"] - 0.4) < 0.01


def test_a_run_killed_halfway_leaves_its_steps_to_the_other_after_the_lease_expires(demo_run, demo_run_yaml, tmp_path, joined):
    out = tmp_path / "out"
    env = {"CURATE_LEASE_SECONDS": "10"}
    y1, y2 = _copy(demo_run_yaml, tmp_path, "k1"), _copy(demo_run_yaml, tmp_path, "k2")
    p1 = _start(y1, out, tmp_path / "k1.log", env)
    p2 = None
    victim, deadline = None, time.time() + 300
    while victim is None and p1.poll() is None and time.time() < deadline:
        for lease in _leases(out):
            step = out / "_store" / "steps" / lease.parent.name
            try:
                held_by = atomic.read_json(lease)["name"]
                total = len(atomic.read_json(step / "step.json")["shards"])
            except (FileNotFoundError, ValueError):
                continue
            done = len(list((step / "_markers").glob("*.json"))) if (step / "_markers").is_dir() else 0
            if p2 is None:
                p2 = _start(y2, out, tmp_path / "k2.log", {**env, **joined})  # k2 now finds k1 at work (k1 has its own Ray: the kill takes it)
            # halfway through a step with more shards left than k1 can have in flight (4): a shard k1's
            # dying workers finish still counts as k1's; the rest must be k2's
            if held_by == "k1" and done >= 1 and total - done >= 5 and not (step / "_SUCCESS").exists():
                victim = step
                break
        time.sleep(0.02)
    assert victim is not None, (tmp_path / "k1.log").read_text()[-3000:]
    os.killpg(p1.pid, signal.SIGKILL)  # the driver and its Ray: no cleanup, the lease stays behind
    p1.wait()
    assert p2.wait(timeout=600) == 0, (tmp_path / "k2.log").read_text()[-3000:]
    log = (tmp_path / "k2.log").read_text()
    assert f"[{victim.name.rsplit('-', 1)[0]}] taking over" in log, log[-3000:]
    k1 = atomic.read_json(out / "k1" / "run.json")
    k2 = atomic.read_json(out / "k2" / "run.json")
    writers = _writers(victim)
    assert len(writers) == len(atomic.read_json(victim / "step.json")["shards"])
    assert set(writers.values()) == {k1["run_id"], k2["run_id"]}  # k1's finished shards kept, the rest k2's
    assert k2["steps"][victim.name.rsplit("-", 1)[0]]["computed"] >= 1
    assert mixture_shas(out / "k2") == mixture_shas(demo_run)


def test_gc_frees_exactly_the_steps_no_other_run_uses_and_never_a_leased_one(together):
    import shutil

    from pipeline.engine.lease import Leases

    out, y1, _ = together
    a, b = (atomic.read_json(out / n / "run.json") for n in ("c1", "c2"))
    only_b = sorted({v["dir"].split("/")[-1] for v in b["steps"].values()} - {v["dir"].split("/")[-1] for v in a["steps"].values()})
    assert len(only_b) == len(MIX_AND_SAMPLES)  # c2 differs in weights only
    store = out / "_store"
    before = sorted(p.name for p in (store / "steps").iterdir())
    assert curate("gc", str(out)).stdout.splitlines()[-1].startswith("0 steps, 0.0 MB freed")  # both runs use every step
    # a relative output folder names the same two run directories as the store's registry (absolute paths)
    rel = curate("gc", out.name, "--dry-run", cwd=out.parent).stdout.splitlines()[-1]
    assert rel.endswith("kept for 2 run directories"), rel
    shutil.rmtree(out / "c2")
    dry = curate("gc", str(out), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    listed = sorted(x.split()[2] for x in dry.stdout.splitlines() if x.startswith("would delete"))
    assert listed == only_b
    assert sorted(p.name for p in (store / "steps").iterdir()) == before  # nothing deleted
    # a step under a live lease is kept, whoever holds it
    held = Leases(name="someone")
    assert held.acquire(store / "_leases" / only_b[0]) is None
    sizes = {n: sum(f.stat().st_size for f in (store / "steps" / n).rglob("*") if f.is_file()) for n in only_b}
    r = curate("gc", str(out))
    lines = r.stdout.splitlines()
    assert sorted(x.split()[1] for x in lines if x.startswith("deleted")) == only_b[1:]
    assert any(x.startswith("kept") and only_b[0] in x and "live run" in x for x in lines)
    assert f"{sum(sizes[n] for n in only_b[1:]) / 1e6:,.1f} MB freed" in lines[-1]
    assert sorted(p.name for p in (store / "steps").iterdir()) == sorted(set(before) - set(only_b[1:]))
    held.release_all()
    assert [x.split()[1] for x in curate("gc", str(out)).stdout.splitlines() if x.startswith("deleted")] == only_b[:1]
    # what c1 uses is intact: its plan is all cached
    plan = curate("plan", str(y1), "--output", str(out)).stdout.splitlines()
    head = next(i for i, x in enumerate(plan) if x.split()[:3] == ["step", "hash", "action"])
    assert {x.split()[2] for x in plan[head + 1: plan.index("", head)]} == {"skip"}


def test_diff_of_a_one_threshold_variant_names_exactly_the_documents_the_threshold_moves(demo_run, demo_run_yaml, tmp_path, joined):
    import pyarrow.parquet as pq

    from filters import base

    run, _, _ = _variant(demo_run, demo_run_yaml, "demo-t", "not_huge: {type: length, max_chars: 20000}",
                         "not_huge: {type: length, max_chars: 12000}", env=joined)
    out = tmp_path / "fate.parquet"
    r = curate("diff", str(demo_run), str(run), "--out", str(out), "--samples", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    text = r.stdout
    assert "  filters.not_huge.max_chars: 20000 -> 12000" in text and 'name: "demo" -> "demo-t"' in text
    # the filter's own decision at both thresholds, computed here on the code documents
    old, new = (base.build(base.parse_params({"type": "length", "max_chars": m})) for m in (20000, 12000))
    ingest = demo_run / atomic.read_json(demo_run / "run.json")["steps"]["ingest-code"]["dir"]
    moved = set()
    for part in sorted(ingest.glob("part-*.parquet")):
        for batch in pq.ParquetFile(part).iter_batches(columns=["id", "text"]):
            a, b = old.apply(batch).keep, new.apply(batch).keep
            moved |= {i for i, x, y in zip(batch.column("id").to_pylist(), a, b, strict=True) if x and not y}
    assert len(moved) >= 5
    rows = pq.read_table(out).to_pylist()
    by_filter = {x["id"] for x in rows if x["stage"] == "filter:not_huge"}
    assert by_filter == moved  # exactly the documents the threshold moves, none missed, none extra
    assert all(x["source"] == "code" and x["b_stage"] == "filter:not_huge" and x["a_stage"] != "filter:not_huge"
               and x["kind"] in ("kept -> removed", "removed by another stage") for x in rows if x["id"] in moved)
    n_kept = sum(x["kind"] == "kept -> removed" for x in rows if x["id"] in moved)
    assert f"code filter:not_huge: {sum(1 for x in rows if x['kind'] == 'kept -> removed' and x['stage'] == 'filter:not_huge'):,}" in text \
        or n_kept == 0
    # the realised weights side by side, as the manifests give them
    ma, mb = (atomic.read_json(d / "manifest.json")["sources"] for d in (demo_run, run))
    line = next(x for x in text.splitlines() if x.startswith("  code "))
    assert f"{ma['code']['realized_weight']:.3f}" in line and f"{mb['code']['realized_weight']:.3f}" in line
    ca, cb = (atomic.read_json(d / "manifest.json")["cells"] for d in (demo_run, run))  # and per cell (the demo's quintiles)
    line = next(x for x in text.splitlines() if x.startswith("  web/q5 "))
    assert line.split()[1:5] == [f"{ca['web/q5']['documents']:,}", f"{cb['web/q5']['documents']:,}",
                                 f"{ca['web/q5']['tokens']:,}", f"{cb['web/q5']['tokens']:,}"], line
    led_a, led_b = (atomic.read_json(d / "ledger.json")["sources"]["code"]["removed"] for d in (demo_run, run))
    delta = led_b["filter:not_huge"]["too_many_chars"] - led_a["filter:not_huge"]["too_many_chars"]
    assert delta == len(moved)
    assert any(x.split()[:3] == ["code", "filter:not_huge", "too_many_chars"] and x.split()[-1] == f"{delta:+,}" for x in text.splitlines())
    assert "sample: kept -> removed" in text or "sample: removed by another stage" in text


def test_the_shipped_variant_differs_from_the_demo_only_in_name_and_weights():
    """mixtures/demo-b.yaml is the README's weights-only variant: it must follow demo.yaml."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[3] / "mixtures"
    a, b = ((root / f).read_text().splitlines() for f in ("demo.yaml", "demo-b.yaml"))
    assert len(a) == len(b)
    differ = [(x, y) for x, y in zip(a, b, strict=True) if x != y]
    assert [x.split(":")[0].strip() for x, _ in differ] == ["name", "output", "weights"], differ
