"""`curate fit`: from a sweep's weights and the user's proxy metrics to proposed weights.

Reads the sweep folder (sweep.json: cells, caps, the base file) and RESULTS.csv (a `variant`
column naming the sweep's variants, one column per metric), fits the chosen surrogate
(surrogate.py), reports its cross-validated rank correlation, and searches the feasible set
(space.py: every group's simplex within its caps) for the best predicted metric, optionally
penalised by `kl` x KL(weights || the cells' natural shares of tokens), as olmix does. The
search starts from seeded uniform points, the caps' corners and the sweep's own variants,
and refines the best of them with SLSQP (the trees: the best candidate). Writes the
proposal as a mixture file with its own name, fit.json and fit.svg in the sweep folder.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import yaml
from scipy import optimize

from pipeline.config import load
from pipeline.errors import UsageError
from pipeline.io import atomic
from pipeline.tune import plot
from pipeline.tune.space import Group, Space, normed
from pipeline.tune.surrogate import AUTO, Surrogate, cross_validated, min_runs, select
from pipeline.tune.sweep import set_weights, rebase

CANDIDATES = 3000
STARTS = 8


def read_sweep(folder: Path) -> tuple[dict, Space]:
    try:
        info = atomic.read_json(folder / "sweep.json")
    except FileNotFoundError:
        raise UsageError(f"{folder}: no sweep.json; give the folder `curate sweep` wrote") from None
    groups = [Group(g["phase"], g["cells"], np.array([g["caps"][c] for c in g["cells"]]),
                    normed([g["weights"][c] for c in g["cells"]])) for g in info["groups"]]
    return info, Space(groups)


def read_results(path: Path, info: dict, metric: str, log=print) -> tuple[list[str], np.ndarray]:
    """(variants, metric values) of the runs the sweep wrote, NaN rows named and left out."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:  # -sig: a spreadsheet's byte-order mark
            reader = csv.DictReader(f)
            rows = list(reader)
            header = [h for h in (reader.fieldnames or []) if h is not None]
    except FileNotFoundError:
        raise UsageError(f"{path}: no such results file (a CSV with a `variant` column and one column per metric)") from None
    if "variant" not in header:
        raise UsageError(f"{path}:1: no `variant` column (found: {', '.join(header) or 'nothing'}); name each row's "
                         "variant as the sweep did (its mixture `name`)")
    metrics = [h for h in header if h != "variant"]
    if metric not in header:
        raise UsageError(f"{path}:1: no column {metric!r}; its metric columns are {', '.join(metrics) or 'none'}")
    known = {v["name"] for v in info["variants"]}
    unknown = [(i + 2, r["variant"]) for i, r in enumerate(rows) if r["variant"] not in known]
    if unknown:
        shown = ", ".join(f"{v} (line {n})" for n, v in unknown[:3])
        raise UsageError(f"{path}: {len(unknown)} variant(s) the sweep in {info['name']}-sweep did not write: {shown}"
                         f"{' ...' if len(unknown) > 3 else ''}; its variants are {info['name']}-sweep-000 .. "
                         f"-{info['runs'] - 1:03d}")
    seen: dict[str, int] = {}
    for i, r in enumerate(rows):
        if r["variant"] in seen:
            raise UsageError(f"{path}:{i + 2}: variant {r['variant']} again (first on line {seen[r['variant']]}); "
                             "give one row per variant (average repeated proxy runs first)")
        seen[r["variant"]] = i + 2
    names, values, bad = [], [], []
    for i, r in enumerate(rows):
        try:
            v = float(r[metric])
        except (TypeError, ValueError):
            v = math.nan
        if not math.isfinite(v):
            bad.append(f"{r['variant']} (line {i + 2}: {r[metric]!r})")
            continue
        names.append(r["variant"])
        values.append(v)
    if bad:
        log(f"fit: {len(bad)} run(s) without a finite {metric}, left out: {', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''}")
    return names, np.array(values)


