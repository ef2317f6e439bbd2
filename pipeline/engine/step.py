"""Steps and their on-disk state: the content hash, shard names, markers, status.

A `Step` is a pure function of (its config, its code, its inputs). Its output directory
is `steps/<name>-<hash16>/`, where the hash covers the step's kind and config, its code
(the task's version and what the plan puts in `code`: the filter types' and classifier
families' versions, the versions of the libraries whose output it stores, the digests of
the user's functions it calls: pipeline/plan/code.py) and the hashes of the steps it reads
(never the task's module path: moving code re-runs nothing). The directory holds:

    step.json              resolved config, code, input hashes, shard specs, versions
    part-00000.parquet     data, written to a temporary name and renamed into place
    _markers/part-00000.json   the shard's stats, written last: "this shard is done"
    _markers-<fence>.json  every shard's marker in one file, written by the run that commits
    _SUCCESS               the commit, created exclusively: {"hash", "fence", "markers", "shards"}

A rerun skips a step whose `_SUCCESS` names this step's full hash and whose marker index
holds every shard (a folder of another step, or one a gc left half deleted, is never read as
done, let alone as empty) and, inside an unfinished step, every shard with a marker; a config
or code edit changes the hash, so only the steps it touches (and those
downstream) run again.

Example:

    ingest = Step("ingest-web", "ingest", {"files": [...]}, [], documents.run_shard,
                  shards=lambda step, stats: [...])
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from pipeline.engine.markers import StepMarkers, read_index
from pipeline.errors import RunError
from pipeline.io import atomic, fs

MARKERS = "_markers"
MARKERS_ALL = "_markers.json"  # every shard's marker in one file (steps committed before fencing)
SUCCESS = "_SUCCESS"
HASH_CHARS = 16  # of the sha256 in a step folder's name: see Step.dir for the collision bound


def shard_name(index: int) -> str:
    return f"part-{index:05d}"


def hash_json(obj: Any) -> str:
    """sha256 of the canonical JSON of `obj` (sorted keys): what step and config hashes are made of."""
    return hashlib.sha256(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)).hexdigest()


def task(version: str) -> Callable[[Callable], Callable]:
    """Mark a shard task with the version of its code, beside the code it versions: bump it
    when the task's output changes for the same inputs (it enters the step's hash).

        @task(version="2")  # 2: one key file per cell
        def priority_shard(spec: dict, out: ShardOutput) -> dict: ...

    Bump it too when the shard specs its plan builds change meaning. A task without it is
    version "1"."""
    def mark(fn: Callable) -> Callable:
        fn.version = version
        return fn
    return mark


def task_name(fn: Callable) -> str:
    """`module:qualname` of a task, checked to resolve back to the same function (a worker
    imports it by this name); a lambda, a closure or a nested function is refused here, when
    the plan is built, instead of failing in a worker."""
    name = f"{fn.__module__}:{fn.__qualname__}"
    try:
        found = resolve(name)
    except (ImportError, AttributeError):
        found = None
    if found is not fn:
        raise TypeError(f"task {name} is not a module-level function a worker can import by name; "
                        "define it at the top level of its module")
    return name


def resolve(name: str) -> Callable:
    """The function a `module:qualname` task name denotes."""
    mod, _, qual = name.partition(":")
    obj: Any = importlib.import_module(mod)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def task_version(fn: Callable) -> str:
    return getattr(fn, "version", "1")


def _outside_digest(fn: Callable) -> str | None:
    """sha256 of the file defining `fn` when it is not Curate's own code (a plugin stage's task,
    docs/extending.md): its `@task(version=...)` is the author's promise, its bytes are the proof."""
    mod = getattr(fn, "__module__", "") or ""
    if mod.split(".")[0] in ("pipeline", "filters"):
        return None
    path = getattr(sys.modules.get(mod), "__file__", None)
    return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path and Path(path).is_file() else None


