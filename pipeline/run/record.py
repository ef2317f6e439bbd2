"""The run record and who owns a run directory: run.json (config, step hashes, versions,
git commits, timings, status), the lease that lets one run at a time write a run
directory, the store's list of run directories (for `curate gc`), and the links from a
run directory to the store steps it is made of."""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from pipeline.config import LoadedMixture
from pipeline.engine.executor import Executor
from pipeline.engine.lease import Leases, describe
from pipeline.engine.step import SUCCESS, Step
from pipeline.engine.task import versions
from pipeline.errors import UsageError
from pipeline.io import atomic, fs
from pipeline.plan.context import Context


@functools.lru_cache(maxsize=1)
def curate_commit() -> str | None:
    """The commit of Curate's own code when it runs from a git checkout (with `+dirty` when
    the checkout has changes to tracked files); None for an installed wheel."""
    here = Path(__file__).resolve().parents[2]  # the checkout holding pipeline/
    if not (here / ".git").exists():
        return None
    commit = git_commit(here)
    try:
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here, capture_output=True,
                               text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        dirty = ""
    return f"{commit}+dirty" if commit and dirty else commit


def git_commit(where: Path) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def check_owner(lm: LoadedMixture, run_dir: Path, overwrite: bool) -> None:
    """A run directory belongs to one mixture file: editing that file and running again is
    the normal loop, but a different file with the same `name` and `output` would mix two
    experiments' outputs in one directory, also when both files are called mixture.yaml in
    two folders. Files are told apart by their resolved path (run.json's `mixture_file`),
    except for the copy a Ray job runs (`same_mixture_file`); a run directory whose run.json
    has no `mixture_file` belongs to no file yet."""
    try:
        prev = atomic.read_json(run_dir / "run.json").get("mixture_file")
    except (FileNotFoundError, ValueError):
        return
    mine = str(lm.path.resolve())
    if prev and not same_mixture_file(prev, mine) and not overwrite:
        moved = (f" (a {Path(mine).name} in another folder is another mixture file; if you moved this one, "
                 "--overwrite takes the directory over once)" if Path(prev).name == Path(mine).name else "")
        raise UsageError(
            f"{run_dir} holds a run of another mixture file ({prev}), not {mine}; give this one its own "
            "`name` or `output` (or --output DIR), or pass --overwrite to take the directory over "
            f"(cached steps whose hashes match are reused; the mixture, ledger and samples are replaced){moved}"
        )


_RAY_JOB = re.compile(r"/working_dir_files/[^/]+/(.+)$")  # <ray temp>/.../working_dir_files/_ray_pkg_<hash>/<path>


def same_mixture_file(prev: str, mine: str) -> bool:
    """Whether two resolved paths are one mixture file. A Ray job runs a copy of the YAML in
    Ray's copy of the working directory, a new folder whenever the code changes; such a copy
    is the file at its path inside the working directory: the same as another job's copy at
    that path, or as a file outside a job whose path ends with it (the checkout submitted)."""
    if prev == mine:
        return True
    a, b = _RAY_JOB.search(prev), _RAY_JOB.search(mine)
    if a and b:
        return a.group(1) == b.group(1)
    if a or b:
        rel, full = (a.group(1), mine) if a else (b.group(1), prev)
        return full.endswith("/" + rel)
    return False


def claim_run_dir(leases: Leases, run_dir: Path, store) -> None:
    """One run at a time writes a run directory (its mixture, ledger, samples): a second
    refuses at once rather than waiting, since it would only redo the same work. The store
    also records which run directories use it, for `curate gc`."""
    rec = leases.acquire(fs.path(run_dir) / "_lease")
    if rec is not None:
        raise UsageError(
            f"{run_dir} is in use: {describe(rec)} is writing it. Wait for that run to finish (then this one "
            "reuses every step it made), or give this file another `name` or --output to run a variant beside it "
            f"(a run killed without cleanup frees the directory after {leases.ttl:.0f}s, CURATE_LEASE_SECONDS)")
    key = hashlib.sha1(str(run_dir).encode()).hexdigest()[:16]
    reg = fs.path(store) / "_runs" / f"{key}.json"
    if not reg.exists():
        atomic.write_json(reg, {"run_dir": str(run_dir)})


