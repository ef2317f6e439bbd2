"""`curate gc [OUTPUT] [--store S] [--dry-run]`: free the store steps no run directory uses.

Variants share one step store (pipeline/run/runner.py), so deleting a run directory frees
nothing by itself: its steps may be another run's too. A store step is in use when a run
directory's run.json names it or when a live run holds its lease (pipeline/engine/lease.py).
gc holds the store's lock exclusively from its plan to its last deletion, and every run
holds it shared from its plan to its last read (pipeline/engine/storelock.py): gc refuses
while a run is in progress, and a run that starts while gc deletes waits for it.

On an object store a step whose shards were reused from an earlier folder names that folder
in its commit (`refs_from`: its files are the earlier objects, not copies); gc keeps it as
long as a kept step refers to it. A step is deleted commit first: `_SUCCESS`, then its marker index, then its shard markers,
then its data. A gc stopped at any point leaves a step that is not done, whose remaining
markers each still have their data: the next run that needs it resumes it. The run directories are those in OUTPUT and those the store's registry
(`<store>/_runs/`) names, so a store shared by several output folders is safe. Everything
else under `<store>/steps/` is deleted, with its size printed; `--dry-run` only lists.
"""

from __future__ import annotations

from pipeline.engine import lease, storelock
from pipeline.engine.lease import Leases
from pipeline.engine.step import MARKERS, SUCCESS, success
from pipeline.errors import RunError, UsageError
from pipeline.io import atomic, fs


def _size(p) -> int:
    p = fs.path(p)
    if fs.is_local(p):
        import os

        total = 0
        for root, _dirs, files in os.walk(p):
            for f in files:
                try:
                    total += os.lstat(os.path.join(root, f)).st_size
                except OSError:
                    pass
        return total
    return int(p.fs.du(p.path, total=True))


def _key(d) -> str:
    """One name per directory: `out/demo` and the registry's `/abs/out/demo` are the same run."""
    return str(d.resolve()) if fs.is_local(d) else str(d)


def _run_dirs(output, store) -> tuple[list, list]:
    """(run directories with a run.json, registry entries whose run directory is gone)."""
    seen, gone = {}, []
    root = fs.path(output)
    if root.exists():
        for d in root.iterdir():
            if not d.name.startswith(("_", ".")) and (d / "run.json").exists():
                seen[_key(d)] = d
    reg = fs.path(store) / "_runs"
    if reg.exists():
        for f in sorted(reg.glob("*.json")):
            d = fs.path(atomic.read_json(f)["run_dir"])
            if (d / "run.json").exists():
                seen.setdefault(_key(d), d)
            else:
                gone.append(f)
    return list(seen.values()), gone


def _runs(n: int) -> str:
    return f"{n} run director{'y' if n == 1 else 'ies'}"


def plan(output, store=None) -> dict:
    store = fs.path(store) if store else fs.path(output) / "_store"
    steps_root = store / "steps"
    if not steps_root.exists():
        raise UsageError(f"{steps_root}: no step store here; give the folder your runs are in (e.g. out), or --store")
    runs, gone = _run_dirs(output, store)
    used: dict[str, list[str]] = {}
    for d in runs:
        for st in atomic.read_json(d / "run.json").get("steps", {}).values():
            used.setdefault(st["dir"].rstrip("/").rsplit("/", 1)[-1], []).append(d.name)
    # on an object store a kept step's reused shards are an earlier step's objects (its markers' refs): the
    # folders they are in are kept too, as their commits name them (`refs_from`), whatever refers to them
    todo = list(used)
    while todo:
        rec = success(steps_root / todo.pop()) or {}
        for f in rec.get("refs_from") or []:
            if f not in used:
                used[f] = ["(referred to)"]
                todo.append(f)
    delete, kept, leased = [], [], []
    for step in sorted(steps_root.iterdir(), key=lambda p: p.name):
        if step.name in used:
            kept.append(step)
        elif lease.holder(store / "_leases" / step.name) is not None:
            leased.append(step)  # a run is computing it right now
        else:
            delete.append((step, _size(step)))
    return {"store": store, "runs": runs, "gone": gone, "delete": delete, "kept": kept, "leased": leased}


def delete_step(step) -> None:
    """Delete a store step so that every prefix of the deletion leaves it incomplete, never
    done and empty: the commit, the marker index, the shard markers, then the data."""
    step = fs.path(step)
    (step / SUCCESS).unlink(missing_ok=True)
    for p in step.glob("_markers*.json"):
        p.unlink(missing_ok=True)
    fs.rmtree(step / MARKERS)
    fs.rmtree(step)


def collect(output, store=None, dry_run: bool = False) -> tuple[dict, list[str]]:
    store_dir = fs.path(store) if store else fs.path(output) / "_store"
    leases = None
    if not dry_run and (store_dir / "steps").exists():
        leases = Leases(name="gc")
        busy = storelock.hold_exclusive(leases, store_dir)
        if busy:
            leases.release_all()
            raise UsageError("curate gc: the store " + str(store_dir) + " is in use by "
                             + "; ".join(lease.describe(r) for r in busy)
                             + ". Run gc again when that finishes (a run killed without cleanup frees the store after "
                             + f"{leases.ttl:.0f}s, CURATE_LEASE_SECONDS)")
    try:
        return _collect(output, store, dry_run, guard=(lambda: _still_ours(leases, store_dir)) if leases else None)
    finally:
        if leases is not None:
            leases.release_all()


def _still_ours(leases: Leases, store_dir) -> None:
    """Before each deletion: gc still holds the store alone. Its lease not taken over, and no
    gap past the ttl in its renewals: a gc paused past its lease (Ctrl-Z, a stalled machine)
    may have let a run see the lease expire and reuse a step gc had listed, so it stops there
    and deletes nothing more (what it planned is stale)."""
    try:
        leases.check(store_dir / storelock.GC)
    except lease.LeaseLost as e:
        raise RunError(f"curate gc: stopped: it lost the store's lease to {lease.describe(e.rec)} while paused past "
                       f"{leases.ttl:.0f}s (CURATE_LEASE_SECONDS); the steps not yet deleted are kept. "
                       "Run gc again") from None
    if leases.lapsed():
        raise RunError(f"curate gc: stopped: it went {leases.ttl:.0f}s (CURATE_LEASE_SECONDS) without renewing its "
                       "lease on the store (paused?), so a run may have started using steps it had listed; the steps "
                       "not yet deleted are kept. Run gc again")


def _collect(output, store, dry_run: bool, guard=None) -> tuple[dict, list[str]]:
    p = plan(output, store)
    verb = "would delete" if dry_run else "deleted"
    lines = []
    for step, size in p["delete"]:
        if not dry_run:
            if guard is not None:
                guard()
            delete_step(step)
            fs.rmtree(p["store"] / "_leases" / step.name)
        lines.append(f"{verb}  {step.name:<44} {size / 1e6:>10.1f} MB")
    for step in p["leased"]:
        lines.append(f"kept          {step.name:<44} (a live run holds its lease)")
    if not dry_run:
        for f in p["gone"]:
            fs.path(f).unlink()
    freed = sum(s for _, s in p["delete"])
    lines.append(f"{len(p['delete'])} steps, {freed / 1e6:,.1f} MB {'to free' if dry_run else 'freed'}; "
                 f"{len(p['kept'])} steps kept for {_runs(len(p['runs']))}"
                 + (f", {len(p['leased'])} in use by a live run" if p["leased"] else "")
                 + (f"; forgot {_runs(len(p['gone']))} deleted since" if p["gone"] and not dry_run else ""))
    p["freed"] = freed
    return p, lines
