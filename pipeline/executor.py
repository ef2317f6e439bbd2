"""Hashed, resumable steps run as one Ray task per shard.

A `Step` is a pure function of (its config, its inputs). Its output directory is
`steps/<name>-<hash8>/`, where the hash covers the step's kind, code version, config and
the hashes of the steps it reads. The directory holds:

    step.json              resolved config, input hashes, shard specs, versions
    part-00000.parquet     data, written to a temporary name and renamed into place
    _markers/part-00000.json   the shard's stats, written last: "this shard is done"
    _SUCCESS               written when every marker exists

A rerun skips a step with `_SUCCESS` and, inside an unfinished step, every shard with a
marker; a config edit changes the hash, so only the steps it touches (and those
downstream) run again. Shard specs and stats are small; documents never pass through the
driver. In-flight tasks are bounded (`ray.wait` backpressure); Ray retries a shard lost
with its worker or node (`max_retries`), and since names are deterministic and writes
atomic, a retry produces the same bytes.

Example:

    ingest = Step("ingest-web", "ingest", {"files": [...]}, [], "pipeline.steps.ingest:run_shard",
                  shards=lambda step, stats: [...])
    Executor(run_dir, workers=2).run([ingest, ...])
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pipeline import __version__
from pipeline.config import hash_json
from pipeline.errors import CurateError, RunError, UsageError
from pipeline.io import atomic, fs
from pipeline.lease import Leases, describe

MARKERS = "_markers"
MARKERS_ALL = "_markers.json"  # every shard's marker in one file, written before _SUCCESS
SUCCESS = "_SUCCESS"


def shard_name(index: int) -> str:
    return f"part-{index:05d}"


@dataclass
class Step:
    name: str  # unique in a run, e.g. "ingest-web"
    kind: str  # ingest | filter | mix ...
    config: dict  # everything that changes the output, JSON-able
    inputs: list[Step]
    fn: str  # "module:function" run per shard: fn(spec, ShardOutput) -> stats dict, whose "rows" is
    #          the documents the shard processed (progress counts it)
    shards: Callable[[Step, dict], list[dict]]  # (step, stats of finished steps), called once inputs are done
    version: str = "1"  # bump when the step's code changes its output
    cpus: float = 1  # CPU slots a task takes (0 for a coordinator that waits on tasks of its own)
    meta: dict = field(default_factory=dict)  # not hashed: the shard specs once listed, for error messages

    # computed once: a step's config and inputs do not change after the plan builds it
    @functools.cached_property
    def config_hash(self) -> str:
        return hash_json({"kind": self.kind, "version": self.version, "config": self.config})

    @functools.cached_property
    def inputs_hash(self) -> str:
        return hash_json(sorted(i.hash for i in self.inputs))

    @functools.cached_property
    def hash(self) -> str:
        return hash_json([self.config_hash, self.inputs_hash])

    def dir(self, run_dir: Path) -> Path:
        return run_dir / "steps" / f"{self.name}-{self.hash[:8]}"


class ShardOutput:
    """Where a shard task writes: final names, temporary names, and the commit."""

    def __init__(self, step_dir: str, index: int):
        self.dir = fs.path(step_dir)
        self.index = index
        self.name = shard_name(index)

    def path(self, suffix: str = ".parquet", sub: str | None = None) -> Path:
        d = self.dir / sub if sub else self.dir
        fs.makedirs(d)
        return d / f"{self.name}{suffix}"


def _reset_peak_rss() -> bool:
    """Linux lets a process reset its peak RSS (VmHWM); then a marker's peak is the shard's own."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss_mb(reset: bool) -> float:
    """Peak resident memory of this worker during the shard (if the reset worked) or so far
    (Ray reuses workers, so then an upper bound)."""
    if reset:
        try:
            for line in open("/proc/self/status"):
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
        except OSError:
            pass
    import resource

    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(kb / (1 << 20 if sys.platform == "darwin" else 1 << 10), 1)


def _node() -> str:
    """Host and Ray node of this worker (for the record: which machine ran a shard)."""
    import socket

    try:
        import ray

        node = ray.get_runtime_context().get_node_id()[:8] if ray.is_initialized() else "local"
    except Exception:  # noqa: BLE001 -- bookkeeping only
        node = "?"
    return f"{socket.gethostname()}/{node}"


