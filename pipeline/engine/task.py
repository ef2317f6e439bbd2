"""The body of one shard task: pinned threads, the call, the marker written last.

Ray runs `run_shard` once per shard; it is also callable in-process (tests, small
steps). A task function is named by its module and qualified name, so Ray ships a
string, not a pickled closure; the plan checks that the name resolves when it builds the
step (engine/step.py).
"""

from __future__ import annotations

import os
import random
import sys
import time
import traceback

from pipeline import __version__
from pipeline.engine.step import MARKERS, ShardOutput, resolve
from pipeline.errors import CurateError, RunError, TransientError
from pipeline.io import atomic, fs
from pipeline.io.faults import transient


def reset_peak_rss() -> bool:
    """Linux lets a process reset its peak RSS (VmHWM); then a marker's peak is the shard's own."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb(reset: bool) -> float:
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


ATTEMPTS = 4  # a shard's own tries on a transient fault, before Ray's retries
BACKOFF = 0.5  # seconds before the second try, doubled each time (with jitter)
def _call(fn, spec: dict, out: ShardOutput) -> dict:
    """The task, tried again with backoff on a transient fault (its writes are atomic and its
    output deterministic, so a second try writes the same bytes); then Ray's retries."""
    for attempt in range(ATTEMPTS):
        try:
            return fn(spec, out)
        except CurateError as e:
            if not isinstance(e, TransientError):
                raise
            err = e
        except Exception as e:  # noqa: BLE001 -- sorted below
            if not transient(e):  # a bug or an unexpected input: keep the traceback in a file
                tb = out.path(".txt", "_errors")
                tb.write_text(traceback.format_exc())
                raise RunError(f"{type(e).__name__}: {e} (traceback: {tb})") from None
            err = e
        if attempt + 1 < ATTEMPTS:
            time.sleep(BACKOFF * 2 ** attempt * (0.5 + random.random()))
    raise TransientError(f"{type(err).__name__}: {err} (transient; still failing after {ATTEMPTS} tries)") from None


TASK_ENV = {"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def run_shard_retrying(retries: int, *args) -> dict:
    """`run_shard` with the retries Ray gives a transient fault, for a shard run outside Ray
    (in the driver, or a small run's local worker: engine/where.py, engine/pool.py)."""
    for attempt in range(retries + 1):
        try:
            return run_shard(*args)
        except TransientError:
            if attempt == retries:
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")


def run_shard(fn: str, spec: dict, step_dir: str, index: int, writer: str | None = None, key: str | None = None,
              partial: str | None = None, env: dict[str, str] | None = None) -> dict:
    """Body of one shard task (also callable in-process): run, then write the marker.

    The marker lists the files the shard committed with their digests (`out_files`, relative
    to the step folder) and the shard's content key (`content_key`, engine/reuse.py): a shard of a
    later step keyed by those bytes is reused instead of computed again. A shard that wrote
    outside its step folder is never reused (`reusable: false`): a link of its folder
    would miss those files.

    One core per task: thread pools are pinned here, before the step's modules load (a
    Ray runtime_env would do the same but costs about 2 s at a job's first task)."""
    for k, v in TASK_ENV.items():
        os.environ.setdefault(k, v)
    for k, v in (env or {}).items():  # the driver's settings (engine/where.py driver_env), not the worker's
        if v:
            os.environ[k] = v
        else:
            os.environ.pop(k, None)
    started, cpu0 = time.time(), time.process_time()
    reset = reset_peak_rss()
    out = ShardOutput(step_dir, index)
    prev = atomic.set_fence(writer) if writer else None  # temporary names carry the writer's lease generation
    try:
        with fs.recording() as written:
            stats = _call(resolve(fn), spec, out)
    finally:
        if prev is not None:
            atomic.set_fence(prev)
    root = str(out.dir).rstrip("/") + "/"
    stats["out_files"] = {p[len(root):]: d for p, d, *_ in sorted(written) if p.startswith(root)}
    if refs := {p[len(root):]: t[0] for p, d, *t in written if t and p.startswith(root)}:
        stats["refs"] = refs  # files that are an earlier shard's objects (an object store: fs.link_all)
    if len(stats["out_files"]) < len(written):  # (a task may also say so itself)
        stats["reusable"] = False
        stats["written_elsewhere"] = sorted(p for p, *_ in written if not p.startswith(root))[:3]  # why, for the curious
    if "shuffle_bytes" not in stats and (data := [(p, d) for p, d, *_ in written if p.endswith(".data")]):
        # what a shuffle writer wrote: the merge tier splits a group past engine.merge_bytes by it (steps/merge.py)
        stats["shuffle_bytes"] = sum(_committed_size(p, d) for p, d in data)
    if key is not None:
        stats["content_key"] = key
    if partial is not None:
        stats["partial_key"] = partial
    stats["seconds"] = round(time.time() - started, 3)
    # the worker process's CPU (all its threads) during the task: its work, where wall time also
    # counts waiting on requests and on other processes sharing the cores
    stats["cpu_seconds"] = round(time.process_time() - cpu0, 3)
    stats["peak_rss_mb"] = peak_rss_mb(reset)
    stats["node"] = _node()
    if writer:
        stats["writer"] = writer  # the run and lease generation that computed this shard (steps are shared)
        prev = atomic.set_fence(writer)
    try:
        atomic.write_json(out.path(".json", MARKERS), stats)
    finally:
        if writer:
            atomic.set_fence(prev)
    return stats



def _committed_size(p: str, digest: str | None) -> int:
    """A committed file's bytes: from its object-store digest (`etag:<tag>:<size>`), else a stat."""
    if digest and digest.startswith("etag:") and digest.rsplit(":", 1)[1].isdigit():
        return int(digest.rsplit(":", 1)[1])
    q = fs.path(p)
    return os.path.getsize(q) if fs.is_local(q) else int(q.fs.size(q.path))


def versions() -> dict:
    import pyarrow
    import ray

    return {"curate": __version__, "python": sys.version.split()[0], "ray": ray.__version__, "pyarrow": pyarrow.__version__}
