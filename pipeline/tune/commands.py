"""The `curate sweep` and `curate fit` commands: their arguments and what they call."""

from __future__ import annotations

import sys
from pathlib import Path

SWEEP = """Write exactly N variant mixture files (<name>-sweep-000.yaml ...) whose weights spread over the feasible
simplex: every cell within its max_epochs for the target, each phase's weights summing to 1. Each variant reads the same
inputs and writes to the same output and step store, so `curate run` on it reuses every step but the mix. Beside them:
sweep.csv (variant, weights per cell), ratios.csv and priors.csv (olmix's shapes: weights, token counts, relative sizes,
caps) and sweep.json. Each cell's tokens come from the steps before the mix (the file is run once when they are not done).

Then train a proxy model on each variant's mixture with your trainer, write RESULTS.csv (a `variant` column and one
column per metric) and run `curate fit SWEEP_DIR RESULTS.csv --metric M`."""

FIT = """Fit a regression from the sweep's weights to a metric of your proxy runs and propose the feasible weights with the
best predicted metric (within every cell's max_epochs cap). Prints the proposal beside the sweep's best observed variant
with the prediction's uncertainty and the model's cross-validated rank correlation; writes the proposal as a mixture
file with its own name (default: <name>-fit.yaml beside the sweep folder), and fit.json and fit.svg (predicted against
observed, each cell's partial effect) into the sweep folder. Runs whose metric is empty or NaN are named and left out."""


def add_parsers(sub) -> None:
    import argparse

    raw = argparse.RawDescriptionHelpFormatter
    s = sub.add_parser("sweep", help="write N variant mixtures over the feasible weights, for proxy runs",
                       description=SWEEP, formatter_class=raw)
    s.add_argument("mixture", help="the mixture YAML file whose weights to vary")
    s.add_argument("--runs", type=int, required=True, help="variants to write")
    s.add_argument("--seed", type=int, default=0, help="seed of the draw (default 0): the same seed, the same files")
    s.add_argument("--concentration", type=float, default=1.0,
                   help="spread of the Dirichlet draw around the file's weights: 1 (default) about as wide as uniform "
                   "(a quarter or more of the variants at L1 >= 0.5 from them), 10 near them")
    s.add_argument("--out", default=None, help="the sweep folder (default: <name>-sweep beside the mixture file)")
    s.add_argument("--run", action="store_true", help="then run every variant (each reuses every step but the mix)")
    s.add_argument("--workers", type=int, default=None, help="CPUs of the embedded Ray for --run")

    f = sub.add_parser("fit", help="propose weights from a sweep and your proxy runs' metrics",
                       description=FIT, formatter_class=raw)
    f.add_argument("sweep_dir", help="the folder `curate sweep` wrote")
    f.add_argument("results", help="CSV: a `variant` column (the variants' names) and one column per metric")
    f.add_argument("--metric", required=True, help="the column to optimise")
    f.add_argument("--minimize", action="store_true", help="lower is better (a loss, a perplexity); default: higher")
    # surrogate.MODELS, written out: importing it would load scipy to parse the command line
    f.add_argument("--model", default="auto", choices=["auto", "quadratic", "gp", "loglinear", "linear", "lightgbm"],
                   help="the regression (default auto: quadratic, loglinear or gp, whichever has the smallest "
                   "cross-validated error)")
    f.add_argument("--kl", type=float, default=0.0,
                   help="penalty on KL(weights || the cells' natural token shares), as olmix's (default 0: none)")
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--out", default=None, help="the proposed mixture file (default: <name>-fit.yaml beside the sweep folder)")


def dispatch(args) -> int:
    def log(m: str) -> None:
        print(m, file=sys.stderr)

    if args.cmd == "sweep":
        from pipeline.tune import sweep

        try:  # the file's first run (to count its cells) and --run may start an embedded Ray: stopped on the way out
            folder = sweep.sweep(args.mixture, args.runs, seed=args.seed, concentration=args.concentration,
                                 out=args.out, log=log)
            if args.run:
                _run_all(folder, args.workers, log)
        finally:
            from pipeline.engine.cluster import stop_ray

            stop_ray()
        print(folder)
        return 0
    from pipeline.tune import fit

    fit.fit(args.sweep_dir, args.results, args.metric, minimize=args.minimize, model=args.model, out=args.out,
            seed=args.seed, kl=args.kl, log=print)  # a fit that cannot be made raises a UsageError
    return 0


def _run_all(folder: Path, workers, log) -> None:
    from pipeline.io import atomic
    from pipeline.tune import sweep

    times = sweep.run_variants(folder, log=log, workers=workers)
    info = atomic.read_json(folder / "sweep.json")
    first = _first_run_seconds(info)
    secs = [t["seconds"] for t in times]
    log(f"sweep: {len(secs)} variants ran in {sum(secs):.1f}s (median {sorted(secs)[len(secs) // 2]:.1f}s each)"
        + (f"; the file's own run took {first:.1f}s" if first else ""))


def _first_run_seconds(info: dict) -> float | None:
    from pipeline.config import load
    from pipeline.io import atomic

    try:
        return atomic.read_json(load(info["mixture"]).output_dir(None) / "run.json").get("seconds")
    except (FileNotFoundError, ValueError):
        return None