def propose(sur: Surrogate, space: Space, sign: float, seed: int, kl: float = 0.0, prior: np.ndarray | None = None,
            start: np.ndarray | None = None) -> np.ndarray:
    """The feasible weights of the best predicted metric (sign +1: lowest, -1: highest),
    with `kl` x KL(w || the cells' natural shares) added to the objective."""
    def objective(W: np.ndarray) -> np.ndarray:
        W = np.atleast_2d(W)
        val = sign * sur.predict(W)
        if kl and prior is not None:
            # a cell with no tokens (prior 0) can only hold weight 0 under its cap: left out of the sum
            ratio = np.divide(np.maximum(W, 1e-12), prior, out=np.ones_like(W), where=prior > 0)
            val = val + kl * np.sum(np.where((W > 0) & (prior > 0), W * np.log(ratio), 0.0), axis=1)
        return val

    cands = space.candidates(CANDIDATES, seed)
    if start is not None:
        cands = np.vstack([cands, start])
    vals = objective(cands)
    order = np.argsort(vals, kind="stable")
    best, best_val = cands[order[0]], vals[order[0]]
    if sur.model == "lightgbm":  # piecewise constant: no gradient to follow
        return best
    cons = [{"type": "eq", "fun": (lambda w, sl=sl: w[sl].sum() - 1.0)} for sl in space.slices]
    bounds = list(zip(np.zeros(space.dim), space.caps, strict=True))
    for i in order[:STARTS]:
        r = optimize.minimize(lambda w: float(objective(w)[0]), cands[i], method="SLSQP", bounds=bounds,
                              constraints=cons, options={"maxiter": 300, "ftol": 1e-10})
        w = space.clip(np.clip(r.x, 0, space.caps))
        v = float(objective(w)[0])
        if v < best_val - 1e-12:
            best, best_val = w, v
    return best


def fit(folder: str, results: str, metric: str, minimize: bool = False, model: str = "auto", out: str | None = None,
        seed: int = 0, kl: float = 0.0, log=print) -> dict:
    folder_p = Path(folder).resolve()
    info, space = read_sweep(folder_p)
    name = f"{info['name']}-fit"
    out_p = (Path(out) if out else folder_p.parent / f"{name}.yaml").resolve()
    if out_p.parent == folder_p:
        raise UsageError(f"--out {out_p}: not inside the sweep folder (it holds the sweep's variants only)")
    if kl < 0:
        raise UsageError(f"--kl {kl}: give a penalty >= 0 (0: none)")
    names, y = read_results(Path(results), info, metric, log)
    need = min(min_runs(m, space.dim) for m in AUTO) if model == "auto" else min_runs(model, space.dim)
    if len(y) < need:
        raise UsageError(f"--model {model} over {space.dim} weights needs at least {need} runs with a metric, "
                         f"{Path(results).name} has {len(y)}; run more variants (`curate sweep --runs`) or choose "
                         "--model linear")
    if np.ptp(y) == 0:  # a Spearman of NaN and a proposal of +- 0 would look like a prediction
        raise UsageError(f"{Path(results).name}: every run's {metric} is {y[0]:.6g}: no signal to fit weights to. "
                         "Check that the metric varies with the data (a proxy too small, an eval that saturates), "
                         "or sweep wider weights (`curate sweep --concentration` below 1)")
    by_name = {v["name"]: v for v in info["variants"]}
    cols = info["columns"]
    X = np.array([[by_name[n]["weights"][c] for c in cols] for n in names])
    prior = np.concatenate([normed([g["available"][c] for c in g["cells"]]) for g in info["groups"]])  # natural shares
    sign = 1.0 if minimize else -1.0
    chosen, tried = (model, {}) if model != "auto" else select(X, y, seed)
    if model == "auto":
        log("fit: auto: " + ", ".join(f"{m} RMSE {t['rmse']:.4g} (Spearman {t['spearman']:.3f})" for m, t in tried.items())
            + f" out of fold; using {chosen}")
        oof, rho = tried[chosen]["oof"], tried[chosen]["spearman"]
    else:
        oof, rho = cross_validated(model, X, y, seed)
    model = chosen
    sur = Surrogate(model, seed).fit(X, y)
    best_i = int(np.argmin(sign * y))
    w = space.rounded(propose(sur, space, sign, seed, kl, prior, start=X))
    pred, std = float(sur.predict(w)[0]), sur.uncertainty(w)
    base = load(info["mixture"])
    raw = rebase(base, out_p.parent)
    raw["name"] = out_p.stem if out else name
    raw.pop("publish", None)  # a proposal is a mixture to try, not a dataset to publish (nor over the base's folder)
    set_weights(raw, space, w)
    header = (f"# proposed by `curate fit --metric {metric}{' --minimize' if minimize else ''} --model {model}` from "
              f"{len(y)} runs of {folder_p.name}: predicted {metric} {pred:.6g} +- {std:.2g}\n")
    out_p.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_bytes(out_p, (header + yaml.safe_dump(raw, sort_keys=False, allow_unicode=True)).encode())
    result = {"metric": metric, "minimize": minimize, "model": model,
              "auto": {m: {"rmse": t["rmse"], "spearman": t["spearman"]} for m, t in tried.items()} or None, "runs": len(y), "cv_spearman": rho,
              "proposed": dict(zip(cols, map(float, w), strict=True)), "predicted": pred, "predicted_std": std,
              "best_observed": {"variant": names[best_i], "value": float(y[best_i]),
                                "weights": dict(zip(cols, map(float, X[best_i]), strict=True))},
              "file": str(out_p), "kl": kl}
    atomic.write_json(folder_p / "fit.json", result)
    curves = partial_effects(sur, space, w)
    atomic.write_bytes(folder_p / "fit.svg", plot.svg(y, oof, rho, metric, model, cols, curves).encode())
    log(render(result, cols, space))
    return result


