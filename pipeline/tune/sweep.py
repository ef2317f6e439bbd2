"""`curate sweep`: N variant mixture files whose weights spread over the feasible simplex.

Every variant is the user's file with its own `name`, its weights drawn by space.py, and
its relative paths rewritten so it reads the same inputs and writes to the same output and
step store from the sweep's folder: a variant's run reuses every step but the mix. The
folder holds exactly the N `<name>-sweep-XXX.yaml` files and

    sweep.json   the base file, seed, concentration, each group's cells, availability and caps
    sweep.csv    variant, index, one column per cell (a phase's cells as `phase:cell`)
    ratios.csv   the same weights in olmix's shape (run, name, index, domains...)
    priors.csv   per cell: available tokens, relative size (olmix's priors), cap

Availability is each cell's kept tokens as the mix would count them now: from the markers
of the steps the mix reads, after running the file once when they are not all done.
"""

from __future__ import annotations

import csv
import io
import os
import time
from pathlib import Path

import numpy as np
import yaml

from pipeline.config import LoadedMixture, load
from pipeline.errors import RunError, UsageError
from pipeline.io import atomic, fs
from pipeline.run import graph, runner
from pipeline.steps.mix.plan import available_now, cell_max_epochs
from pipeline.tune.space import DECIMALS, Group, Space, normed


def availability(lm: LoadedMixture, log=print) -> list[dict]:
    """Per group (phase): its name, target, cells with kept tokens and max_epochs, and the
    file's weights; runs the file first when the steps the mix reads are not all done."""
    mx = lm.mixture.mixture
    if mx.sample_rates is not None or (mx.phases and any(p.weights is None for p in mx.phases)):
        raise UsageError(f"{lm.path}: mixture.sample_rates: a sweep varies weights; give `mixture.weights` "
                         "(or each phase's `weights`) instead")
    if not mx.phases and not mx.weights:
        raise UsageError(f"{lm.path}: mixture.weights: a sweep varies the weights of named cells; name at least two")
    for where, ws in ([("mixture.weights", mx.weights)] if not mx.phases else
                      [(f"mixture.phases[{p.name}].weights", p.weights) for p in mx.phases]):
        if len(ws) < 2:  # one cell always takes weight 1: nothing to vary
            raise UsageError(f"{lm.path}: {where}: a sweep varies the weights of named cells; name at least two "
                             f"(this names {', '.join(ws)})")
    if mx.phases and mx.disjoint:
        raise UsageError(f"{lm.path}: mixture.disjoint: sweeping disjoint phases (one shared order) is not supported; "
                         "sweep each phase as its own mixture file, or set disjoint: false")
    run_dir, store = lm.output_dir(None), lm.store_dir(None)
    ctx = graph.build(lm, run_dir, store)
    pending, per_phase = available_now(ctx)
    if pending:
        log(f"sweep: counting each cell's tokens needs the steps before the mix: running {lm.path} once")
        try:
            runner.run(lm, log=lambda m: None, quiet=True)
        except RunError as e:  # the file's own weights may be short: the counts may be there all the same
            log(f"sweep: the run of {lm.path} failed ({str(e).splitlines()[0]}); using the counts if they are done")
        ctx = graph.build(lm, run_dir, store)
        pending, per_phase = available_now(ctx)
        if pending:
            raise RunError(f"sweep: steps {', '.join(pending[:3])} did not finish; fix the run of {lm.path} first")
    out = []
    specs = [(None, mx.weights, mx.target_tokens, mx.simulate_target_tokens)] if not mx.phases else \
        [(p.name, p.weights, p.target_tokens, None) for p in mx.phases]
    for ph, avail, (name, weights, target, simulate) in zip(ctx.mix.phases, per_phase, specs, strict=True):
        where = "mixture.weights" if name is None else f"mixture.phases[{name}].weights"
        unknown = [k for k in weights if k not in avail]
        if unknown:
            raise UsageError(f"{lm.path}: {where}: {', '.join(unknown)} not a cell the mix counts "
                             f"(cells: {', '.join(avail)})")
        me = cell_max_epochs(ctx, ph)
        out.append({"phase": name, "target": simulate or target, "cells": list(weights),
                    "available": {k: avail[k] for k in weights}, "max_epochs": {k: me[k] for k in weights},
                    "weights": dict(weights)})
    return out


