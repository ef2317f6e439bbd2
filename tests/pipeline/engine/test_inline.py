"""Small steps run in curate's own process while no Ray is up (issue 35, small runs without
fixed costs), and a small run's larger steps in local worker processes (issue 52,
engine/pool.py): the same task functions, so the same bytes as a run on Ray; no Ray
started; with the pool off, a larger step starts Ray and the rest of the run goes there;
faults are retried and reported as on Ray, and a worker that dies costs only a retry.

The rest of the suite runs every step on Ray (conftest sets CURATE_INLINE_DOCS=0); these
tests set a threshold of their own: ALL, above every step of the small mixture (its Spanish
summaries are 6,239 documents, above the default 5,000)."""

from __future__ import annotations

import os
import re

from pipeline.io import atomic
from tests.conftest import curate, mixture_shas, small_mixture, write_yaml
from tests.pipeline.engine.test_faults import RULES, _mixture, _rare_word


ALL = "20000"


def _where(run_dir) -> dict[str, str]:
    steps = atomic.read_json(run_dir / "run.json")["steps"]
    return {k: v.get("where", "ray") for k, v in steps.items() if v["computed"]}


def test_a_larger_step_starts_ray_and_the_rest_of_the_run_goes_there_with_the_same_bytes(demo_corpus, small_run,
                                                                                          tmp_path):
    # input-less steps count the input files at ~1 KB a document; the dedup steps read every
    # source's documents: a threshold between the two runs the first inline, then Ray
    size = sum(f.stat().st_size for f in [demo_corpus / "wiki" / "summaries_es.parquet",
                                           *sorted((demo_corpus / "web").glob("crawl-0000[01].jsonl.zst"))])
    y = write_yaml(tmp_path / "r.yaml", small_mixture(str(demo_corpus), "out"))
    r = curate("run", str(y), "--workers", "2", env={"CURATE_INLINE_DOCS": str(size // 1000 + 1), "CURATE_LOCAL_BYTES": "0"})
    assert r.returncode == 0, r.stderr[-3000:]
    run_dir = tmp_path / "out" / "remote"
    where = _where(run_dir)
    assert set(where.values()) == {"inline", "ray"}, where
    assert all(where[k] == "ray" for k in where if k.startswith(("dedup-", "mix-")))
    assert mixture_shas(run_dir) == mixture_shas(small_run)


def test_a_reruns_pool_starts_at_its_first_pooled_task_if_any_not_while_planning(demo_corpus, tmp_path):
    """A first run's local pool comes up while the driver plans; a rerun's (here a new input
    file) at its first pooled task, if any: an edit's few shards mostly run inline."""
    y = write_yaml(tmp_path / "p.yaml", small_mixture(str(demo_corpus), "out"))
    env = {"CURATE_INLINE_DOCS": "1"}  # every step in the pool (the suite's 0 turns the pool off)
    assert curate("run", str(y), "--workers", "2", env=env).returncode == 0
    rec = atomic.read_json(tmp_path / "out" / "remote" / "run.json")
    assert (rec["executor"], rec["local_pool_started"]) == ("local processes", "while planning")
    y.write_text(y.read_text().replace("crawl-0000[01]", "crawl-0000[012]"))
    r = curate("run", str(y), "--workers", "2", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    rec = atomic.read_json(tmp_path / "out" / "remote" / "run.json")
    assert rec["steps"]["ingest-web"]["computed"] == 1
    # its shards took seconds in the first run: all inline, so the pool never came up (it used to start while
    # planning: ~1.5 CPU-s of imports for nothing)
    assert set(_where(tmp_path / "out" / "remote").values()) == {"inline"} and rec["local_pool_started"] == "never"
    # a third file, and no step run inline for being small in the earlier run: the pool comes up for its tasks
    y.write_text(y.read_text().replace("crawl-0000[012]", "crawl-0000[0123]"))
    r = curate("run", str(y), "--workers", "2", env={**env, "CURATE_INLINE_SECONDS": "0"})
    assert r.returncode == 0, r.stderr[-3000:]
    rec = atomic.read_json(tmp_path / "out" / "remote" / "run.json")
    assert "local" in set(_where(tmp_path / "out" / "remote").values()) and rec["local_pool_started"] == "at its first task"


def test_a_run_in_process_gives_the_bytes_of_ray_and_retries_and_reports_faults_as_ray_does(demo_corpus, small_run,
                                                                                          tmp_path):
    (tmp_path / "faultrules.py").write_text(RULES)
    (tmp_path / "word.txt").write_text(_rare_word(demo_corpus))
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           "CURATE_INLINE_DOCS": ALL}
    # a whole run in process (no Ray at all), its filter failing with a reset connection at its
    # first call: tried again inside the shard; the mixture and manifest of the plain run on Ray
    flaky = _mixture(demo_corpus, tmp_path, "flaky")
    r = curate("run", str(flaky), "--workers", "2", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    run_dir = tmp_path / "out" / "remote"
    where = _where(run_dir)
    assert where and set(where.values()) == {"inline"}, where
    assert "Ray" not in r.stderr and "raylet" not in r.stderr
    assert mixture_shas(run_dir) == mixture_shas(small_run)
    assert atomic.read_json(run_dir / "manifest.json")["files"] == atomic.read_json(small_run / "manifest.json")["files"]
    assert atomic.read_json(run_dir / "ledger.json")["conservation"] is True
    # a bug one document triggers: the run finishes every other shard, then fails once naming it
    d = tmp_path / "bug"
    d.mkdir()
    y = _mixture(demo_corpus, d, "keep")
    first = curate("run", str(y), "--workers", "2", env=env)
    assert first.returncode == 1 and "Traceback" not in first.stderr, first.stderr[-3000:]
    failed = re.findall(r"step filter-web, shard (\d+) \((.*?)\) failed: ValueError: boom", first.stderr)
    assert len(failed) == 1 and "1 shard failed, every other shard finished" in first.stderr, first.stderr[-3000:]
    assert "RunError" not in first.stderr  # the task's own error, as a Ray task's is reported
    (tmp_path / "fixed").write_text("")
    again = curate("run", str(y), "--workers", "2", env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert atomic.read_json(d / "out" / "remote" / "run.json")["steps"]["filter-web"]["computed"] == 1
    assert mixture_shas(d / "out" / "remote") == mixture_shas(small_run)


def test_a_small_run_runs_in_local_processes_without_ray_with_its_bytes_and_survives_a_dead_worker(demo_corpus, small_run,
                                                                                                 tmp_path):
    (tmp_path / "faultrules.py").write_text(RULES)
    (tmp_path / "word.txt").write_text(_rare_word(demo_corpus))
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           "CURATE_INLINE_DOCS": "1"}  # (the suite's 0 turns the pool off too) no step in the driver but the tiny
    # the filter's first call kills its worker process (the pool's shards in flight are given to a
    # fresh pool), then each worker's first call is a reset connection (tried again in the worker)
    y = _mixture(demo_corpus, tmp_path, "dies_once")
    r = curate("run", str(y), "--workers", "2", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "died").exists()
    run_dir = tmp_path / "out" / "remote"
    rec = atomic.read_json(run_dir / "run.json")
    where = _where(run_dir)
    assert rec["executor"] == "local processes" and where["filter-web"] == "local", (rec["executor"], where)
    assert set(where.values()) <= {"local", "inline"} and "Ray" not in r.stderr and "raylet" not in r.stderr
    assert mixture_shas(run_dir) == mixture_shas(small_run)
    assert atomic.read_json(run_dir / "ledger.json")["conservation"] is True
    # a bug one document triggers: every other shard finishes, the run fails once naming it
    d = tmp_path / "bug"
    d.mkdir()
    first = curate("run", str(_mixture(demo_corpus, d, "keep")), "--workers", "2", env=env)
    assert first.returncode == 1 and "Traceback" not in first.stderr, first.stderr[-3000:]
    failed = re.findall(r"step filter-web, shard (\d+) \((.*?)\) failed: ValueError: boom", first.stderr)
    assert len(failed) == 1 and "1 shard failed, every other shard finished" in first.stderr, first.stderr[-3000:]
