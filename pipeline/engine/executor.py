"""The scheduling loop: run steps in dependency order, the shards of every ready step
sharing one bounded pool of Ray tasks.

Shard specs and stats are small, and the driver holds those of the steps in flight only (a
finished step's markers are read back from its index when a plan needs them:
engine/markers.py); documents never pass through the driver, except that a
small step runs in the driver's own process while no Ray is up (`inline_docs`: a step whose
largest input holds at most that many rows; Ray starts at the first larger step): a
1,000-document run or a weights-only variant then costs its work, not Ray's start and
stop, and since the task functions are the same, so are the bytes; a run whose inputs are
small runs its larger steps in local worker processes instead of Ray (engine/pool.py; where a
shard runs: engine/where.py). In-flight
tasks are bounded (`ray.wait` backpressure); Ray retries a shard lost with its worker or
node (`max_retries`), and since names are deterministic and writes atomic, a retry
produces the same bytes. Steps shared with other runs are claimed through leases
(engine/lease.py): a step another live run computes is waited for, then reused. A step is
committed by creating its `_SUCCESS` exclusively, after checking the lease is still ours; a
run's temporary files carry its lease generation's fence and its cleanup removes only those.

Example:

    Executor(store, workers=2).run([ingest, ...])
"""

from __future__ import annotations

import array
import itertools
import time
import uuid
from collections import deque
from pathlib import Path

import orjson

from pipeline.engine.lease import LeaseLost, Leases, create_exclusive, describe
from pipeline.engine.markers import RunningMarkers, SpilledSpecs, StepMarkers, pinned
from pipeline.engine.progress import Progress
from pipeline.engine.reuse import Keys, link_earlier
from pipeline.engine.step import SUCCESS, Step, committed, iter_markers, read_markers, shard_name, success
from pipeline.engine.task import versions
from pipeline.errors import CurateError, RunError
from pipeline.engine.where import Where, task_options
from pipeline.io import atomic, fs


