"""`curate plan` / `curate run --dry-run`: each step with run or skip and why, the inputs,
and what the stages expect of the current outputs (the mix stage: the expected mixture).
Plans without Ray and runs no task."""

from __future__ import annotations

from pathlib import Path

from pipeline.config import LoadedMixture
from pipeline.config.engine import DEFAULTS
from pipeline.config.engine import describe as describe_engine
from pipeline.engine.lease import describe
from pipeline.engine.lease import holder as lease_holder
from pipeline.engine.reuse import preview
from pipeline.engine.step import Step, committed, step_status
from pipeline.io import atomic, fs
from pipeline.run import graph


def previous_steps(run_dir: Path) -> dict:
    try:
        return atomic.read_json(run_dir / "run.json").get("steps", {})
    except (FileNotFoundError, ValueError):
        return {}


def status(s: Step, store, prev: dict, engine_env: dict[str, str]) -> tuple[str, str]:
    """step_status, with the `engine:` settings that changed named when they are why a step
    runs again (`config changed: engine.shuffle_group 32 -> 2 (CURATE_SHUFFLE_GROUP=2)`)."""
    action, why = step_status(s, store, prev)
    now = s.meta.get("engine")
    if why == "config changed" and now:
        old = (prev.get(s.name) or {}).get("engine") or {}  # a run.json from before `engine:` ran with the defaults
        diffs = [f"engine.{k} {old.get(k, DEFAULTS[k]):,} -> {v:,}" + (f" ({engine_env[k]})" if k in engine_env else "")
                 for k, v in now.items() if old.get(k, DEFAULTS[k]) != v]
        why += f": {', '.join(diffs)}" if diffs else ""
    return action, why


def describe_plan(lm: LoadedMixture, output: str | None = None) -> str:
    run_dir = lm.output_dir(output)
    store = lm.store_dir(output)
    ctx = graph.build(lm, run_dir, store)
    prev = previous_steps(run_dir)
    head = describe_engine(ctx.engine, ctx.engine_env)
    lines = [f"run directory: {run_dir}", f"step store:    {store}", *([head] if head else []), "",
             f"{'step':<24} {'hash':<9} {'action':<6} why"]
    pending: set[str] = set()  # steps that will run: the steps after them are keyed by what those write
    done = _Committed(ctx.steps, store)
    for s in ctx.steps:
        action, why = status(s, store, prev, ctx.engine_env)
        if action == "run" and not why.startswith("resume"):
            why += _shards(s, ctx.steps, store, pending, done)
        if action == "run" and (rec := lease_holder(fs.path(store) / "_leases" / s.dir(store).name)) is not None:
            why += f"; {describe(rec)} is computing it now: a run waits for it, then reuses it"
        lines.append(f"{s.name:<24} {s.hash[:8]:<9} {action:<6} {why}")
    lines += ["", f"{'source':<16} {'files':>6} {'input MB':>10} {'docs':>10} {'tokens':>12}"]
    for sname in lm.mixture.sources:
        files = ctx.files[sname]
        ing = ctx.ingest[sname]
        docs = toks = "?"
        if (mk := committed(ing, store)) is not None:
            docs = f"{sum(m['docs_out'] for m in mk.values()):,}"
            if all(m.get("tokens") is not None for m in mk.values()):
                toks = f"{sum(m['tokens'] for m in mk.values()):,}"
            elif (flt := ctx.filter.get(sname)) is not None and (fk := committed(flt, store)) is not None:
                toks = f"{sum(list(m['stages'].values())[-1]['tokens_out'] or 0 for m in fk.values() if m['stages']):,}*"
        lines.append(f"{sname:<16} {len(files):>6} {sum(f.size for f in files) / 1e6:>10.1f} {docs:>10} {toks:>12}")
    lines.append("(docs after ingest, tokens too, or *after the filters, where a filtered source's are counted; "
                 "'?' until they have run)")
    lines += ["", *graph.expected(ctx)]
    return "\n".join(lines)


class _Committed(dict):
    """step name -> its markers when committed (read once, when a preview first needs it);
    KeyError for a step that is not."""

    def __init__(self, steps: list[Step], store):
        super().__init__()
        self.by_name, self.store = {s.name: s for s in steps}, store

    def __missing__(self, name: str):
        s = self.by_name.get(name)
        m = committed(s, self.store) if s is not None else None
        if m is None:
            raise KeyError(name)
        self[name] = m
        return m

    def get(self, name, default=None):  # plans ask `stats.get(step, {})` of optional steps
        try:
            return self[name]
        except KeyError:
            return default


def _shards(s: Step, steps: list[Step], store, pending: set[str], done: _Committed) -> str:
    """`: run K of N shards (M reused)` where the step's inputs are done, else what decides it."""
    pending.add(s.name)
    waits = next((i.name for i in s.inputs if i.name in pending), None)
    if waits is not None:  # its keys are the digests of what that input writes: known once it has run
        return f"; shards reused by content once {waits} has run"
    got = preview(s, steps, store, done)
    if got is None:
        return ""
    n, m = got
    return f": run {n - m} of {n} shards ({m} reused)"