def space_of(groups: list[dict]) -> Space:
    """The feasible set of `availability`'s groups; an error naming the cells when none is."""
    gs = []
    for g in groups:
        caps = np.array([_cap(g["available"][c], g["max_epochs"][c], g["target"]) for c in g["cells"]])
        if caps.sum() < 1 - 1e-9:
            rows = ", ".join(f"{c} at most {u:.3f}" for c, u in zip(g["cells"], caps, strict=True))
            raise UsageError(f"no weights are feasible{'' if g['phase'] is None else ' in phase ' + g['phase']}: "
                             f"within max_epochs {rows} (sum {caps.sum():.3f} < 1); lower target_tokens or raise max_epochs")
        if (np.floor(caps * 10**DECIMALS + 1e-9) / 10**DECIMALS).sum() < 1 - 1e-12:
            raise UsageError(f"the cells' max_epochs caps sum to {caps.sum():.6f}: no weights of {DECIMALS} decimals fit "
                             "under them; lower mixture.target_tokens or raise max_epochs")
        gs.append(Group(g["phase"], g["cells"], caps, normed([g["weights"][c] for c in g["cells"]])))
    return Space(gs)


def _cap(avail: int, max_epochs: float | None, target: int | None) -> float:
    if avail <= 0:
        return 0.0
    if max_epochs is None or target is None:
        return 1.0
    return float(min(1.0, max_epochs * avail / target))


def sweep(path: str, runs: int, seed: int = 0, concentration: float = 1.0, out: str | None = None, log=print) -> Path:
    """Write the variants and their tables; returns the sweep folder."""
    if runs < 1:
        raise UsageError(f"--runs {runs}: give at least 1 variant")
    if concentration <= 0:
        raise UsageError(f"--concentration {concentration}: give a number > 0 (1: wide, 10: near the file's weights)")
    lm = load(path)
    name = lm.mixture.name
    folder = Path(out) if out else lm.path.parent / f"{name}-sweep"
    folder.mkdir(parents=True, exist_ok=True)
    stale = sorted(p.name for p in folder.glob("*.yaml"))
    if stale:
        raise UsageError(f"{folder} already holds {', '.join(stale[:3])}{' ...' if len(stale) > 3 else ''}: a sweep "
                         "folder holds one sweep's variants only; remove them or give another --out")
    return write_sweep(lm, availability(lm, log), folder, runs, seed, concentration, log)


def write_sweep(lm: LoadedMixture, groups: list[dict], folder: Path, runs: int, seed: int, concentration: float,
                log=print) -> Path:
    """The variants of `lm` over the feasible weights of `groups` (availability's), their
    tables and sweep.json, in `folder`."""
    name = lm.mixture.name
    folder.mkdir(parents=True, exist_ok=True)
    space = space_of(groups)
    points = space.sample(runs, seed, concentration)
    cols = space.columns()
    variants = []
    for i, w in enumerate(points):
        w = space.rounded(w)
        vname = f"{name}-sweep-{i:03d}"
        raw = rebase(lm, folder)
        raw["name"] = vname
        raw.pop("publish", None)  # a proxy's mixture is not a dataset to publish (nor to write over another's)
        set_weights(raw, space, w)
        text = (f"# variant {i} of {runs} from {os.path.relpath(lm.path.resolve(), folder.resolve())} by `curate sweep "
                f"--runs {runs} --seed {seed} --concentration {concentration:g}`: only the weights differ\n"
                + yaml.safe_dump(raw, sort_keys=False, allow_unicode=True))
        atomic.write_bytes(folder / f"{vname}.yaml", text.encode())
        variants.append({"name": vname, "file": f"{vname}.yaml", "weights": dict(zip(cols, map(float, w), strict=True))})
    _write_tables(folder, space, groups, variants)
    atomic.write_json(folder / "sweep.json", {
        "mixture": str(lm.path.resolve()), "name": name, "runs": runs, "seed": seed, "concentration": concentration,
        "groups": [{**g, "caps": dict(zip(g["cells"], map(float, grp.caps), strict=True))}
                   for g, grp in zip(groups, space.groups, strict=True)],
        "columns": cols, "variants": variants})
    far = [float(np.abs(np.array(list(v["weights"].values())) - space.base).sum()) for v in variants]
    log(f"{folder}: {runs} variants over {len(cols)} cells; L1 from the file's weights: median {np.median(far):.2f}, "
        f"{sum(f >= 0.5 for f in far)} of {runs} at 0.5 or more")
    return folder


def set_weights(raw: dict, space: Space, w: np.ndarray) -> None:
    mix = raw.setdefault("mixture", {})
    for g, sl in zip(space.groups, space.slices, strict=True):
        weights = {c: float(x) for c, x in zip(g.cells, w[sl], strict=True)}
        if g.phase is None:
            mix["weights"] = weights
            mix.pop("normalize", None)
        else:
            next(p for p in mix["phases"] if p["name"] == g.phase)["weights"] = weights