@dataclass
class Step:
    """One hashed, resumable unit of work: a task run once per shard.

    `fn(spec, out: ShardOutput) -> stats` is a module-level function (its name is checked
    when the step is built); `shards(step, stats)` lists the shard specs once the inputs
    are done (`stats`: step name -> shard index -> marker). A marker's "rows" is the
    documents the shard processed (progress counts it)."""

    name: str  # unique in a run, e.g. "ingest-web"
    kind: str  # ingest | filter | mix ...
    config: dict  # everything that changes the output, JSON-able
    inputs: list[Step]
    fn: Callable[..., dict]  # the shard task
    shards: Callable[[Step, dict], list[dict]]  # (step, stats of finished steps), called once inputs are done
    cpus: float = 1  # CPU slots a task takes (0 for a coordinator that waits on tasks of its own)
    memory_mb: int | None = None  # memory a task may hold, declared to Ray so it packs no more per node (not hashed)
    gpus: float = 0  # GPUs a task takes (Ray's num_gpus; not hashed)
    stage: str = ""  # the stage it shows under in progress and `curate plan` (its stage's label; not hashed)
    code: dict = field(default_factory=dict)  # what of the code decides the output beside the task (plan/code.py)
    meta: dict = field(default_factory=dict)  # not hashed: the shard specs once listed, for error messages
    # config keys left out of its shards' content keys (engine/reuse.py), because each shard's spec
    # carries its own part of them: ingest's `files` (a new input file changes the step, not the others' shards)
    shard_free: tuple[str, ...] = ()
    # its task's bytes depend neither on its shard number nor on a document shard's place `k` in the
    # run's global order (files it names by the shard number are renamed when linked): its shards'
    # keys leave both out, so a source that grows by a file leaves the later sources' shards reused
    position_free: bool = False
    # spec keys (at its top, or in the document shard it carries) whose store files its task
    # digests itself, only the part it reads (engine/reuse.py, cutoff by what a task reads): the
    # shard's partial key leaves them out, and a shard whose task read the same as an earlier
    # one of the same partial key links that one's files instead of computing
    read_keyed: tuple[str, ...] = ()
    # heavy modules its task imports on first use (not hashed): a run's local worker processes
    # import them once, in the process they are forked from (engine/pool.py), not once a worker
    preload: tuple[str, ...] = ()

    def __post_init__(self):
        self.task = task_name(self.fn)  # what a worker imports; the hash never includes it
        self.version = task_version(self.fn)  # the task's code version, in the hash
        self.code = {"task": self.version, **self.code}  # what code_hash covers (step.json and run.json record it)
        if (digest := _outside_digest(self.fn)) is not None:  # a plugin's task: an edit of its file re-runs it
            self.code["source"] = digest

    # computed once: a step's config, code and inputs do not change after the plan builds it
    @functools.cached_property
    def config_hash(self) -> str:
        return hash_json({"kind": self.kind, "config": self.config})

    @functools.cached_property
    def shard_config_hash(self) -> str:
        """What of the config enters each shard's content key (all of it but `shard_free`)."""
        if not self.shard_free:
            return self.config_hash
        return hash_json({"kind": self.kind, "config": {k: v for k, v in self.config.items() if k not in self.shard_free}})

    @functools.cached_property
    def code_hash(self) -> str:
        return hash_json(self.code)

    @functools.cached_property
    def inputs_hash(self) -> str:
        return hash_json(sorted(i.hash for i in self.inputs))

    @functools.cached_property
    def hash(self) -> str:
        return hash_json([self.config_hash, self.inputs_hash, self.code_hash])

    def dir(self, store: Path) -> Path:
        """`<store>/steps/<name>-<hash16>`: where this step's output is in a step store.

        16 hex digits are 64 bits: among n variants of one step the chance that two share a
        folder is below n^2 / 2^65 (5e-10 for a sweep of 10^5 variants), and even then the
        full hash in `_SUCCESS` is compared before a folder is reused (committed())."""
        return store / "steps" / f"{self.name}-{self.hash[:HASH_CHARS]}"


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


class StoreError(RunError):
    """A store folder that holds something other than the step that names it."""


def success(step_dir: Path) -> dict | None:
    """The commit record of a step folder (`_SUCCESS`), or None when it has none."""
    try:
        rec = atomic.read_json(step_dir / SUCCESS)
    except FileNotFoundError:
        return None
    except ValueError:  # an empty or cut file: not a commit
        return None
    return rec if isinstance(rec, dict) else None


def committed(step: Step, store: Path) -> Mapping[int, dict] | None:
    """The markers of `step` when its folder holds it finished, else None (not finished, or
    partly deleted: then it runs again, resuming from the shard markers that remain). They
    are a StepMarkers, read from the marker index when first used: checking that a step is
    done costs the `_SUCCESS` read and a look for its index, whatever its number of shards.

    The full hash is compared, not only the folder's prefix: a folder holding another
    step is an error, never reused."""
    d = step.dir(store)
    rec = success(d)
    if rec is None:
        return None
    found = rec.get("hash")
    if found is None:  # committed before _SUCCESS named its hash
        try:
            found = atomic.read_json(d / "step.json").get("hash")
        except (FileNotFoundError, ValueError):
            return None
    if found != step.hash:
        raise StoreError(f"{d} holds another step (hash {found[:16]}..., this plan's is {step.hash[:16]}...): two "
                         "hashes share the folder's prefix, or the folder was copied in by hand; move it away (or run "
                         "`curate gc`) and run again")
    if isinstance(rec.get("shards"), int) and rec.get("markers"):  # read when a plan needs them (engine/markers.py)
        index = d / rec["markers"]
        return StepMarkers(index, rec["shards"]) if index.exists() else None  # gone: a gc stopped halfway, not done
    try:
        markers = _marker_index(d, rec)
    except (FileNotFoundError, ValueError):
        return None  # the index is gone (a gc stopped halfway): not done
    return markers if len(markers) == rec.get("shards", len(markers)) else None


