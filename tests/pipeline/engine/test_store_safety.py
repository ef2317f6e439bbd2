"""The step store under concurrent runs, gc and faults (issue 34, items 3-5): reuse by the
full hash, fenced leases, gc excluded by runs, and steps left half deleted.

Leases and fencing run on a local disk and on a real S3 API (moto's server); the gc and
half-deleted tests are real runs of the small mixture on the session's Ray."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time

import pytest

from pipeline.engine.executor import Executor
from pipeline.engine import storelock
from pipeline.engine.lease import LeaseLost, Leases
from pipeline.engine.step import SUCCESS, Step, StoreError, committed, step_status
from pipeline.errors import RunError, UsageError
from pipeline.io import atomic, fs
from pipeline.views import gc
from tests.conftest import curate, mixture_shas, small_mixture, write_yaml


def noop_shard(spec: dict, out) -> dict:
    return {"rows": 0}


def _step(name: str = "stage", **config) -> Step:
    return Step(name, "test", config or {"x": 1}, [], noop_shard, shards=lambda step, stats: [{}])


# item 4: reuse trusts the full hash, not the folder's prefix


def test_a_folder_holding_another_steps_commit_is_an_error_never_reused(tmp_path):
    s = _step()
    d = s.dir(tmp_path)
    assert d.name == f"stage-{s.hash[:16]}"  # 64 bits of the hash name the folder
    other = _step(x=2)
    atomic.write_json(d / SUCCESS, {"hash": other.hash, "markers": "_markers-x.json", "shards": 1})
    atomic.write_json(d / "_markers-x.json", {"0": {"rows": 5}})
    with pytest.raises(StoreError, match=r"holds another step .*move it away"):
        committed(s, tmp_path)
    with pytest.raises(StoreError):
        step_status(s, tmp_path, None)
    with pytest.raises(StoreError):  # before any task starts: no Ray needed to refuse it
        Executor(tmp_path).run([s])
    atomic.write_json(d / SUCCESS, {"hash": s.hash, "markers": "_markers-x.json", "shards": 1})
    assert committed(s, tmp_path) == {0: {"rows": 5}}


# item 5: a holder paused past the ttl, resumed after a takeover, stops and deletes nothing


def _paused_holder_resumed(store) -> None:
    s = _step("fenced")
    d = s.dir(store)
    a = Leases(name="a", ttl=1.0)
    ex_a = Executor(store, leases=a)
    lease_dir = ex_a.lease_dir(s)
    assert a.acquire(lease_dir) is None
    a._stop.set()  # its renewals stop: the process is paused (Ctrl-Z, a long GC pause)
    atomic.set_fence(a.fence(lease_dir))
    fs.makedirs(d)
    tmp_a = atomic.tmp_path(d / "part-00000.parquet")
    with fs.path(tmp_a).open("wb") as f:
        f.write(b"a's half-written shard")
    time.sleep(1.3)  # past its ttl
    b = Leases(name="b", ttl=30)
    assert b.acquire(lease_dir) is None  # b takes the step over: generation 2
    fence_b = b.fence(lease_dir)
    atomic.set_fence(fence_b)
    tmp_b = atomic.tmp_path(d / "part-00000.parquet")
    with fs.path(tmp_b).open("wb") as f:
        f.write(b"b's shard in progress")
    atomic.set_fence("x")
    # a resumes where it was: finishing the step
    ex_a.stats[s.name] = {0: {"rows": 0}}
    with pytest.raises(RunError, match=r"lost the lease on fenced-\w+ to run b .*without deleting or committing"):
        ex_a._finish(s, {s.name: 0}, {})
    fs.refresh(d)
    assert tmp_b.exists() and not (d / SUCCESS).exists()  # nothing of b's deleted, nothing committed
    # b finishes: its commit names its own fence, its cleanup removes its files only
    ex_b = Executor(store, leases=b)
    ex_b.stats[s.name] = {0: {"rows": 0}}
    ex_b._finish(s, {s.name: 0}, {})
    fs.refresh(d)
    rec = atomic.read_json(d / SUCCESS)
    assert rec["fence"] == fence_b and fence_b.endswith("g2")
    assert rec["hash"] == s.hash and committed(s, store) == {0: {"rows": 0}}
    assert not tmp_b.exists() and tmp_a.exists()  # a's leftover is a's: only a gc of the step removes it
    b.release_all()
    a.release_all()


def test_a_paused_lease_holder_resumed_after_takeover_stops_and_deletes_nothing(tmp_path):
    _paused_holder_resumed(fs.path(tmp_path / "store"))


def test_fencing_holds_on_an_object_store(s3_server):
    _paused_holder_resumed(fs.path("s3://curate-test/fenced-store"))


def test_cleanup_removes_only_its_own_fence_and_never_a_directory(tmp_path):
    d = tmp_path / "steps" / "x.tmp-1"  # a source may be named so: a directory, not a temporary file
    (d / "x.tmp-deadbeef").mkdir(parents=True)
    mine, theirs, old = d / "p.parquet.tmp-r1g2-0123abcd", d / "p.parquet.tmp-r2g3-0123abcd", d / "p.parquet.tmp-0123abcd"
    for p in (mine, theirs, old):
        p.write_bytes(b"x")
    assert atomic.clean_tmp(tmp_path, "r1g2") == 1 and not mine.exists() and theirs.exists() and old.exists()
    assert atomic.clean_tmp(tmp_path) == 2 and d.is_dir() and (d / "x.tmp-deadbeef").is_dir()


# item 3: gc and runs exclude each other; a step gc left half deleted is not done


@pytest.fixture
def small_yaml(demo_corpus, tmp_path):
    return write_yaml(tmp_path / "r.yaml", small_mixture(str(demo_corpus), str(tmp_path / "out")))


def _live_run_entry(store) -> bool:
    return any((store / "_lock" / "runs").glob("*/gen-*.json")) if (store / "_lock" / "runs").exists() else False


def test_gc_and_a_run_exclude_each_other_and_the_run_gives_the_same_mixture(small_yaml, small_run, joined, tmp_path):
    from tests.conftest import ROOT

    out = tmp_path / "out"
    store = out / "_store"
    (store / "steps").mkdir(parents=True)
    gc_holder = Leases(name="gc")
    assert gc_holder.acquire(store / "_lock" / "gc") is None  # a gc is deleting
    log = tmp_path / "run.log"
    env = {**__import__("os").environ, **joined}
    p = subprocess.Popen([sys.executable, "-m", "pipeline", "run", str(small_yaml), "--workers", "2"], cwd=ROOT,
                         stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
    deadline = time.time() + 120
    while "waiting: curate gc" not in log.read_text() and p.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert "waiting: curate gc" in log.read_text(), log.read_text()[-2000:]
    time.sleep(1.5)
    assert p.poll() is None and not (out / "remote" / "run.json").exists()  # it waits before planning
    gc_holder.release_all()
    while not _live_run_entry(store) and p.poll() is None:
        time.sleep(0.02)
    assert p.poll() is None
    with pytest.raises(UsageError, match=r"in use by run remote .*Run gc again when that finishes"):
        gc.collect(out)  # the run holds the store: gc deletes nothing
    assert p.wait(timeout=300) == 0, log.read_text()[-3000:]
    assert mixture_shas(out / "remote") == mixture_shas(small_run)
    assert not _live_run_entry(store)  # the run freed the store
    r = curate("gc", str(out))
    assert r.returncode == 0 and r.stdout.splitlines()[-1].startswith("0 steps"), r.stderr


def test_steps_left_half_deleted_run_again_never_read_as_empty(small_yaml, small_run, joined, tmp_path):
    out = tmp_path / "out"
    assert curate("run", str(small_yaml), "--workers", "2", env=joined).returncode == 0
    run = atomic.read_json(out / "remote" / "run.json")
    ledger = atomic.read_json(out / "remote" / "ledger.json")
    steps = {k: out / "remote" / v["dir"] for k, v in run["steps"].items()}
    # a commit that outlived its marker index and markers (what gc used to leave when stopped)
    ing = steps["ingest-web"].resolve()
    for p in ing.glob("_markers*.json"):
        p.unlink()
    shutil.rmtree(ing / "_markers")
    assert (ing / SUCCESS).exists()
    # gc's order stopped after its first two deletions: no commit, no index, shard markers and data left
    flt = steps["filter-web"].resolve()
    (flt / SUCCESS).unlink()
    for p in flt.glob("_markers*.json"):
        p.unlink()
    again = curate("run", str(small_yaml), "--workers", "2", "--verbose", env=joined)  # the plan step by step
    assert again.returncode == 0, again.stderr[-3000:]
    plan = again.stderr + again.stdout
    assert "ingest-web" in plan and "resume (0 shards done)" in plan, plan
    rerun = atomic.read_json(out / "remote" / "run.json")["steps"]
    assert rerun["ingest-web"]["computed"] == rerun["ingest-web"]["shards"] > 0  # every shard again
    assert rerun["filter-web"]["computed"] == 0  # every shard marker left had its data: resumed, not redone
    assert atomic.read_json(out / "remote" / "ledger.json")["sources"] == ledger["sources"]
    assert mixture_shas(out / "remote") == mixture_shas(small_run)


def test_a_run_paused_past_its_lease_and_resumed_after_a_takeover_stops_and_deletes_nothing(
        demo_corpus, small_run, joined, tmp_path):
    """The real thing: a run's driver stopped (SIGSTOP, as Ctrl-Z does) while it holds a step's
    lease, another run takes the step over and finishes, then the first is continued."""
    import os
    import signal

    from tests.conftest import ROOT

    out = tmp_path / "out"
    ya, yb = (write_yaml(tmp_path / f"{n}.yaml", small_mixture(str(demo_corpus), str(out)).replace("name: remote", f"name: {n}"))
              for n in ("pa", "pb"))
    env = {**os.environ, **joined, "CURATE_LEASE_SECONDS": "3"}

    def start(y, log):
        return subprocess.Popen([sys.executable, "-m", "pipeline", "run", str(y), "--workers", "2"], cwd=ROOT,
                                stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)

    a = start(ya, tmp_path / "pa.log")
    held, deadline = None, time.time() + 120
    while held is None and a.poll() is None and time.time() < deadline:
        for f in (out / "_store" / "_leases").glob("*/gen-*.json") if (out / "_store" / "_leases").exists() else []:
            try:
                rec = atomic.read_json(f)
            except (FileNotFoundError, ValueError):
                continue
            step = out / "_store" / "steps" / f.parent.name
            try:  # a step with shards still to run: its lease is held for a while (an empty step commits at once)
                total = len(atomic.read_json(step / "step.json")["shards"])
            except (FileNotFoundError, ValueError):
                continue
            done = len(list((step / "_markers").glob("*.json"))) if (step / "_markers").is_dir() else 0
            if rec.get("name") == "pa" and not rec.get("released") and done < total and not (step / SUCCESS).exists():
                held = step
                break
        time.sleep(0.01)
    assert held is not None, (tmp_path / "pa.log").read_text()[-2000:]
    os.kill(a.pid, signal.SIGSTOP)
    try:
        b = start(yb, tmp_path / "pb.log")
        assert b.wait(timeout=300) == 0, (tmp_path / "pb.log").read_text()[-3000:]
    finally:
        os.kill(a.pid, signal.SIGCONT)
    assert a.wait(timeout=120) == 1
    log_a, log_b = (tmp_path / "pa.log").read_text(), (tmp_path / "pb.log").read_text()
    lost = re.search(r"lost the lease on (\S+) to run pb .*without deleting or committing anything", log_a)
    assert lost is not None and "Traceback" not in log_a, log_a[-2000:]
    taken = out / "_store" / "steps" / lost.group(1)
    assert f"[{taken.name.rsplit('-', 1)[0]}] taking over from run pa" in log_b, log_b[-2000:]
    assert atomic.read_json(taken / SUCCESS)["fence"].startswith(atomic.read_json(out / "pb" / "run.json")["run_id"])
    assert mixture_shas(out / "pb") == mixture_shas(small_run)  # b's outputs intact after a resumed
    assert curate("run", str(yb), "--workers", "2", env=joined).returncode == 0  # and still all reusable


def test_the_store_lock_works_on_an_object_store(s3_server):
    """gc and runs exclude each other through the leases' conditional writes on S3 too."""
    import threading

    from pipeline.engine import storelock

    store = fs.path("s3://curate-test/locked-store")
    run, sweeper = Leases(name="r1"), Leases(name="gc")
    storelock.hold_shared(run, store)
    busy = storelock.hold_exclusive(sweeper, store)
    assert [r["name"] for r in busy] == ["r1"]  # a run holds it: gc is refused
    storelock.release_shared(run, store)
    assert storelock.hold_exclusive(sweeper, store) == []  # now gc holds it
    said, done = [], threading.Event()
    later = Leases(name="r2")
    t = threading.Thread(target=lambda: (storelock.hold_shared(later, store, said.append, poll=0.1), done.set()))
    t.start()
    time.sleep(1.0)
    assert not done.is_set() and said and said[0].startswith("waiting: curate gc")  # a run waits for gc
    sweeper.release_all()
    t.join(timeout=30)
    assert done.is_set()
    gc2 = Leases(name="gc2")
    assert [r["name"] for r in storelock.hold_exclusive(gc2, store)] == ["r2"]
    storelock.release_shared(later, store)
    for leases in (later, run, gc2):
        leases.release_all()


