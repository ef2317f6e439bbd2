"""`curate run`: a mixture YAML to a run directory.

    plan      run/graph.py: every stage's steps, no Ray (the same plan `curate plan` prints)
    run       engine/executor.py: the steps in dependency order, cached ones skipped, shared
              ones waited for (leases), one Ray task per shard
    assemble  run/outputs.py: ledger.json; each stage's publication (mixture/, quarantine/,
              validation/, samples/) and manifest.json; run.json (run/record.py); report.html
    publish   the `publish:` section: a dataset folder with its card (views/publish.py); not
              when an input file was cut (ledger conservation "unknown": the run finishes,
              its summary says which files, `curate publish --allow-unknown-loss` publishes it)

Each step hashes only what changes its output, so an edit re-runs what it touches: a
filter threshold re-runs that source's filter step and what reads it; `mixture.shard_rows`
re-runs only the mix.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from pipeline import __version__
from pipeline.config import LoadedMixture
from pipeline.engine.executor import Executor
from pipeline.engine import storelock
from pipeline.engine.lease import Leases
from pipeline.engine.progress import Progress
from pipeline.engine.pool import local_bytes
from pipeline.errors import RunError, env_int
from pipeline.io import atomic, fs, redact
from pipeline.run import graph, outputs
from pipeline.run import record as record_mod
from pipeline.run.dryrun import previous_steps, status
from pipeline.run.record import check_owner
from pipeline.shards import ledger
from pipeline.views import report

__all__ = ["check_owner", "run"]

INLINE_DOCS = 5_000  # a step whose largest input holds at most this many rows runs in curate's own process


def inline_docs() -> int:
    """CURATE_INLINE_DOCS, or the default: steps that small run without Ray (0: always Ray)."""
    return env_int("CURATE_INLINE_DOCS", INLINE_DOCS, "a number of documents (0: every step on Ray)", least=0)


INLINE_SECONDS = 4  # ... and a step whose shards left to compute took at most this CPU last time (engine/reuse.py)


def inline_seconds() -> int:
    """CURATE_INLINE_SECONDS, or the default: a step an edit left a few shards of (their CPU
    seconds in its earlier folder) runs without Ray, which costs about 3 CPU-s to start."""
    return env_int("CURATE_INLINE_SECONDS", INLINE_SECONDS, "a number of CPU seconds (0: never for this reason)", least=0)


def _input_bytes(ctx) -> int | None:
    """The run's input files' bytes; None when a size is unknown (a dataset folder, a store
    that gave none)."""
    sizes = [f.size for fl in ctx.files.values() for f in fl]
    return None if any(not s for s in sizes) else sum(sizes)


def run(lm: LoadedMixture, workers: int | None = None, output: str | None = None, log=print, quiet: bool = False,
        overwrite: bool = False, stages: list | None = None, mode: str | None = None) -> Path:
    """Plan, run every step (cached ones are skipped), assemble and publish; returns the run
    directory. `stages`: another stage list than graph.STAGES (a stage being written)."""
    run_dir = lm.output_dir(output)
    store = lm.store_dir(output)
    check_owner(lm, run_dir, overwrite)
    leases = Leases(name=lm.mixture.name)
    try:
        return _run(lm, run_dir, store, leases, workers, log, quiet, stages, mode)
    finally:
        storelock.release_shared(leases, store)
        leases.release_all()


def plan_lines(ctx, store, prev, log, verbose: bool) -> None:
    """The plan before a run: a line a step with `verbose` (its action and why), else a line
    a stage (its steps to run and cached); `curate plan` prints the full table."""
    per: dict[str, list[int]] = {}  # stage -> [steps to run, cached], in the order stages plan
    for s in ctx.steps:
        action, why = status(s, store, prev, ctx.engine_env)
        if verbose:
            log(f"{s.name:<24} {action:<5} {why}")
        per.setdefault(s.stage or "other", [0, 0])[0 if action == "run" else 1] += 1
    if not verbose:
        order = list(per)
        log("plan: " + ", ".join(f"{x} {per[x][0]} to run" + (f" ({per[x][1]} cached)" if per[x][1] else "")
                                 for x in order if per[x][0]) +
            (f"; cached: {', '.join(x for x in order if not per[x][0])}" if any(not per[x][0] for x in order) else ""))


def _run(lm: LoadedMixture, run_dir: Path, store, leases: Leases, workers, log, quiet, stages=None, mode=None) -> Path:
    record_mod.claim_run_dir(leases, run_dir, store)
    storelock.hold_shared(leases, store, log)  # until the last read: gc deletes nothing this run plans to read
    ctx = graph.build(lm, run_dir, store, stages)
    prev = previous_steps(run_dir)
    fs.makedirs(run_dir)
    record_mod.adopt_legacy_steps(ctx, run_dir)
    t0 = time.time()
    record = {
        "name": lm.mixture.name, "status": "RUNNING", "mixture_file": str(lm.path.resolve()),
        "config": redact.portable_secrets(lm.canonical()), "config_hash": lm.config_hash(), "workers": workers,
        "ray_address": redact.secrets(os.environ["RAY_ADDRESS"]) if os.environ.get("RAY_ADDRESS") else None,
        "host": socket.gethostname(),
        "git_commit": record_mod.git_commit(lm.base_dir), "curate_version": __version__, "started": t0,
        "curate_commit": record_mod.curate_commit(),
        "store": redact.secrets(str(store)), "run_id": leases.run_id,
        "steps": {s.name: record_mod.step_record(ctx, s, "PENDING") for s in ctx.steps},
        "layers": ctx.layer_stages(), "roles": ctx.roles(),  # which step is what, for the views of a finished run
        "engine": ctx.engine.model_dump(), "engine_from_env": ctx.engine_env,  # how steps were laid out (config/engine.py)
        "inputs_verify": lm.mixture.inputs.verify,  # how input files were known unchanged (steps/ingest/verify.py)
        "mix_sources": ctx.mix.select.config.get("sources") if ctx.mix and ctx.mix.select else None,
    }
    record_mod.link_steps(ctx, run_dir)
    mode = mode or ("quiet" if quiet else "verbose")
    plan_lines(ctx, store, prev, log, verbose=mode == "verbose")
    atomic.write_json(run_dir / "run.json", record)
    ex = Executor(store, workers=workers, progress=Progress(mode=mode), leases=leases,
                  inline_docs=inline_docs(), input_bytes=_input_bytes(ctx), inline_seconds=inline_seconds(),
                  local_bytes=local_bytes(), first_run=not prev)
    try:
        stats = ex.run(ctx.steps)
    except BaseException as e:
        record["status"] = "FAILED" if not isinstance(e, KeyboardInterrupt) else "INTERRUPTED"
        record["error"] = str(e)
        if ex.failed:  # every shard that failed for good, with its input and error: the rerun computes these
            record["failed_shards"] = ex.failed
        record_mod.finish_record(record, ctx, run_dir, ex, t0)
        raise
    led = outputs.ledger_of(ctx, stats)
    atomic.write_json(run_dir / "ledger.json", led)
    atomic.write_json(run_dir / "manifest.json", graph.publish(ctx, stats))
    bad = ledger.imbalance(led)
    record["status"] = "FAILED" if bad else "SUCCESS"
    if bad:
        record["error"] = "conservation check failed"
    record_mod.finish_record(record, ctx, run_dir, ex, t0)
    report.write(run_dir, ctx.stages)
    if bad:
        raise RunError("conservation check failed, documents are unaccounted for:\n  " + "\n  ".join(bad)
                       + f"\nsee {run_dir / 'ledger.json'}")
    if lm.mixture.publish is not None:
        from pipeline.views import publish

        if ledger.unread_files(led):  # the run is kept; `curate publish --allow-unknown-loss` publishes it
            log(f"not published: {publish.unknown_loss_refusal(run_dir, led)}")
            return run_dir
        out = publish.publish(run_dir, lm.publish_dir())  # its license, name, tags: the run's publish section
        log(f"published: {out} (dataset card: {out / 'README.md'})")
    return run_dir