class Executor(Where):
    """Runs steps in dependency order; the shards of every ready step share one task pool."""

    def __init__(self, store: Path, workers: int | None = None, max_retries: int = 3, progress: Progress | None = None,
                 leases: Leases | None = None, inline_docs: int = 0, input_bytes: int | None = None,
                 inline_seconds: float = 0.0, local_bytes: int = 0, first_run: bool = True):
        self.store = fs.path(store)
        self.leases = leases  # None: no other run shares these steps (no leases taken)
        self.workers = workers
        self.max_retries = max_retries
        self.progress = progress or Progress()
        self.stats: dict[str, dict[int, dict]] = {}  # step name -> shard index -> marker stats
        self.timings: dict[str, float] = {}
        self.status: dict[str, str] = {}
        self.computed: dict[str, int] = {}  # step name -> shards this run computed (the rest were cached or another run's)
        self.reused: dict[str, int] = {}  # step name -> shards linked from an earlier folder by their content key
        self.keys: Keys | None = None  # content keys of shards (engine/reuse.py), made when run() has the steps
        self._fence = uuid.uuid4().hex[:12] + "g0"  # temporary files' fence where no lease guards a step
        self.failed: dict[str, list[dict]] = {}  # step name -> [{shard, input, error}] of shards that failed for good
        self.inline_docs = inline_docs  # steps whose largest input holds at most this many rows run here (no Ray up)
        self.inline_seconds = inline_seconds  # ... and steps whose shards left to compute took at most this CPU last time
        self.input_bytes = input_bytes  # the run's input files (None: unknown), for steps that read no other step
        self.inlined: list[str] = []  # steps this run computed in its own process
        self._ray = None  # (ray, remote task, in-flight cap, largest node's MB) once Ray is up
        self.local_bytes = local_bytes  # a run whose inputs hold at most this many bytes: local processes, no Ray
        self._pool = None  # the LocalPool (engine/pool.py) of such a run
        self.pool_started: str | None = None  # when it came up (LocalPool.started), once the run is over
        self.first_run = first_run  # no earlier run of this mixture: its pool starts while the driver plans
        self.pooled: set[str] = set()  # steps with shards run there

    def lease_dir(self, s: Step):
        return self.store / "_leases" / s.dir(self.store).name

    def fence(self, s: Step) -> str:
        """The fence of this run's claim on `s`: its temporary files carry it (atomic.set_fence)."""
        if self.leases is None or str(self.lease_dir(s)) not in self.leases.held:
            return self._fence
        return self.leases.fence(self.lease_dir(s))

    def run(self, steps: list[Step]) -> dict[str, dict[int, dict]]:
        try:
            return self._run(steps)
        finally:
            self.progress.close()
            if self._pool is not None:
                self.pool_started = self._pool.started()
                self._pool.close()
                self._pool = None
            for s in steps:
                if self.status.get(s.name) != "SUCCESS":
                    if self.leases is not None:  # failed or interrupted: free what we hold for the others at once
                        self.leases.release(self.lease_dir(s))
                    if isinstance(s.meta.get("specs"), SpilledSpecs):  # its spill file (its markers stay readable)
                        s.meta["specs"].close()
                        s.meta["specs"] = None

    def _run(self, steps: list[Step]) -> dict[str, dict[int, dict]]:
        self.keys = Keys(self.store, steps, self.stats)
        for s in steps:
            markers = committed(s, self.store)
            if markers is not None:
                self.stats[s.name] = markers
                self.status[s.name] = "SKIPPED"
        todo = [s for s in steps if s.name not in self.stats]
        if not todo:
            return self.stats
        self.progress.expect({s.name: s.stage or "other" for s in todo})
        self._start_pool(todo)
        queue = _Queue()
        in_flight: dict = {}
        remaining: dict[str, int] = {}
        started: dict[str, float] = {}
        waiting = list(todo)
        last_poll = [0.0]
        blocked: dict[str, Step] = {}  # steps another live run holds the lease of: wait, then reuse or take over

        def claim(s: Step) -> bool:
            """True when this run computes `s`; False when `s` is another run's (now done, or blocked)."""
            d = s.dir(self.store)
            fs.refresh(d)
            if committed(s, self.store) is not None:  # another run finished it meanwhile
                self._reuse(s)
                return False
            if self.leases is None:
                return True
            if s.meta.get("may_be_empty") and not self._planned(s):  # no task (a merge of few files): no lease; its
                return True  # commit is one exclusive create, and two runs write the same bytes
            rec = self.leases.acquire(self.lease_dir(s))
            if rec is None:
                if committed(s, self.store) is not None:  # finished between the look and the lease
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
                if all(i.name in self.stats and i.name not in remaining and i.name not in blocked
                       and i.name not in self.failed for i in s.inputs):
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
        pool = self._pool

        def busy() -> int:  # shards in flight, on Ray or in the local pool
            return len(in_flight) + (len(pool) if pool is not None else 0)

        while queue or blocked or busy():
            self._check_lost()
            finished: list = []  # (step, shard, stats or the exception that ended it)
            while queue and busy() < self._cap():
                s, idx = queue.pop()
                spec = s.meta["specs"][idx]
                if idx in (s.meta.get("priors") or ()):  # the earlier shard of its partial key (engine/cutoff.same_as_before)
                    spec = {**spec, "prior": s.meta["priors"][idx]}
                if s.meta.get("inline"):
                    finished.append((s, idx, self._run_inline(s, idx, spec)))
                    break  # harvest it: its step may be done and others ready
                if pool is not None:
                    self.pooled.add(s.name)
                    pool.submit((s, idx), *self._args(s, idx, spec))
                    continue
                ray, remote, cap, node_mb = self._ensure_ray()
                opts = task_options(s, node_mb)
                r = remote.options(**opts) if opts else remote
                ref = r.remote(*self._args(s, idx, spec))
                in_flight[ref] = (s, idx)
            refs = list(in_flight)
            if refs:
                ray = self._ray[0]
                done, rest = ray.wait(refs, num_returns=1, timeout=0 if finished else 1.0)
                if done and rest:  # harvest every shard already finished in the same pass
                    more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
                    done += more
                for ref in done:
                    s, idx = in_flight.pop(ref)
                    try:
                        finished.append((s, idx, ray.get(ref)))
                    except Exception as e:  # noqa: BLE001 -- the others go on; the run fails once, at the end
                        finished.append((s, idx, e))
            elif pool is not None and len(pool):
                finished += [(s, idx, st) for (s, idx), st in pool.wait(0 if finished else 1.0)]
            elif not finished:  # only waiting on other runs' steps
                time.sleep(min(1.0, self.leases.ttl / 8) if self.leases else 1.0)
            for s, idx, st in finished:
                if isinstance(st, BaseException):
                    self._failed(s, idx, st)
                else:
                    self.stats[s.name][idx] = st
                    self.computed[s.name] = self.computed.get(s.name, 0) + 1
                    self.progress.update(s.name, st.get("rows", 0))
                remaining[s.name] -= 1
                if remaining[s.name] == 0:
                    if s.name in self.failed:  # its other shards are done (markers): a rerun does only these
                        remaining.pop(s.name)
                    else:
                        self._finish(s, remaining, started)
            if blocked and time.time() - last_poll[0] >= 1.0:
                last_poll[0] = time.time()
                n = len(blocked)
                poll_blocked()
                if len(blocked) < n:
                    activate_ready()
            if busy() < self._cap():  # room for more: start any step whose inputs just finished
                activate_ready()
        if self.failed:
            raise RunError(self._failure_report(waiting))
        if waiting:
            raise RunError(f"steps never became ready: {', '.join(s.name for s in waiting)} (a dependency cycle?)")
        return self.stats

    def _failed(self, s: Step, idx: int, e: Exception) -> None:
        """A shard that failed after its retries: noted, and the run goes on with every shard
        that does not need it."""
        self.status[s.name] = "FAILED"
        why = _cause(e)
        self.failed.setdefault(s.name, []).append({"shard": idx, "input": _describe(s, idx), "error": why})
        self.progress.note(f"[{s.name}] shard {idx} ({_describe(s, idx)}) failed: {why}")

    def _failure_report(self, waiting: list[Step]) -> str:
        rows = [(name, f) for name, fs_ in self.failed.items() for f in sorted(fs_, key=lambda f: f["shard"])]
        lines = [f"step {name}, shard {f['shard']} ({f['input']}) failed: {f['error']}" for name, f in rows]
        shown = lines if len(lines) <= 50 else lines[:50] + [f"... and {len(lines) - 50} more (run.json: failed_shards)"]
        skipped = f"; {len(waiting)} steps that need them did not run" if waiting else ""
        return (f"{len(lines)} shard{'s' if len(lines) > 1 else ''} failed, every other shard finished{skipped}. "
                "Fix the cause and run again: only the failed shards and what needs them run.\n  " + "\n  ".join(shown))

    def _reuse(self, s: Step) -> None:
        """A step another run computed while this one waited: its markers, as if cached."""
        s.meta.pop("plan", None)  # a plan claim() began (_planned): not needed
        self.stats[s.name] = committed(s, self.store) or read_markers(s.dir(self.store))
        self.status[s.name] = "REUSED"
        self.progress.note(f"[{s.name}] done by another run: reused")

    def _check_lost(self) -> None:
        if self.leases is not None and self.leases.lost:
            d, rec = next(iter(self.leases.lost.items()))
            raise self._lost(LeaseLost(d, rec))

    def _lost(self, e: LeaseLost) -> RunError:
        return RunError(f"lost the lease on {fs.path(e.dir).name} to {describe(e.rec)}: this run stopped renewing it "
                        f"for longer than {self.leases.ttl:.0f}s (CURATE_LEASE_SECONDS) and the other took the step "
                        "over; this run stopped without deleting or committing anything; run again to reuse its work")

    def _planned(self, s: Step) -> bool:
        """Whether `s`'s plan yields a shard; its specs are kept for _activate (planned once,
        also when the step waits on another run's lease). For steps whose plan is cheap and
        often empty (`may_be_empty`: merge steps, fuzzy dedup's heavy table), so that such a step
        costs its commit and not a lease's requests too."""
        if "plan" not in s.meta:
            with pinned():
                specs = iter(s.shards(s, self.stats))
                first = next(specs, None)
            s.meta["plan"] = None if first is None else itertools.chain([first], specs)
        return s.meta["plan"] is not None

    def _activate(self, s: Step, queue: "_Queue", remaining: dict, started: dict):
        d = s.dir(self.store)
        fs.makedirs(d)
        if success(d) is not None:
            if committed(s, self.store) is not None:  # committed by another run since claim() looked (no lease)
                self._reuse(s)
                return
            (d / SUCCESS).unlink()  # a commit whose marker index is gone (a gc stopped halfway): not done
        specs = SpilledSpecs()  # the plan's specs as it yields them, spilled: not a list of dicts in the driver
        keys: list[str] = []  # each shard's content key (engine/reuse.py), computed as the specs come
        partials: list[str | None] = []  # and its partial key (Step.read_keyed)
        head = orjson.dumps({
            "name": s.name, "kind": s.kind, "version": s.version, "hash": s.hash,
            "config_hash": s.config_hash, "inputs_hash": s.inputs_hash, "code_hash": s.code_hash, "code": s.code,
            "config": s.config, "inputs": {i.name: i.hash for i in s.inputs}, "versions": versions(),
        }, option=orjson.OPT_SORT_KEYS)

        self.keys.begin(s)

        def step_json():  # step.json streamed in the same pass: its shards last
            yield head[:-1] + b',"shards":['
            planned = s.meta.pop("plan", False)  # claim() planned it: None when it has no shard
            for k, spec in enumerate(s.shards(s, self.stats) if planned is False else planned or ()):
                data = orjson.dumps(spec)
                specs.append_json(data)
                key, partial = self.keys.both(s, k, spec)
                keys.append(key)
                partials.append(partial)
                yield (b",\n" if k else b"\n") + data
            yield b"\n]}\n"

        with pinned():  # every marker index the plan reads (and _inline_ok's inputs), read once, let go after
            atomic.write_stream(d / "step.json", step_json())
            inline = self._inline_ok(s)
        running = RunningMarkers(len(specs))  # markers as they arrive, spilled: not a dict a shard in the driver
        for i, m in iter_markers(d) if len(specs) else ():  # a resumed step's finished shards
            if i < len(specs):
                running[i] = m
        self.stats[s.name] = running
        s.meta["specs"] = specs
        s.meta["keys"], s.meta["partials"] = keys, partials
        cost = self._link_reused(s, running, keys)
        left = len(specs) - len(running)
        if not inline and cost is not None and self.inline_docs > 0 and self._no_ray() and (
                cost <= self.inline_seconds or (left == 1 and cost <= SOLO * self.inline_seconds)):
            inline = True  # the few shards an edit left to compute (or one, which Ray would not split): cheaper here
        s.meta["inline"] = inline
        if s.meta["inline"]:
            self.inlined.append(s.name)
        todo = array.array("q", (i for i in range(len(specs)) if i not in running))
        remaining[s.name] = len(todo)
        started[s.name] = time.time()
        self.status[s.name] = "RUNNING"
        done_docs = running.rows
        self.progress.start(s.name, len(specs), len(specs) - len(todo), done_docs)
        queue.add(s, todo)
        if not todo:
            self._finish(s, remaining, started)

    def _link_reused(self, s: Step, running: RunningMarkers, keys: list[str]) -> float | None:
        """Link into `s`'s folder every shard not yet done whose content key an earlier folder
        of the step holds (engine/reuse.py), and find the earlier shard of each one left to
        compute by its partial key. Returns what the shards left cost in the step's latest
        earlier folder (CPU seconds), None where that is unknown."""
        missing = [i for i in range(len(keys)) if i not in running]
        if not missing:
            return 0.0
        n, found, left = link_earlier(self.store, s, running, keys, missing, self.fence(s), s.meta.get("partials"))
        if n:
            self.reused[s.name] = n
            self.progress.note(f"[{s.name}] {n} of {len(keys)} shards reused by content from earlier runs")
        s.meta["priors"] = found.hints  # the shards linked above are not computed: their hints are never read
        return _cost(found, left)

    def _finish(self, s: Step, remaining: dict, started: dict):
        d = s.dir(self.store)
        fence = self.fence(s)
        if self.leases is not None and str(self.lease_dir(s)) in self.leases.held:
            try:  # read now: a run resumed after a pause must not commit on a lease it lost
                self.leases.check(self.lease_dir(s))
            except LeaseLost as e:
                raise self._lost(e) from None
        markers = self.stats.get(s.name, {})
        index = commit(d, s.hash, fence, markers)  # None: another holder committed the same step (same bytes)
        # the step's markers from its index from now on, read when a plan needs them: the driver
        # holds the markers of the steps in flight, not of every step of the run
        done = StepMarkers(index, len(markers)) if index is not None else committed(s, self.store)
        self.stats[s.name] = done or markers
        if done is not None and isinstance(markers, RunningMarkers):
            markers.close()
        atomic.clean_tmp(d, fence)
        if self.leases is not None:
            self.leases.release(self.lease_dir(s))
        remaining.pop(s.name, None)
        if isinstance(s.meta.get("specs"), SpilledSpecs):
            s.meta["specs"].close()
        s.meta["specs"] = None  # step.json holds them: the driver keeps specs of running steps only, not of the whole run
        if hasattr(s.meta.get("priors"), "close"):
            s.meta["priors"].close()
        s.meta["keys"] = s.meta["partials"] = s.meta["priors"] = None
        self.timings[s.name] = time.time() - started.get(s.name, time.time())
        self.status[s.name] = "SUCCESS"
        self.progress.finish(s.name, self.timings[s.name])


