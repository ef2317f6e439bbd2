"""Curate's file shuffle against Ray Data's own shuffle on the same keys (issue 35): S
Parquet files of 16-byte keys with an 8-byte payload (the exact dedup map's rows), range-
partitioned by key into P partitions, each partition sorted and written as Parquet; at N
and 4N rows with S and P growing 4x together, as the defaults grow them.

    python -m bench.raydata [--writers 16] [--rows 250000] [--scales 1,4] [--workers 2]

- curate: one Ray task per input file writes its rows partitioned (`shards.shuffle.
  write_partitions`: one data file and one index a writer), the merge tier joins groups of
  writers' files past 32 (`steps.merge.group_size`), one Ray task per partition reads its
  segment of each file (`read_partition`), sorts and writes it;
- Ray Data: `read_parquet(...).sort("h1").write_parquet(...)` with P output blocks
  (sample-based range partitioning, blocks through Ray's object store).

Both on the same local Ray with `--workers` CPUs; printed: wall time, the machine's peak
memory above idle while it runs (Ray's object store is shared memory: counted), bytes
spilled to disk, and a check that both wrote the same rows in the same order. Not a
test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.scale import CACHE


def _inputs(d: Path, writers: int, rows: int, seed: int) -> Path:
    src = d / "in"
    if (src / "_DONE").exists():
        return src
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for i in range(writers):
        h1 = rng.integers(0, 2**64, rows, dtype=np.uint64).view(np.int64)  # the key's whole range
        pq.write_table(pa.table({"h1": h1, "h2": h1 ^ 0x5BD1E995, "gid": np.arange(rows, dtype=np.int64) + i * rows}),
                       src / f"part-{i:05d}.parquet")
    (src / "_DONE").write_text("")
    return src


class Peak:
    """The machine's used memory (RAM + shared memory) sampled every 50 ms, above its level at start."""

    def __init__(self):
        self.base = self._used()
        self.peak = 0
        self._stop = False
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    @staticmethod
    def _used() -> int:
        m = {}
        for line in open("/proc/meminfo"):
            k, v = line.split(":", 1)
            m[k] = int(v.split()[0]) * 1024
        return m["MemTotal"] - m["MemAvailable"]

    def _run(self):
        while not self._stop:
            self.peak = max(self.peak, self._used() - self.base)
            time.sleep(0.05)

    def stop(self) -> float:
        self._stop = True
        self._t.join()
        return self.peak / 2**20


def curate_shuffle(src: Path, out: Path, writers: int, parts: int) -> float:
    import ray

    from pipeline.shards import shuffle
    from pipeline.steps.merge import GROUP, group_size, read_ahead

    work = out / "work"
    shutil.rmtree(out, ignore_errors=True)
    (out / "sorted").mkdir(parents=True)

    @ray.remote(num_cpus=1)
    def map_task(i: int) -> None:
        t = pq.read_table(src / f"part-{i:05d}.parquet")
        keys = t.column("h1").to_numpy().view(np.uint64) ^ np.uint64(1 << 63)  # signed order as unsigned
        part = ((keys >> np.uint64(32)) * np.uint64(parts)) >> np.uint64(32)  # ranges of the key, in order
        shuffle.write_partitions(t, part.astype(np.int64), parts, shuffle.map_file(work / "maps", i))

    @ray.remote(num_cpus=1)
    def merge_task(j: int, a: int, b: int) -> None:
        shuffle.merge(work / "maps", a, b, shuffle.map_file(work / "merged", j), buffering=read_ahead(b - a))

    @ray.remote(num_cpus=1)
    def reduce_task(p: int, folder: str, files: int) -> None:
        t = shuffle.read_partition(Path(folder), files, p)
        if t is not None:
            pq.write_table(t.sort_by("h1"), out / "sorted" / f"part-{p:05d}.parquet")

    t0 = time.perf_counter()
    ray.get([map_task.remote(i) for i in range(writers)])
    folder, files = work / "maps", writers
    if writers > GROUP:
        g = group_size(writers, GROUP)
        groups = [(a, min(writers, a + g)) for a in range(0, writers, g)]
        ray.get([merge_task.remote(j, a, b) for j, (a, b) in enumerate(groups)])
        folder, files = work / "merged", len(groups)
    ray.get([reduce_task.remote(p, str(folder), files) for p in range(parts)])
    return time.perf_counter() - t0


