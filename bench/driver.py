"""The driver's cost per shard when it plans and resumes one step of 10^4 and 10^5 shards.

A synthetic step (specs the size of an ingest shard's, markers the size of a filter shard's)
is activated by the real `Executor` with every shard's marker already on disk (the resume
of a run killed at the end of the step), then committed: the driver lists the specs, writes
step.json, reads the markers, writes the marker index and `_SUCCESS`. No task runs, so no
Ray. Prints wall time and peak Python memory per shard at both sizes and their ratio (flat
per shard: ratio near 1).

    python bench/driver.py [--sizes 10000 100000]

`--tasks N` measures the other half, the driver's CPU per task while tasks run: a step of N
shards whose task does nothing (it writes its marker) runs through the real `Executor` on
a local Ray of 2 CPUs, at N and 4N, beside the floor, Ray's own cost for the same number of
empty tasks submitted and awaited with the same bound on tasks in flight. The driver's CPU
is counted from the first task's submission (Ray's start is not per task).

    python -m bench.driver --tasks 2000
    CURATE_BENCH_PROGRESS=text python -m bench.driver --tasks 2000   # with the run's display (text, json, verbose)

`--chain K` measures a run, not a step: K chained steps of n shards each (every plan reads
its input's markers, as a filter's reads its ingest's), all resumed at their ends, through
the real `Executor.run`; the driver's peak and retained Python memory for K = 2 and K, per
shard and step (flat in steps: the driver holds the markers of the steps in flight only).

    python -m bench.driver --chain 8 --sizes 20000

`--plan` activates a real plan instead (fuzzy dedup's signatures step, from the run's own
graph, over synthetic ingest and filter markers): with `--yield-specs` as written (the
plan yields one shard's spec at a time from a generator of document shards), without it
as plans were (a list of every spec).

    python -m bench.driver --plan --sizes 10000 100000 [--yield-specs]

`--end` measures the end of a run: the ledger's and the report's reads of a committed layer
step of n shards (markers of a quality step: flows, removals, a score histogram and bucket
counts, three sources), as they are now (one pass, sums held: ledger.fold, report._summed)
and as they were (the step's markers in a list, then summed).

    python -m bench.driver --end --sizes 10000 100000

Not a test: timings never gate CI.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.engine.executor import Executor, _Queue  # noqa: E402
from pipeline.engine.step import MARKERS, Step, shard_name  # noqa: E402
from pipeline.engine.progress import Progress  # noqa: E402
from pipeline.engine.reuse import Keys  # noqa: E402


def synthetic_shard(spec: dict, out) -> dict:  # never called: every shard is done
    return {"rows": 0}


def empty_shard(spec: dict, out) -> dict:
    """A task that does nothing: what is left is the driver's and Ray's cost per task."""
    return {"rows": 1}


def _empty() -> int:
    return 1


def run_tasks(n: int, root: Path) -> dict:
    """Driver CPU for n empty shards through the Executor, and for n bare Ray tasks."""
    import ray

    from bench.driver import empty_shard as fn  # by its importable name, not __main__'s (workers import it)

    store = root / f"tasks-{n}"
    s = Step("filter-web", "filter", {"n": n}, [], fn, shards=_specs(n))
    mode = os.environ.get("CURATE_BENCH_PROGRESS", "quiet")  # text, json, verbose: the run's display, to a null file
    ex = Executor(store, workers=2, progress=Progress(mode=mode, stream=open(os.devnull, "w")) if mode != "quiet"
                  else Progress(quiet=True))
    ex._ensure_ray()
    c0, t0 = time.process_time(), time.perf_counter()
    ex.run([s])
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    assert len(ex.stats[s.name]) == n
    remote, cap = ray.remote(num_cpus=1)(_empty), ex._ray[2]
    c0, t0 = time.process_time(), time.perf_counter()
    pending, left = [], n
    while left or pending:
        while left and len(pending) < cap:
            pending.append(remote.remote())
            left -= 1
        done, pending = ray.wait(pending, num_returns=1)
        ray.get(done)
    floor, floor_wall = time.process_time() - c0, time.perf_counter() - t0
    shutil.rmtree(store)
    return {"tasks": n, "cpu_s": cpu, "wall_s": wall, "ray_cpu_s": floor, "ray_wall_s": floor_wall}


YIELD = [False]  # --yield-specs: the plan yields its specs instead of returning a list


def _specs(n: int):
    def shards(step, stats):
        specs = ({"file": f"s3://bucket/corpus/crawl-{i // 20:06d}.jsonl.zst", "start": (i % 20) * 50_000,
                  "stop": (i % 20 + 1) * 50_000, "describe": f"crawl-{i // 20:06d}.jsonl.zst rows {(i % 20) * 50_000}-"}
                 for i in range(n))
        return specs if YIELD[0] else list(specs)
    return shards


MARKER = {"rows": 50_000, "docs_in": 50_000, "docs_out": 41_233, "tokens": 61_234_567, "seconds": 12.345,
          "peak_rss_mb": 812.3, "node": "host-17/0123abcd", "writer": "0123456789abg1",
          "removed": {"gopher_repetition": 4_021, "c4_quality": 3_100, "language": 1_646}}


def measure(n: int, root: Path) -> dict:
    store = root / f"store-{n}"
    s = Step("filter-web", "filter", {"n": n}, [], synthetic_shard, shards=_specs(n))
    d = s.dir(store)
    (d / MARKERS).mkdir(parents=True)
    blob = orjson.dumps(MARKER)
    for i in range(n):
        (d / MARKERS / f"{shard_name(i)}.json").write_bytes(blob)
    ex = Executor(store, progress=Progress(quiet=True))
    tracemalloc.start()
    t0, c0 = time.perf_counter(), time.process_time()
    queue, remaining, started = _Queue(), {}, {}
    ex.keys = Keys(store, [s], ex.stats)  # what Executor.run sets up before it activates a step
    ex._activate(s, queue, remaining, started)  # lists specs, writes step.json, reads markers, commits (none to do)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert ex.status[s.name] == "SUCCESS" and len(ex.stats[s.name]) == n
    step_json = (d / "step.json").stat().st_size
    shutil.rmtree(store)
    return {"shards": n, "wall_s": wall, "cpu_s": cpu, "peak_mb": peak / 2**20, "step_json_mb": step_json / 2**20}


LAYER_MARKER = {"source": "web", "docs_in": 50_000, "docs_out": 41_233, "chars_in": 150_000_000, "chars_out": 120_000_000,
                "tokens_in": 31_000_000, "tokens_out": 27_000_000, "removed": {"quality_below:0.42": 8_767},
                "score_histogram": [500] * 100, "bucket_seen": [10_000] * 5, "bucket_docs": [8_000] * 5,
                "bucket_tokens": [5_400_000] * 5, "seconds": 12.3, "cpu_seconds": 11.9, "peak_rss_mb": 700.1,
                "node": "host-17/0123abcd", "writer": "0123456789abg1"}


def measure_end(n: int, root: Path) -> dict:
    """Peak Python memory of the ledger's and the report's reads of one committed step of n
    shards: now (one pass) and before (a list of the markers)."""
    import numpy as np

    from pipeline.engine.step import read_markers
    from pipeline.shards import ledger
    from pipeline.views import report

    store = root / f"end-{n}"
    s = Step("quality-web", "quality", {"n": n}, [], synthetic_shard, shards=_specs(n))
    d = s.dir(store)
    (d / MARKERS).mkdir(parents=True)
    for i in range(n):
        (d / MARKERS / f"{shard_name(i)}.json").write_bytes(orjson.dumps({**LAYER_MARKER, "source": ("web", "wiki", "code")[i % 3]}))
    ex = Executor(store, progress=Progress(quiet=True))
    ex.keys = Keys(store, [s], ex.stats)
    ex._activate(s, _Queue(), {}, {})  # commits: the marker index and _SUCCESS
    keys = ("score_histogram", "bucket_seen", "bucket_docs", "bucket_tokens")
    out = {"shards": n}
    for how in ("before", "now"):
        tracemalloc.start()
        c0 = time.process_time()
        ms = read_markers(d)
        if how == "now":
            f = ledger.fold(ms.values())
            got = [ledger.of_source(f, x)["docs_out"] for x in ("web", "wiki", "code")]
            sums = report._summed(ms.values(), keys)
            hist = sums["score_histogram"]
        else:
            held = list(ms.values())
            got = [sum(m["docs_out"] for m in held if m.get("source", x) == x) for x in ("web", "wiki", "code")]
            hist = np.sum([m["score_histogram"] for m in held], axis=0)
            _ = [np.sum([m[k] for m in held], axis=0) for k in keys[1:]]
        out[f"{how}_cpu_s"] = time.process_time() - c0
        out[f"{how}_peak_mb"] = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        out[f"{how}_check"] = (got, int(hist.sum()))
        del ms
    assert out["now_check"] == out["before_check"], out
    shutil.rmtree(store)
    return out


def _chained(step, stats):
    """A plan that reads its input's markers, then lists its shards."""
    n = step.config["n"]
    for i in step.inputs:
        assert sum(m["rows"] for m in stats[i.name].values()) == 50_000 * n
    return _specs(n)(step, stats)