SOLO = 8  # a step left with one shard runs here when it took at most this many times CURATE_INLINE_SECONDS


def _cost(found, shards: list[int]) -> float | None:
    """What `shards` cost in the step's latest earlier folder; a shard it did not have (a new
    input file's) at that folder's mean. None without an earlier folder."""
    if not shards:
        return 0.0
    if found.mean is None:
        return None
    return sum(found.cost.get(i, found.mean) for i in shards)


class _Queue:
    """Shards waiting for a task slot, a step at a time: (step, its indices to run, how many
    went), not a tuple a shard."""

    def __init__(self):
        self._q: deque = deque()

    def add(self, s: Step, todo: array.array) -> None:
        if len(todo):
            self._q.append([s, todo, 0])

    def __bool__(self) -> bool:
        return bool(self._q)

    def pop(self) -> tuple[Step, int]:
        head = self._q[0]
        s, todo, k = head
        head[2] = k + 1
        if k + 1 == len(todo):
            self._q.popleft()
        return s, int(todo[k])


def commit(d, step_hash: str, fence: str, markers) -> Path | None:
    """Commit a finished step: its marker index under the fence's own name (streamed from a
    RunningMarkers' spill file), then `_SUCCESS` created exclusively and naming it; returns
    the index. None when `_SUCCESS` already exists (another holder committed first: same
    hash, same bytes; the index we wrote is removed)."""
    name = f"_markers-{fence}.json"
    if isinstance(markers, RunningMarkers):
        atomic.write_stream(d / name, markers.index_chunks())
    else:
        atomic.write_json(d / name, {str(i): m for i, m in sorted(markers.items())})
    rec = {"hash": step_hash, "fence": fence, "markers": name, "shards": len(markers), "finished": time.time()}
    if not fs.is_local(d):  # the folders its reused shards' objects are in (fs.link_all): gc keeps them with it
        froms = {t.split("/steps/")[-1].split("/", 1)[0] for i in markers for t in (markers[i].get("refs") or {}).values()}
        if froms:
            rec["refs_from"] = sorted(froms)
    if create_exclusive(d / SUCCESS, orjson.dumps(rec, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"):
        return d / name
    (d / name).unlink(missing_ok=True)
    return None


def _describe(s: Step, idx: int) -> str:
    specs = s.meta.get("specs") or []
    spec = specs[idx] if idx < len(specs) else {}
    return spec.get("describe") or f"{s.name}/{shard_name(idx)}"


def _cause(e: Exception) -> str:
    cause = getattr(e, "cause", None)  # a Ray task's error (itself also an instance of its cause's class)
    if isinstance(cause, CurateError):
        return str(cause)
    if cause is not None:
        return f"{type(cause).__name__}: {cause}"
    if isinstance(e, CurateError):  # raised in this process (a step run inline)
        return str(e)
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