def _write_tables(folder: Path, space: Space, groups: list[dict], variants: list[dict]) -> None:
    cols = space.columns()

    def write(name: str, header: list[str], rows: list[list]) -> None:
        text = io.StringIO(newline="")
        wr = csv.writer(text)
        wr.writerow(header)
        wr.writerows(rows)
        atomic.write_bytes(folder / name, text.getvalue().encode())

    write("sweep.csv", ["variant", "index", *cols],
          [[v["name"], i, *(f"{v['weights'][c]:g}" for c in cols)] for i, v in enumerate(variants)])
    write("ratios.csv", ["run", "name", "index", *cols],
          [[v["name"], v["name"], i, *(f"{v['weights'][c]:g}" for c in cols)] for i, v in enumerate(variants)])
    avail = [g["available"][c] for g in groups for c in g["cells"]]
    rel = []
    for g in groups:
        tot = sum(g["available"].values()) or 1
        rel += [g["available"][c] / tot for c in g["cells"]]
    write("priors.csv", ["prior", *cols], [["token_counts", *avail], ["relative_sizes", *(f"{r:.6g}" for r in rel)],
                                          ["max_weight", *(f"{u:.6g}" for u in space.caps)]])


def rebase(lm: LoadedMixture, folder: Path) -> dict:
    """The file's raw YAML with every relative path rewritten to mean the same file from
    `folder`: output, store, publish.dir, sources' paths and every path the loader resolves
    (filter files, classifier files, model folders), found by comparing the raw values with
    the loaded ones."""
    import copy

    raw = copy.deepcopy(lm.raw)
    base, new = lm.base_dir, Path(folder).resolve()

    def rel(v):
        if not isinstance(v, str) or fs.is_url(v) or "://" in v or Path(v).is_absolute():
            return v
        r = os.path.relpath(os.path.normpath(base / v), new)
        return r if "/" in r else f"./{r}"

    raw["output"] = rel(raw.get("output", lm.mixture.output))  # also the default's: the same run folders and store
    if "store" in raw:
        raw["store"] = rel(raw["store"])
    if isinstance(raw.get("publish"), dict) and "dir" in raw["publish"]:
        raw["publish"]["dir"] = rel(raw["publish"]["dir"])
    for src in (raw.get("sources") or {}).values():
        if isinstance(src, dict) and "paths" in src:
            src["paths"] = [rel(p) for p in src["paths"]] if isinstance(src["paths"], list) else rel(src["paths"])
    for holder in (raw, raw.get("tokenize") if isinstance(raw.get("tokenize"), dict) else {}):  # a tokenizer.json
        if isinstance(holder.get("tokenizer"), str) and holder["tokenizer"] != "gpt2" and (base / holder["tokenizer"]).exists():
            holder["tokenizer"] = rel(holder["tokenizer"])
    dc = raw.get("decontaminate")
    for item in (dc.get("against") or []) if isinstance(dc, dict) else []:  # eval sets given by their files
        if isinstance(item, dict) and isinstance(item.get("paths"), list):
            item["paths"] = [rel(x) for x in item["paths"]]
    loaded = lm.canonical()

    def walk(r, m):
        if isinstance(r, dict) and isinstance(m, dict):
            for k, v in r.items():
                if isinstance(v, str) and isinstance(m.get(k), str) and m[k] != v and m[k] == str((base / v).resolve()):
                    r[k] = rel(v)
                elif isinstance(v, list) and isinstance(m.get(k), list):
                    r[k] = [rel(x) if isinstance(x, str) and isinstance(y, str) and y != x and y == str((base / x).resolve())
                            else x for x, y in zip(v, m[k], strict=False)] + v[len(m[k]):]
                    for x, y in zip(v, m[k], strict=False):
                        walk(x, y)  # a list of sections
                else:
                    walk(v, m.get(k))

    for section in ("filters", "classifiers", "dedup", "sources", "decontaminate"):
        walk(raw.get(section), loaded.get(section))
    return raw


def run_variants(folder: Path, log=print, workers: int | None = None) -> list[dict]:
    """Run every variant of a sweep folder in turn (each reuses every step but the mix);
    returns each one's wall seconds. A variant that fails does not stop the others: the
    failures are listed at the end (rerun one with `curate run FILE`)."""
    info = atomic.read_json(folder / "sweep.json")
    out, failed = [], []
    for v in info["variants"]:
        t0 = time.time()
        try:
            runner.run(load(folder / v["file"]), workers=workers, log=lambda m: None, quiet=True)
        except (RunError, UsageError) as e:
            failed.append(f"{v['file']}: {str(e).splitlines()[0]}")
            log(f"{v['name']}: failed: {str(e).splitlines()[0]}")
            continue
        out.append({"name": v["name"], "seconds": time.time() - t0})
        log(f"{v['name']}: ran in {out[-1]['seconds']:.1f}s")
    if failed:
        raise RunError(f"{len(failed)} of {len(info['variants'])} variants failed (the others ran):\n  "
                       + "\n  ".join(failed) + f"\nfix the cause and run them again: curate run {folder}/<file>")
    return out