def measure_chain(n: int, k: int, root: Path) -> dict:
    store = root / f"chain-{n}-{k}"
    blob = orjson.dumps(MARKER)
    steps: list[Step] = []
    for j in range(k):
        s = Step(f"step{j}", "filter", {"n": n, "j": j}, steps[-1:], synthetic_shard, shards=_chained)
        d = s.dir(store)
        (d / MARKERS).mkdir(parents=True)
        for i in range(n):
            (d / MARKERS / f"{shard_name(i)}.json").write_bytes(blob)
        steps.append(s)
    status, cpu, retained, peak = _run_measured(store, steps)
    assert set(status) == {"SUCCESS"}
    status, rerun_cpu, _, rerun_peak = _run_measured(store, steps)  # the run again: every step done (`curate run` twice)
    assert set(status) == {"SKIPPED"}
    shutil.rmtree(store)
    return {"steps": k, "shards": n, "cpu_s": cpu, "peak_mb": peak / 2**20, "retained_mb": retained / 2**20,
            "rerun_cpu_s": rerun_cpu, "rerun_peak_mb": rerun_peak / 2**20}


def measure_plan(n: int, root: Path) -> dict:
    """A real plan: the fuzzy dedup signatures step of a mixture planned by the run's own
    graph (pipeline/run/graph.py), over n document shards whose ingest and filter markers are
    synthetic (committed indexes), activated by the real Executor with every shard done."""
    from pipeline import config
    from pipeline.engine.executor import commit
    from pipeline.engine.markers import RunningMarkers, StepMarkers
    from pipeline.run import graph

    work = root / f"plan-{n}"
    (work / "in").mkdir(parents=True)
    (work / "in" / "a.jsonl").write_text('{"text": "a page"}\n')
    (work / "m.yaml").write_text(
        f"name: plan\ntokenizer: null\nsources:\n  web: {{paths: [\"{work}/in/a.jsonl\"], filters: [gq]}}\n"
        "filters:\n  gq: {type: gopher_quality}\ndedup:\n  fuzzy: {}\n")
    ctx = graph.build(config.load(work / "m.yaml"), work / "run", work / "store")
    steps = {s.name: s for s in ctx.steps}
    ex = Executor(work / "store", progress=Progress(quiet=True))
    ing = dict(MARKER, stages={})
    flt = dict(MARKER, stages={"gopher_quality": {"docs_out": 41_233, "tokens_out": 51_234_567}})
    for name, marker, count in (("ingest-web", ing, n), ("filter-web", flt, n), ("dedup-fuzzy-sample", {}, 0),
                                ("dedup-fuzzy-heavy", {}, 0)):
        if name not in steps:  # code from before the heavy buckets' steps
            continue
        d = steps[name].dir(ex.store)
        d.mkdir(parents=True, exist_ok=True)
        running = RunningMarkers(count)  # committed as a run commits: streamed, a marker a line
        for i in range(count):
            running[i] = marker
        index = commit(d, steps[name].hash, "bench", running)
        running.close()
        ex.stats[name] = StepMarkers(index, count)
    sig = steps["dedup-fuzzy-signatures"]
    if not YIELD[0]:  # as plans were: a list of every shard's spec (and of every shard's dict before it)
        plan = sig.shards
        sig.shards = lambda st, stats: list(plan(st, stats))
    d = sig.dir(ex.store)
    (d / MARKERS).mkdir(parents=True)
    blob = orjson.dumps({"rows": 41_233, "docs": 41_233, "text_bytes": 123_456_789, "partitions": 512, "segments": 512,
                         "seconds": 3.2, "peak_rss_mb": 512.0, "node": "host-17/0123abcd", "writer": "0123456789abg1"})
    for i in range(n):
        (d / MARKERS / f"{shard_name(i)}.json").write_bytes(blob)
    tracemalloc.start()
    c0 = time.process_time()
    ex._activate(sig, _Queue(), {}, {})
    cpu = time.process_time() - c0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert ex.status[sig.name] == "SUCCESS" and len(ex.stats[sig.name]) == n
    shutil.rmtree(work)
    return {"shards": n, "cpu_s": cpu, "peak_mb": peak / 2**20}