def step_record(ctx: Context, s: Step, status: str) -> dict:
    """A step's entry in run.json; `dir` as the run directory names it (Context.step_ref).
    The next plan compares its hashes, and its `code`, to say why a step runs again."""
    return {"hash": s.hash, "config_hash": s.config_hash, "inputs_hash": s.inputs_hash, "code_hash": s.code_hash,
            "code": s.code, "dir": ctx.step_ref(s), "status": status,
            **({"engine": s.meta["engine"]} if s.meta.get("engine") else {})}


def link_steps(ctx: Context, run_dir: Path) -> None:
    """`<run>/steps/<name>-<hash>`: a relative symlink to each store step the run uses, so
    a run directory shows (and `du -L` counts) what it is made of. Local disks only."""
    if ctx.store == run_dir or not (fs.is_local(run_dir) and fs.is_local(ctx.store)):
        return
    links = Path(run_dir) / "steps"
    links.mkdir(parents=True, exist_ok=True)
    wanted = {s.dir(ctx.store).name: s.dir(ctx.store) for s in ctx.steps}
    for p in links.iterdir():  # links of steps this run no longer uses
        if p.is_symlink() and p.name not in wanted:
            p.unlink()
    for name, target in wanted.items():
        link = links / name
        rel = os.path.relpath(target, links)
        if link.is_symlink() and os.readlink(link) == rel:
            continue
        if link.is_symlink():
            link.unlink()
        elif link.exists():  # a pre-store step directory _adopt_legacy_steps did not move: the store's copy wins
            shutil.rmtree(link)
        link.symlink_to(rel, target_is_directory=True)  # resolves once the executor makes the step


def adopt_legacy_steps(ctx: Context, run_dir: Path) -> None:
    """Run directories from before the store kept their steps inside: move each finished
    one the store lacks into the store (a rename), so an upgrade recomputes nothing."""
    if ctx.store == run_dir or not (fs.is_local(run_dir) and fs.is_local(ctx.store)):
        return
    legacy = Path(run_dir) / "steps"
    if not legacy.is_dir():
        return
    for s in ctx.steps:
        old, new = legacy / s.dir(ctx.store).name, s.dir(ctx.store)
        if old.is_dir() and not old.is_symlink() and (old / SUCCESS).exists() and not Path(new).exists():
            Path(new).parent.mkdir(parents=True, exist_ok=True)
            try:
                os.replace(old, new)
            except OSError:  # another filesystem: leave it, the step runs again in the store
                pass


def finish_record(record: dict, ctx: Context, run_dir: Path, ex: Executor, t0: float):
    for s in ctx.steps:
        r = record["steps"][s.name]
        r["status"] = ex.status.get(s.name, r["status"])
        r["shards"] = len(ex.stats.get(s.name, {}))
        r["computed"] = ex.computed.get(s.name, 0)
        r["reused"] = ex.reused.get(s.name, 0)  # shards linked from an earlier folder by their content (engine/reuse.py)
        if s.name in ex.inlined:
            r["where"] = "inline"  # in the run's own process (a small step while no Ray was up)
        elif s.name in ex.pooled:
            r["where"] = "local"  # in the local worker processes of a small run (engine/pool.py)
        if s.name in ex.timings:
            r["seconds"] = round(ex.timings[s.name], 3)
    record["executor"] = ex.backend  # engine/pool.py: a small run starts no Ray
    if ex.pool_started is not None:  # a rerun's pool comes up at its first task, if it has one (engine/where.py)
        record["local_pool_started"] = ex.pool_started
    record["versions"] = versions()
    record["finished"] = time.time()
    record["seconds"] = round(record["finished"] - t0, 3)
    atomic.write_json(run_dir / "run.json", record)