def _marker_index(d: Path, rec: dict) -> Mapping[int, dict]:
    """A committed step's marker index: a marker a line into a local spill past
    markers.WHOLE shards (engine/markers.read_index), so a reader that goes through the
    markers once (the report, explain) holds a few bytes a shard, not every marker."""
    if isinstance(rec.get("shards"), int) and rec.get("markers"):
        got = read_index(d / rec["markers"], rec["shards"])
        if len(got) != rec["shards"]:
            raise ValueError(f"{d}: {len(got)} markers where _SUCCESS says {rec['shards']}")
        return got
    return {int(k): v for k, v in atomic.read_json(d / rec.get("markers", MARKERS_ALL)).items()}


def read_markers(step_dir: Path) -> Mapping[int, dict]:
    """Every shard's marker: from the index a committed step keeps (one read after the
    commit's), else one file per shard (a step in progress)."""
    rec = success(step_dir)
    if rec is not None:
        try:
            return _marker_index(step_dir, rec)
        except (FileNotFoundError, ValueError):
            pass
    return dict(iter_markers(step_dir))


def iter_markers(step_dir: Path):
    """(shard, marker) of a step in progress, from its per-shard marker files, read a batch
    at a time (a resume does not hold them all at once)."""
    mdir = step_dir / MARKERS
    if not mdir.is_dir():
        return
    # one listing, kept as shard numbers (8 bytes a shard, not a path object), then the reads: on an object
    # store many at a time (a resume waits on each GET), a batch at a time
    if fs.is_local(mdir):  # scandir streams the entries (a glob lists the whole folder as objects first)
        with os.scandir(mdir) as it:
            names = (e.name for e in it)
            done = np.sort(np.fromiter((int(n[5:-5]) for n in names if n.startswith("part-") and n.endswith(".json")
                                        and n[5:-5].isdigit()), np.int64))
    else:
        done = np.sort(np.fromiter((int(p.stem.split("-")[1]) for p in mdir.glob("part-*.json")), np.int64))
    for lo in range(0, len(done), 1024):
        shards = [int(i) for i in done[lo:lo + 1024]]
        batch = [mdir / f"{shard_name(i)}.json" for i in shards]
        read = map(atomic.read_json, batch) if fs.is_local(mdir) else fs.read_many(atomic.read_json, batch)
        yield from zip(shards, read)


def shard_marker(step_dir, index: int) -> dict:
    """One finished shard's stats (its marker), for a task that needs a few of another
    step's (where the ids of a source repeat, the unique-ids task names their files)."""
    return atomic.read_json(fs.path(step_dir) / MARKERS / f"{shard_name(index)}.json")


def step_status(step: Step, store: Path, previous: dict | None) -> tuple[str, str]:
    """('run' | 'skip', why) for the plan: done, resume, new, config, code or inputs changed
    (`previous`: the last run's run.json steps)."""
    d = step.dir(store)
    if committed(step, store) is not None:
        return "skip", "done"
    if (d / "step.json").exists():
        n = len(list((d / MARKERS).glob("*.json"))) if (d / MARKERS).is_dir() else 0
        return "run", f"resume ({n} shards done)"
    prev = (previous or {}).get(step.name)
    if prev is None:
        return "run", "new"
    if "code_hash" not in prev:  # hashed without code (config_hash held the task's version)
        return "run", "code changed (the last run was planned by an older Curate)"
    if prev.get("config_hash") != step.config_hash:
        return "run", "config changed"
    if prev["code_hash"] != step.code_hash:
        return "run", "code changed" + code_changes(prev.get("code") or {}, step.code)
    if prev.get("inputs_hash") != step.inputs_hash:
        return "run", "inputs changed"
    return "run", "output missing"


def code_changes(old: dict, new: dict, most: int = 3) -> str:
    """What differs between two steps' `code` records, for the plan: ": filters.gopher_quality
    2 -> 3, libraries.ftfy 6.2.0 -> 6.3.1" (a user function: "edited")."""
    def flat(code: dict) -> dict:
        return {f"{k}.{n}" if isinstance(v, dict) else k: w for k, v in code.items()
                for n, w in (v.items() if isinstance(v, dict) else [(None, v)])}

    def shown(code: dict, k: str) -> str:
        return "-" if k not in code else "none" if code[k] is None else str(code[k])  # none: a library not installed

    a, b = flat(old), flat(new)
    diffs = [f"{k} edited" if k.startswith("callables.") and k in a and k in b else f"{k} {shown(a, k)} -> {shown(b, k)}"
             for k in sorted(a.keys() | b.keys()) if a.get(k, ...) != b.get(k, ...)]
    more = f", {len(diffs) - most} more" if len(diffs) > most else ""
    return f": {', '.join(diffs[:most])}{more}" if diffs else ""