def _resolve(fn: str) -> Callable:
    mod, _, name = fn.partition(":")
    return getattr(importlib.import_module(mod), name)


TASK_ENV = {"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def run_shard(fn: str, spec: dict, step_dir: str, index: int, writer: str | None = None) -> dict:
    """Body of one shard task (also callable in-process): run, then write the marker.

    One core per task: thread pools are pinned here, before the step's modules load (a
    Ray runtime_env would do the same but costs about 2 s at a job's first task)."""
    for k, v in TASK_ENV.items():
        os.environ.setdefault(k, v)
    started = time.time()
    reset = _reset_peak_rss()
    out = ShardOutput(step_dir, index)
    try:
        stats = _resolve(fn)(spec, out)
    except CurateError:
        raise
    except Exception as e:  # a bug or an unexpected input: keep the traceback in a file
        tb = out.path(".txt", "_errors")
        tb.write_text(traceback.format_exc())
        raise RunError(f"{type(e).__name__}: {e} (traceback: {tb})") from None
    stats["seconds"] = round(time.time() - started, 3)
    stats["peak_rss_mb"] = _peak_rss_mb(reset)
    stats["node"] = _node()
    if writer:
        stats["writer"] = writer  # the run that computed this shard (steps are shared between runs)
    atomic.write_json(out.path(".json", MARKERS), stats)
    return stats


# ---------------------------------------------------------------- status of steps


def read_markers(step_dir: Path) -> dict[int, dict]:
    """Every shard's marker: from the consolidated file a finished step keeps (one read),
    else one file per shard (a step in progress)."""
    done = step_dir / MARKERS_ALL
    if done.exists():
        return {int(k): v for k, v in atomic.read_json(done).items()}
    out = {}
    mdir = step_dir / MARKERS
    if mdir.is_dir():
        for p in mdir.glob("part-*.json"):
            out[int(p.stem.split("-")[1])] = atomic.read_json(p)
    return out


def step_status(step: Step, run_dir: Path, previous: dict | None) -> tuple[str, str]:
    """('run' | 'skip', why) for the plan: done, resume, new, config or inputs changed."""
    d = step.dir(run_dir)
    if (d / SUCCESS).exists():
        return "skip", "done"
    if (d / "step.json").exists():
        n = len(list((d / MARKERS).glob("*.json"))) if (d / MARKERS).is_dir() else 0
        return "run", f"resume ({n} shards done)"
    prev = (previous or {}).get(step.name)
    if prev is None:
        return "run", "new"
    if prev.get("config_hash") != step.config_hash:
        return "run", "config changed"
    if prev.get("inputs_hash") != step.inputs_hash:
        return "run", "inputs changed"
    return "run", "output missing"


# ---------------------------------------------------------------- Ray


def _clear_stale_local_ray() -> str | None:
    """A Ray killed without shutdown leaves `ray_current_cluster` behind, and tools that read
    it then try to join a dead cluster. Clear it when nothing answers at its address."""
    import socket
    import tempfile

    root = Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "ray"
    current = root / "ray_current_cluster"
    if not current.is_file():
        return None
    address = current.read_text().strip().splitlines()[0] if current.stat().st_size else ""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=1.0):
            return None  # a live cluster: leave it alone
    except (OSError, ValueError):
        pass
    current.unlink(missing_ok=True)
    return f"note: cleared a stale Ray address file ({current}: {address or 'empty'}) left by a Ray that was killed; starting a fresh local Ray"


def start_ray(workers: int | None) -> bool:
    """Join RAY_ADDRESS if set, else start an embedded Ray. Returns True if we started it."""
    import ray

    if ray.is_initialized():
        return False
    # after a failed shard the others are cancelled; their errors are not news
    os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=True)
        return True
    msg = _clear_stale_local_ray()
    if msg:
        print(msg, file=sys.stderr)
    ray.init(
        address="local",
        num_cpus=workers or os.cpu_count(),
        include_dashboard=False,
        log_to_driver=True,
        logging_level="ERROR",
        configure_logging=True,
    )
    return True