def test_a_gc_paused_past_its_lease_stops_before_deleting_what_a_run_reused(small_yaml, small_run, joined, tmp_path):
    """Issue 51, item 8: gc plans, then is paused past its lease (its renewals stop, as under
    SIGSTOP); a run sees the lease expired and reuses every step gc listed; gc resumes and
    stops before its first deletion. The run's bytes are those of a run without gc; every
    step is still there. And a renewal never recreates an entry a gc removed: the holder
    learns it lost it."""
    out = tmp_path / "out"
    assert curate("run", str(small_yaml), "--workers", "2", env=joined).returncode == 0
    store = out / "_store"
    (out / "remote").rename(tmp_path / "hidden")  # its steps are nobody's now: gc lists every one
    gc_leases = Leases(name="gc", ttl=2)
    assert storelock.hold_exclusive(gc_leases, store) == []
    planned = gc.plan(out)["delete"]
    assert planned

    def paused_then_guarded():  # called after gc planned, before its first deletion
        gc_leases._stop.set()  # paused: no renewal from here on
        gc_leases._thread.join(timeout=5)
        time.sleep(2.5)
        r = curate("run", str(small_yaml), "--workers", "2", env=joined)  # sees gc's lease expired, reuses the steps
        assert r.returncode == 0 and "waiting: curate gc" not in r.stdout + r.stderr, r.stderr[-2000:]
        gc._still_ours(gc_leases, store)

    with pytest.raises(RunError, match=r"gc: stopped: it went 2s .* without renewing"):
        gc._collect(out, None, False, guard=paused_then_guarded)
    assert all(s.exists() and (s / "_SUCCESS").exists() for s, _ in planned)
    assert mixture_shas(out / "remote") == mixture_shas(small_run)
    gc_leases.release_all()

    held = Leases(name="r", ttl=30)
    d = store / "_lock" / "runs" / "someone"
    assert held.acquire(d) is None
    fs.rmtree(d)  # what a gc does to an entry it judged dead
    held.renew()
    assert str(d) in held.lost and not d.exists()
    with pytest.raises(LeaseLost):
        held.check(d)
    held.release_all()