def raydata_shuffle(src: Path, out: Path, parts: int) -> float:
    import ray

    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    ds = ray.data.read_parquet(str(src), file_extensions=["parquet"]).repartition(parts).sort("h1")
    ds.write_parquet(str(out / "sorted"), min_rows_per_file=1)
    return time.perf_counter() - t0


def _digest(folder: Path) -> tuple[int, str]:
    """(rows, sha256 of the key column in file order, files in name order)."""
    h, n = hashlib.sha256(), 0
    for f in sorted(folder.glob("*.parquet")):
        k = pq.read_table(f, columns=["h1"]).column("h1").to_numpy()
        n += len(k)
        h.update(k.tobytes())
    return n, h.hexdigest()


def _spilled() -> int:
    try:
        from ray._private.internal_api import memory_summary

        text = memory_summary(stats_only=True)
    except Exception:  # noqa: BLE001 -- the summary's format is Ray's own: best effort
        return -1
    for line in text.splitlines():
        if "Spilled" in line and "MiB" in line:
            return int(float(line.split("Spilled")[1].split("MiB")[0].strip(" :")))
    return 0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.raydata", description=__doc__.split("\n\n")[0])
    ap.add_argument("--writers", type=int, default=16, help="input files (and partitions) at N")
    ap.add_argument("--rows", type=int, default=250_000, help="rows per input file")
    ap.add_argument("--scales", default="1,4")
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args(argv)
    import ray

    ray.init(num_cpus=a.workers, logging_level="ERROR", include_dashboard=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    res = []
    try:
        for k in (int(x) for x in a.scales.split(",")):
            s = p = a.writers * k
            d = CACHE / "raydata" / f"s{s}-r{a.rows}"
            src = _inputs(d, s, a.rows, k)
            row = {"rows": s * a.rows, "S": s, "P": p}
            for name, fn in (("curate", lambda: curate_shuffle(src, d / "curate", s, p)),
                             ("raydata", lambda: raydata_shuffle(src, d / "raydata", p))):
                before = _spilled()
                peak = Peak()
                wall = fn()
                row[name] = {"wall": wall, "peak_mb": peak.stop(), "spilled_mb": max(0, _spilled() - before),
                             "digest": _digest(d / name / "sorted"), "files": len(list((d / name / "sorted").glob("*.parquet")))}
            res.append(row)
    finally:
        ray.shutdown()
    print("| rows | writers S = partitions P | curate wall s | Ray Data wall s | curate peak MB | Ray Data peak MB "
          "| Ray Data spilled MB | output files (curate, Ray Data) | same rows, same order |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |")
    for r in res:
        c, d = r["curate"], r["raydata"]
        print(f"| {r['rows']:,} | {r['S']} | {c['wall']:.1f} | {d['wall']:.1f} | {c['peak_mb']:.0f} | {d['peak_mb']:.0f} | "
              f"{d['spilled_mb']} | {c['files']}, {d['files']} | {c['digest'] == d['digest']} ({c['digest'][0]:,} rows) |")
    if len(res) > 1:
        a0, a1 = res[0], res[-1]
        for name in ("curate", "raydata"):
            print(f"{name}: wall per row {a1['rows'] // a0['rows']}N / N {(a1[name]['wall'] / a1['rows']) / (a0[name]['wall'] / a0['rows']):.2f}x, "
                  f"peak memory {a1[name]['peak_mb'] / max(1, a0[name]['peak_mb']):.2f}x")


if __name__ == "__main__":
    main()