def check_shared_output(run_dir) -> None:
    """On a cluster, every node writes into the run directory: a local path must be a shared
    filesystem. One zero-CPU task per node looks for a probe file the driver wrote."""
    import socket
    import uuid

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not fs.is_local(run_dir):
        return
    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
    if len(nodes) <= 1:
        return
    probe = fs.path(run_dir) / f".probe-{uuid.uuid4().hex[:8]}"
    atomic.write_bytes(probe, b"curate")

    def sees(p: str) -> tuple[bool, str]:
        return os.path.exists(p), socket.gethostname()

    task = ray.remote(num_cpus=0, max_retries=0)(sees)
    try:
        found = ray.get([task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                         .remote(str(probe)) for n in nodes], timeout=120)
    finally:
        probe.unlink(missing_ok=True)
    blind = sorted({host for ok, host in found if not ok})
    if blind:
        raise UsageError(
            f"output {run_dir} is a local path that {len(blind)} of {len(nodes)} cluster nodes cannot see "
            f"({', '.join(blind)}); on a cluster the run directory must be on a filesystem every node mounts, "
            "or an object-store URL: --output s3://bucket/runs (pip install 'curate[s3]')"
        )


# ---------------------------------------------------------------- progress


class Progress:
    """One line per step: tqdm bars on a terminal, plain periodic lines in job logs."""

    def __init__(self, stream=sys.stderr, quiet: bool = False):
        self.stream = stream
        self.quiet = quiet
        self.tty = stream.isatty() and not quiet
        self.bars: dict[str, object] = {}
        self.state: dict[str, dict] = {}
        self.last_print = 0.0

    def start(self, name: str, total: int, done: int, docs: int):
        self.state[name] = {"total": total, "done": done, "done0": done, "docs": docs, "t0": time.time(), "docs0": docs}
        if self.quiet:
            return
        if self.tty:
            from tqdm import tqdm

            self.bars[name] = tqdm(total=total, initial=done, desc=name, unit="shard", file=self.stream, leave=True, dynamic_ncols=True)
        else:
            print(f"[{name}] {total} shards ({done} already done)", file=self.stream, flush=True)

    def update(self, name: str, docs: int):
        s = self.state[name]
        s["done"] += 1
        s["docs"] += docs
        elapsed = max(time.time() - s["t0"], 1e-6)
        rate = (s["docs"] - s["docs0"]) / elapsed
        new_shards = s["done"] - s.get("done0", 0)
        eta = elapsed / new_shards * (s["total"] - s["done"]) if new_shards else None
        if self.quiet:
            return
        if self.tty:
            bar = self.bars[name]
            bar.set_postfix_str(f"{s['docs']:,} docs, {rate:,.0f} docs/s", refresh=False)
            bar.update(1)
        elif time.time() - self.last_print > 5 or s["done"] == s["total"]:
            self.last_print = time.time()
            left = f", ETA {eta:.0f}s" if eta is not None and s["done"] < s["total"] else ""
            print(f"[{name}] {s['done']}/{s['total']} shards, {s['docs']:,} docs, {rate:,.0f} docs/s{left}", file=self.stream, flush=True)

    def note(self, line: str):
        if not self.quiet:
            print(line, file=self.stream, flush=True)

    def finish(self, name: str, seconds: float):
        if self.tty and name in self.bars:
            self.bars.pop(name).close()
        s = self.state.get(name, {})
        if self.quiet:
            return
        print(f"[{name}] done: {s.get('docs', 0):,} docs in {seconds:.1f}s", file=self.stream, flush=True)


# ---------------------------------------------------------------- the executor


def _versions() -> dict:
    import pyarrow
    import ray

    return {"curate": __version__, "python": sys.version.split()[0], "ray": ray.__version__, "pyarrow": pyarrow.__version__}