def _run_measured(store: Path, steps: list[Step]) -> tuple[list[str], float, int, int]:
    """The steps through a fresh Executor: their statuses, the driver's CPU seconds, and the
    Python memory it retains at the end (the Executor still alive) and at its peak."""
    ex = Executor(store, progress=Progress(quiet=True))
    tracemalloc.start()
    c0 = time.process_time()
    ex.run(steps)
    cpu = time.process_time() - c0
    retained, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return [ex.status[s.name] for s in steps], cpu, retained, peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs=2, default=[10_000, 100_000])
    ap.add_argument("--tasks", type=int, help="run N and 4N empty tasks on a local Ray instead (driver CPU per task)")
    ap.add_argument("--chain", type=int, help="K chained steps of --sizes' first size (the driver's memory over a run)")
    ap.add_argument("--yield-specs", action="store_true", help="the synthetic plan yields its specs (a generator) "
                    "instead of returning a list, as a plan written that way would")
    ap.add_argument("--plan", action="store_true", help="a real plan (fuzzy dedup's signatures over the document "
                    "shards) instead of the synthetic one; with --yield-specs as the plan is written, without as a list")
    ap.add_argument("--end", action="store_true", help="the ledger's and the report's reads of a committed step of "
                    "each size, now and before (peak memory per shard)")
    args = ap.parse_args()
    YIELD[0] = args.yield_specs
    root = Path(tempfile.mkdtemp(prefix="curate-driver-", dir=os.environ.get("TMPDIR")))
    if args.plan:
        rows = _at_sizes(measure_plan, args.sizes, root)
        print(f"plan of dedup-fuzzy-signatures, specs {'yielded' if YIELD[0] else 'listed'}")
        print("| document shards | driver CPU s | µs a shard | peak MB | KB a shard |")
        print("| ---: | ---: | ---: | ---: | ---: |")
        for r in rows:
            print(f"| {r['shards']:,} | {r['cpu_s']:.2f} | {1e6 * r['cpu_s'] / r['shards']:.1f} | {r['peak_mb']:.1f} | "
                  f"{1024 * r['peak_mb'] / r['shards']:.2f} |")
        print(_per_shard(rows, "peak_mb", "peak memory"))
        return
    if args.end:
        rows = _at_sizes(measure_end, args.sizes, root)
        print("| shards | before: peak MB | KB a shard | CPU s | now: peak MB | KB a shard | CPU s |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in rows:
            print(f"| {r['shards']:,} | {r['before_peak_mb']:.1f} | {1024 * r['before_peak_mb'] / r['shards']:.2f} | "
                  f"{r['before_cpu_s']:.2f} | {r['now_peak_mb']:.1f} | {1024 * r['now_peak_mb'] / r['shards']:.2f} | "
                  f"{r['now_cpu_s']:.2f} |")
        print(_per_shard(rows, "before_peak_mb", "peak memory before") + "; " + _per_shard(rows, "now_peak_mb", "now"))
        return
    if args.chain:
        n = args.sizes[0]
        try:
            measure_chain(200, 2, root)  # warm up
            rows = [measure_chain(n, k, root) for k in (2, args.chain)]
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print("| steps | shards a step | driver CPU s | µs a shard | peak MB | retained MB | KB a shard (peak) "
              "| all done again: CPU s | peak MB |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in rows:
            total = r["steps"] * r["shards"]
            print(f"| {r['steps']} | {r['shards']:,} | {r['cpu_s']:.2f} | {1e6 * r['cpu_s'] / total:.1f} | "
                  f"{r['peak_mb']:.1f} | {r['retained_mb']:.1f} | {1024 * r['peak_mb'] / total:.2f} | "
                  f"{r['rerun_cpu_s']:.3f} | {r['rerun_peak_mb']:.2f} |")
        a, b = rows
        print(f"{b['steps'] // a['steps']}x the steps: driver peak memory x{b['peak_mb'] / a['peak_mb']:.2f}, retained "
              f"x{b['retained_mb'] / max(a['retained_mb'], 1e-9):.2f}, CPU per shard "
              f"x{(b['cpu_s'] / b['steps']) / (a['cpu_s'] / a['steps']):.2f}")
        return
    if args.tasks:
        try:
            run_tasks(200, root)  # warm up: workers started, first imports
            rows = [run_tasks(n, root) for n in (args.tasks, 4 * args.tasks)]
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print("| tasks | driver CPU s | ms a task | wall s | Ray alone: driver CPU s | ms a task | wall s | Executor / Ray |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in rows:
            print(f"| {r['tasks']:,} | {r['cpu_s']:.2f} | {1e3 * r['cpu_s'] / r['tasks']:.2f} | {r['wall_s']:.1f} | "
                  f"{r['ray_cpu_s']:.2f} | {1e3 * r['ray_cpu_s'] / r['tasks']:.2f} | {r['ray_wall_s']:.1f} | "
                  f"{r['cpu_s'] / r['ray_cpu_s']:.2f}x |")
        a, b = rows
        print(f"per task, 4x the tasks: driver CPU x{(b['cpu_s'] / b['tasks']) / (a['cpu_s'] / a['tasks']):.2f}")
        return
    rows = _at_sizes(measure, args.sizes, root)
    print(f"{'shards':>8} {'wall s':>8} {'cpu s':>8} {'µs/shard':>9} {'peak MB':>8} {'KB/shard':>9} {'step.json MB':>13}")
    for r in rows:
        print(f"{r['shards']:>8} {r['wall_s']:>8.2f} {r['cpu_s']:>8.2f} {1e6 * r['cpu_s'] / r['shards']:>9.1f} "
              f"{r['peak_mb']:>8.1f} {1024 * r['peak_mb'] / r['shards']:>9.2f} {r['step_json_mb']:>13.1f}")
    print(_per_shard(rows, "cpu_s", "driver CPU") + ", " + _per_shard(rows, "peak_mb", "peak memory").split(": ", 1)[1])


def _at_sizes(fn, sizes, root: Path) -> list[dict]:
    """fn(n, root) at each size, after a warm-up (first imports and caches are not a per-shard cost)."""
    try:
        fn(200, root)
        return [fn(n, root) for n in sizes]
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _per_shard(rows: list[dict], key: str, what: str) -> str:
    a, b = rows
    return (f"per shard, {b['shards'] // a['shards']}x the shards: {what} "
            f"x{(b[key] / b['shards']) / (a[key] / a['shards']):.2f}")


if __name__ == "__main__":
    main()
