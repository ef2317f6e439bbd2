"""The store-wide lock between runs (shared) and `curate gc` (exclusive).

A run reads store steps from the moment it plans (a mix plan reads its inputs' markers) to
its last read (the published files); gc deletes the steps no run directory names. Without a
lock, gc could delete a step a starting run has planned to reuse but not yet recorded in its
run.json. The lock is two kinds of leases (engine/lease.py), so it works wherever leases
work, object stores included:

    <store>/_lock/runs/<run id>/gen-000001.json   one per run in progress, renewed
    <store>/_lock/gc/gen-00000N.json              the gc in progress, renewed

A run first writes its own entry, then looks for a live gc: if there is one, it removes its
entry and waits. gc first takes its lease, then looks for live run entries: if there are
any, it frees its lease and refuses. Each writes before it reads, so of a run and a gc that
start together at least one sees the other, and never both go on.

Example:

    runs.hold_shared(leases, store, log)   # a run, before planning; freed by leases.release_all()
    busy = hold_exclusive(leases, store)   # gc: [] when it may delete, else the live runs' records
"""

from __future__ import annotations

import time

from pipeline.engine import lease
from pipeline.engine.lease import Leases
from pipeline.io import fs

RUNS = "_lock/runs"
GC = "_lock/gc"


def hold_shared(leases: Leases, store, log=print, poll: float | None = None) -> None:
    """Hold the store for reading until `leases` are released: wait while a gc deletes."""
    store = fs.path(store)
    mine = store / RUNS / leases.run_id
    said = False
    while True:
        leases.acquire(mine)
        gc = lease.holder(store / GC)
        if gc is None:
            return
        leases.release(mine, forget=True)
        if not said:
            log(f"waiting: curate gc ({lease.describe(gc)}) is deleting unused steps of {store}")
            said = True
        time.sleep(poll if poll is not None else min(1.0, leases.ttl / 8))


def release_shared(leases: Leases, store) -> None:
    leases.release(fs.path(store) / RUNS / leases.run_id, forget=True)


def live_runs(store) -> list[dict]:
    """The records of the runs holding the store now."""
    root = fs.path(store) / RUNS
    fs.refresh(root)
    out = []
    try:
        entries = list(root.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return out
    for d in entries:
        rec = lease.holder(d)
        if rec is not None:
            out.append(rec)
        elif lease.last_record(d) is not None:  # a run killed without its release: its entry is nobody's
            fs.rmtree(d)  # (an entry with no record yet is a run creating it: left alone, it sees this gc and waits)
    return out


def hold_exclusive(leases: Leases, store) -> list[dict]:
    """Take the store for deleting: [] when taken (freed by leases.release_all()), else the
    records of who holds it (the runs in progress, or another gc)."""
    store = fs.path(store)
    other = leases.acquire(store / GC)
    if other is not None:
        return [other]
    busy = live_runs(store)
    if busy:
        leases.release(store / GC)
    return busy