def partial_effects(sur: Surrogate, space: Space, w: np.ndarray, points: int = 21) -> dict[str, tuple]:
    """Per cell: its weight from 0 to its cap, the group's other cells rescaled in
    proportion (then clipped), and the predicted metric along that line."""
    out = {}
    cols = space.columns()
    for sl in space.slices:
        for i in range(sl.start, sl.stop):
            xs = np.linspace(0, space.caps[i], points)
            pts = []
            for x in xs:
                v = w.copy()
                rest = [j for j in range(sl.start, sl.stop) if j != i]
                others = w[rest].sum()
                v[rest] = (w[rest] / others * (1 - x)) if others > 0 else (1 - x) / max(1, len(rest))
                v[i] = x
                pts.append(space.clip(v))
            out[cols[i]] = (xs, sur.predict(np.array(pts)))
    return out


def render(r: dict, cols: list[str], space: Space) -> str:
    width = max([6] + [len(c) for c in cols])
    b = r["best_observed"]
    lines = [f"fit: {r['model']} on {r['runs']} runs, cross-validated Spearman {r['cv_spearman']:.3f} "
             f"({'lower' if r['minimize'] else 'higher'} {r['metric']} is better)",
             f"{'cell':<{width}} {'proposed':>9} {b['variant']:>16} {'file':>7} {'cap':>6}"]
    for c, base, cap in zip(cols, space.base, space.caps, strict=True):
        lines.append(f"{c:<{width}} {r['proposed'][c]:>9.4f} {b['weights'][c]:>16.4f} {base:>7.4f} {cap:>6.3f}")
    lines.append(f"predicted {r['metric']}: {r['predicted']:.6g} +- {r['predicted_std']:.2g} (proposed); "
                 f"observed {b['value']:.6g} ({b['variant']}, the sweep's best)")
    lines.append(f"wrote {r['file']} (run it: curate run {r['file']}); plots: fit.svg in the sweep folder")
    return "\n".join(lines)
