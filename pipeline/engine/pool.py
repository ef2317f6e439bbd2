"""Small runs without Ray: the shard tasks in a pool of local worker processes.

Why: an embedded Ray costs ~3 s of wall time and ~5 CPU-seconds to start and stop (GCS,
raylet, workers each importing the step code), which is most of a run of a few thousand
documents. A run whose input files fit `CURATE_LOCAL_BYTES` (default 64 MB, no
RAY_ADDRESS) runs its tasks here instead: the same `run_shard` calls (so the same bytes),
in `workers` processes forked from a fork server started at the run's beginning, while the
driver plans; the server imports numpy, pyarrow, pandas (pyarrow imports it at its first
numpy conversion: 0.2 s a process) and the common steps' modules once, and each worker is
forked from it. Larger runs, a cluster and the test suite's CURATE_INLINE_DOCS=0 use Ray.

What Ray gave that this keeps: a transient fault is retried in the worker (`max_retries`),
a worker that dies (killed, out of memory) fails only the shards it had, which are
submitted again on a fresh pool up to `max_retries` times; a failed shard never stops the
others. What it does not do: schedule by memory (small inputs) or span nodes.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os

from pipeline.engine.task import run_shard_retrying
from pipeline.errors import env_int

LOCAL_BYTES = 64 << 20
PRELOAD = ["numpy", "pyarrow", "pyarrow.parquet", "pyarrow.compute", "pandas", "pipeline.engine.task",  # once, not
           "pipeline.steps.ingest.ids", "pipeline.steps.ingest.documents", "pipeline.steps.filter",   # once a worker
           "pipeline.steps.dedup.exact", "pipeline.steps.dedup.fuzzy", "pipeline.steps.dedup.paragraph",
           "pipeline.steps.mix.tasks", "pipeline.steps.samples.tasks"]


def local_bytes() -> int:
    return env_int("CURATE_LOCAL_BYTES", LOCAL_BYTES, "a number of bytes of input (0: always Ray)", least=0)


class LocalPool:
    """`workers` local processes running shard tasks; futures keyed by the caller's key."""

    def __init__(self, workers: int, max_retries: int, start: bool = True, preload: tuple[str, ...] = ()):
        self.workers, self.max_retries = max(1, workers), max_retries
        self.preload = PRELOAD + [m for m in preload if m not in PRELOAD]  # and what the run's steps declare
        self.early = start
        self.pool = self._new() if start else None  # else at the first task
        self.futures: dict[cf.Future, tuple] = {}  # future -> (key, args, times its worker died)

    def _new(self) -> cf.ProcessPoolExecutor:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(self.preload)
        pool = cf.ProcessPoolExecutor(self.workers, mp_context=ctx)
        pool.submit(os.getpid)  # start the server and the workers now, while the driver plans
        return pool

    def started(self) -> str:
        """When its processes came up, for run.json: while the driver planned, at its first task, or never."""
        return "while planning" if self.early else "at its first task" if self.pool is not None else "never"

    def submit(self, key, *args, died: int = 0) -> None:
        if self.pool is None:
            self.pool = self._new()
        self.futures[self.pool.submit(run_shard_retrying, self.max_retries, *args)] = (key, args, died)

    def __len__(self) -> int:
        return len(self.futures)

    def wait(self, timeout: float) -> list[tuple]:
        """(key, stats or the exception that ended the shard) of finished shards."""
        done, _ = cf.wait(list(self.futures), timeout=timeout, return_when=cf.FIRST_COMPLETED)
        out, again = [], []
        for f in done:
            key, args, died = self.futures.pop(f)
            try:
                out.append((key, f.result()))
            except cf.process.BrokenProcessPool as e:  # its worker died: every shard in flight gets this
                if died >= self.max_retries:
                    out.append((key, RuntimeError(f"its worker process died {died + 1} times: {e}")))
                else:
                    again.append((key, args, died + 1))
            except Exception as e:  # noqa: BLE001 -- the others go on; the run fails once, at the end
                out.append((key, e))
        if again:
            self.pool.shutdown(wait=False, cancel_futures=True)
            for f, (key, args, died) in list(self.futures.items()):  # the rest of the broken pool's shards too
                self.futures.pop(f)
                again.append((key, args, died + 1))
            self.pool = self._new()
            for key, args, died in again:
                self.submit(key, *args, died=died)
        return out

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
