"""Where a shard runs: in the driver's own process (a small step while no Ray is up), in a
small run's local worker processes (engine/pool.py), or as a Ray task (the embedded Ray,
started at the first step that needs it, or a cluster's). The Executor's scheduling loop
(engine/executor.py) asks these; they hold no scheduling state of their own.
"""

from __future__ import annotations

import os

from pipeline.engine.cluster import check_shared_output, start_ray
from pipeline.engine.step import Step
from pipeline.engine.task import run_shard, run_shard_retrying
from pipeline.errors import TransientError


class Where:
    """Mixed into the Executor: its `workers`, `max_retries`, `store`, `stats`, `inline_docs`,
    `input_bytes`, `local_bytes`, `first_run`, `_ray`, `_pool` and `pooled`."""

    def _ensure_ray(self):
        if self._ray is None:
            import ray

            if not ray.is_initialized():
                start_ray(self.workers)
                check_shared_output(self.store)
            remote = ray.remote(num_cpus=1, max_retries=self.max_retries, retry_exceptions=[TransientError])(run_shard)
            cap = max(2, 2 * int(ray.cluster_resources().get("CPU", self.workers or 1)))
            node_mb = max((n["Resources"].get("memory", 0) / 2**20 for n in ray.nodes() if n.get("Alive")), default=0)
            self._ray = (ray, remote, cap, node_mb)
        return self._ray

    def _inline_ok(self, s: Step) -> bool:
        """Run `s` in this process: no Ray is up, and its largest input holds at most
        `inline_docs` rows (a step that reads no other step: its run's input files at ~1 KB
        a document)."""
        if self.inline_docs <= 0 or not self._no_ray():
            return False
        if s.inputs:
            docs = max(sum(m.get("rows", 0) for m in self.stats.get(i.name, {}).values()) for i in s.inputs)
        elif self.input_bytes is None:
            return False
        else:
            docs = self.input_bytes // 1000
        return docs <= self.inline_docs

    def _no_ray(self) -> bool:
        """No Ray is up, nor is one named (RAY_ADDRESS): a step may run in this process."""
        import sys

        if self._ray is not None or os.environ.get("RAY_ADDRESS"):
            return False
        return not ("ray" in sys.modules and sys.modules["ray"].is_initialized())

    def _run_inline(self, s: Step, idx: int, spec: dict):
        """One shard in this process, with the retries Ray would give a transient fault;
        returns its stats or the exception that ended it."""
        try:
            return run_shard_retrying(self.max_retries, *self._args(s, idx, spec))
        except Exception as e:  # noqa: BLE001 -- reported as a Ray task's error would be
            return e

    def _args(self, s: Step, idx: int, spec: dict) -> tuple:
        """run_shard's arguments for shard `idx` of `s`, wherever it runs."""
        return (s.task, spec, str(s.dir(self.store)), idx, self.fence(s), *_keys(s, idx), driver_env())

    def _start_pool(self, todo: list[Step]) -> None:
        """A small run's local worker processes instead of Ray (engine/pool.py); Ray is never
        started. Started now, so that they come up while the driver plans, on a first run
        whose input files are larger than a step run inline; else at the first task it has:
        a rerun's few shards (an edit, a new file) mostly run inline, and a pool started for
        nothing costs ~1.5 CPU-s (its server's and workers' imports)."""
        if (self.local_bytes > 0 and self.inline_docs > 0 and self.input_bytes is not None
                and self.input_bytes <= self.local_bytes and self._no_ray()):
            from pipeline.engine.pool import LocalPool

            reads_inputs = any(not s.inputs for s in todo)
            self._pool = LocalPool(self.workers or os.cpu_count() or 1, self.max_retries,
                                   start=self.first_run and reads_inputs and self.input_bytes // 1000 > self.inline_docs,
                                   preload=tuple(sorted({m for s in todo for m in s.preload})))

    @property
    def backend(self) -> str:
        """Where this run's tasks ran: "ray", "local processes" (engine/pool.py) or "in process"."""
        return "ray" if self._ray is not None else "local processes" if self.pooled else "in process"

    def _cap(self) -> int:
        """Tasks in flight at most (no bound while neither Ray nor the pool is up)."""
        if self._pool is not None:
            return 2 * self._pool.workers
        return self._ray[2] if self._ray is not None else 1 << 30



DRIVER_ENV = ("CURATE_NATIVE",)  # settings a task reads that the driver decides (filters/words.py: the compiled loop)


def driver_env() -> dict[str, str]:
    """The driver's value of each of DRIVER_ENV, for its tasks: a worker's own environment
    (a cluster node's shell) never decides what a run computes with. They change no byte."""
    return {k: os.environ.get(k, "") for k in DRIVER_ENV}


def _keys(s: Step, idx: int) -> tuple[str, str | None]:
    """A shard's content key and partial key, for its marker."""
    partials = s.meta.get("partials") or []
    return s.meta["keys"][idx], partials[idx] if idx < len(partials) else None


def task_options(s: Step, node_mb: float) -> dict:
    """Ray options beyond the defaults: CPU and GPU slots, and the memory the step declares, at most
    80% of the largest node's (a task that asks for more than any node has never starts)."""
    opts: dict = {}
    if s.cpus != 1:
        opts["num_cpus"] = s.cpus
    if s.gpus:
        opts["num_gpus"] = s.gpus
    if s.memory_mb and node_mb:
        opts["memory"] = int(min(s.memory_mb, 0.8 * node_mb) * 2**20)
    return opts


