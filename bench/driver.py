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
from collections import deque
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.engine.executor import Executor  # noqa: E402
from pipeline.engine.step import MARKERS, Step, shard_name  # noqa: E402
from pipeline.engine.progress import Progress  # noqa: E402


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
    ex = Executor(store, workers=2, progress=Progress(quiet=True))
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


def _specs(n: int):
    def shards(step, stats):
        return [{"file": f"s3://bucket/corpus/crawl-{i // 20:06d}.jsonl.zst", "start": (i % 20) * 50_000,
                 "stop": (i % 20 + 1) * 50_000, "describe": f"crawl-{i // 20:06d}.jsonl.zst rows {(i % 20) * 50_000}-"}
                for i in range(n)]
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
    queue, remaining, started = deque(), {}, {}
    ex._activate(s, queue, remaining, started)  # lists specs, writes step.json, reads markers, commits (none to do)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert ex.status[s.name] == "SUCCESS" and len(ex.stats[s.name]) == n
    step_json = (d / "step.json").stat().st_size
    shutil.rmtree(store)
    return {"shards": n, "wall_s": wall, "cpu_s": cpu, "peak_mb": peak / 2**20, "step_json_mb": step_json / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs=2, default=[10_000, 100_000])
    ap.add_argument("--tasks", type=int, help="run N and 4N empty tasks on a local Ray instead (driver CPU per task)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="curate-driver-", dir=os.environ.get("TMPDIR")))
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
    try:
        measure(200, root)  # warm up: first imports and caches are not a per-shard cost
        rows = [measure(n, root) for n in args.sizes]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{'shards':>8} {'wall s':>8} {'cpu s':>8} {'µs/shard':>9} {'peak MB':>8} {'KB/shard':>9} {'step.json MB':>13}")
    for r in rows:
        print(f"{r['shards']:>8} {r['wall_s']:>8.2f} {r['cpu_s']:>8.2f} {1e6 * r['cpu_s'] / r['shards']:>9.1f} "
              f"{r['peak_mb']:>8.1f} {1024 * r['peak_mb'] / r['shards']:>9.2f} {r['step_json_mb']:>13.1f}")
    a, b = rows
    print(f"per shard, {b['shards'] // a['shards']}x the shards: driver CPU x{(b['cpu_s'] / b['shards']) / (a['cpu_s'] / a['shards']):.2f}, "
          f"peak memory x{(b['peak_mb'] / b['shards']) / (a['peak_mb'] / a['shards']):.2f}")


if __name__ == "__main__":
    main()