class Executor:
    """Runs steps in dependency order; the shards of every ready step share one task pool."""

    def __init__(self, run_dir: Path, workers: int | None = None, max_retries: int = 3, progress: Progress | None = None,
                 leases: Leases | None = None):
        self.run_dir = fs.path(run_dir)
        self.leases = leases  # None: no other run shares these steps (no leases taken)
        self.workers = workers
        self.max_retries = max_retries
        self.progress = progress or Progress()
        self.stats: dict[str, dict[int, dict]] = {}  # step name -> shard index -> marker stats
        self.timings: dict[str, float] = {}
        self.status: dict[str, str] = {}
        self.computed: dict[str, int] = {}  # step name -> shards this run computed (the rest were cached or another run's)

    def _ensure_ray(self):
        import ray

        if not ray.is_initialized():
            start_ray(self.workers)
            check_shared_output(self.run_dir)
        return ray

    def lease_dir(self, s: Step):
        return self.run_dir / "_leases" / s.dir(self.run_dir).name

    def run(self, steps: list[Step]) -> dict[str, dict[int, dict]]:
        try:
            return self._run(steps)
        finally:
            if self.leases is not None:  # failed or interrupted: free what we hold for the others at once
                for s in steps:
                    if self.status.get(s.name) != "SUCCESS":
                        self.leases.release(self.lease_dir(s))

    def _run(self, steps: list[Step]) -> dict[str, dict[int, dict]]:
        for s in steps:
            d = s.dir(self.run_dir)
            if (d / SUCCESS).exists():
                self.stats[s.name] = read_markers(d)
                self.status[s.name] = "SKIPPED"
        todo = [s for s in steps if s.name not in self.stats]
        if not todo:
            return self.stats
        ray = self._ensure_ray()
        remote = ray.remote(num_cpus=1, max_retries=self.max_retries, retry_exceptions=False)(run_shard)
        cap = max(2, 2 * int(ray.cluster_resources().get("CPU", self.workers or 1)))
        writer = self.leases.run_id if self.leases else None
        queue: deque = deque()
        in_flight: dict = {}
        remaining: dict[str, int] = {}
        started: dict[str, float] = {}
        waiting = list(todo)
        last_poll = [0.0]
        blocked: dict[str, Step] = {}  # steps another live run holds the lease of: wait, then reuse or take over

        def claim(s: Step) -> bool:
            """True when this run computes `s`; False when `s` is another run's (now done, or blocked)."""
            d = s.dir(self.run_dir)
            fs.refresh(d)
            if (d / SUCCESS).exists():  # another run finished it meanwhile
                self._reuse(s)
                return False
            if self.leases is None:
                return True
            rec = self.leases.acquire(self.lease_dir(s))
            if rec is None:
                if (d / SUCCESS).exists():  # finished between the look and the lease
                    self.leases.release(self.lease_dir(s))
                    self._reuse(s)
                    return False
                prev = self.leases.took_over.pop(str(self.lease_dir(s)), None)
                if prev is not None:
                    self.progress.note(f"[{s.name}] taking over from {describe(prev)}: its lease expired or its process is gone")
                return True
            if s.name not in blocked:
                self.progress.note(f"[{s.name}] waiting: {describe(rec)} is computing it")
            blocked[s.name] = s
            self.status[s.name] = "WAITING"
            return False

        def activate_ready():
            for s in list(waiting):
                if all(i.name in self.stats and i.name not in remaining and i.name not in blocked for i in s.inputs):
                    waiting.remove(s)
                    if claim(s):
                        self._activate(s, queue, remaining, started)

        def poll_blocked():
            for name, s in list(blocked.items()):
                if claim(s):
                    blocked.pop(name)
                    self._activate(s, queue, remaining, started)
                elif s.name in self.stats and self.status.get(s.name) == "REUSED":
                    blocked.pop(name)

        activate_ready()
        while queue or in_flight or blocked:
            self._check_lost()
            while queue and len(in_flight) < cap:
                s, idx, spec = queue.popleft()
                r = remote if s.cpus == 1 else remote.options(num_cpus=s.cpus)
                ref = r.remote(s.fn, spec, str(s.dir(self.run_dir)), idx, writer)
                in_flight[ref] = (s, idx)
            refs = list(in_flight)
            if refs:
                done, rest = ray.wait(refs, num_returns=1, timeout=1.0)
            else:  # only waiting on other runs' steps
                done, rest = [], []
                time.sleep(min(1.0, self.leases.ttl / 8) if self.leases else 1.0)
            if done and rest:  # harvest every shard already finished in the same pass
                more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
                done += more
            for ref in done:
                s, idx = in_flight.pop(ref)
                try:
                    st = ray.get(ref)
                except Exception as e:
                    for r in in_flight:
                        ray.cancel(r, force=True)
                    self.status[s.name] = "FAILED"
                    raise RunError(f"step {s.name}, shard {idx} ({_describe(s, idx)}) failed: {_cause(e)}") from None
                self.stats[s.name][idx] = st
                self.computed[s.name] = self.computed.get(s.name, 0) + 1
                self.progress.update(s.name, st.get("rows", 0))
                remaining[s.name] -= 1
                if remaining[s.name] == 0:
                    self._finish(s, remaining, started)
            if blocked and time.time() - last_poll[0] >= 1.0:
                last_poll[0] = time.time()
                n = len(blocked)
                poll_blocked()
                if len(blocked) < n:
                    activate_ready()
            if len(in_flight) < cap:  # room for more: start any step whose inputs just finished
                activate_ready()
        if waiting:
            raise RunError(f"steps never became ready: {', '.join(s.name for s in waiting)} (a dependency cycle?)")
        return self.stats

    def _reuse(self, s: Step) -> None:
        """A step another run computed while this one waited: its markers, as if cached."""
        self.stats[s.name] = read_markers(s.dir(self.run_dir))
        self.status[s.name] = "REUSED"
        self.progress.note(f"[{s.name}] done by another run: reused")

    def _check_lost(self) -> None:
        if self.leases is not None and self.leases.lost:
            d, rec = next(iter(self.leases.lost.items()))
            raise RunError(f"lost the lease on {fs.path(d).name} to {describe(rec)}: this run stopped renewing it for "
                           f"longer than {self.leases.ttl:.0f}s (CURATE_LEASE_SECONDS) and the other took the step over; "
                           "run again to reuse its work")

    def _activate(self, s: Step, queue: deque, remaining: dict, started: dict):
        d = s.dir(self.run_dir)
        fs.makedirs(d)
        specs = s.shards(s, self.stats)
        atomic.write_json(
            d / "step.json",
            {
                "name": s.name, "kind": s.kind, "version": s.version, "hash": s.hash,
                "config_hash": s.config_hash, "inputs_hash": s.inputs_hash,
                "config": s.config, "inputs": {i.name: i.hash for i in s.inputs},
                "shards": specs, "versions": _versions(),
            },
        )
        markers = read_markers(d)
        self.stats[s.name] = {i: m for i, m in markers.items() if i < len(specs)}
        s.meta["specs"] = specs
        todo = [i for i in range(len(specs)) if i not in self.stats[s.name]]
        remaining[s.name] = len(todo)
        started[s.name] = time.time()
        self.status[s.name] = "RUNNING"
        done_docs = sum(m.get("rows", 0) for m in self.stats[s.name].values())
        self.progress.start(s.name, len(specs), len(specs) - len(todo), done_docs)
        for i in todo:
            queue.append((s, i, specs[i]))
        if not todo:
            self._finish(s, remaining, started)

    def _finish(self, s: Step, remaining: dict, started: dict):
        d = s.dir(self.run_dir)
        atomic.clean_tmp(d)
        atomic.write_json(d / MARKERS_ALL, {str(i): m for i, m in sorted(self.stats.get(s.name, {}).items())})
        atomic.write_json(d / SUCCESS, {"shards": len(self.stats.get(s.name, {})), "finished": time.time()})
        if self.leases is not None:
            self.leases.release(self.lease_dir(s))
        remaining.pop(s.name, None)
        self.timings[s.name] = time.time() - started.get(s.name, time.time())
        self.status[s.name] = "SUCCESS"
        self.progress.finish(s.name, self.timings[s.name])


def _describe(s: Step, idx: int) -> str:
    specs = s.meta.get("specs") or []
    spec = specs[idx] if idx < len(specs) else {}
    return spec.get("describe") or f"{s.name}/{shard_name(idx)}"


def _cause(e: Exception) -> str:
    cause = getattr(e, "cause", None)
    if isinstance(cause, CurateError):
        return str(cause)
    if cause is not None:
        return f"{type(cause).__name__}: {cause}"
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
