"""`curate fit` on synthetic metrics of known optimum: a bowl (an interior optimum) and
olmix's log-linear law (an optimum on the caps' corner), over 3 cells from 24 runs and 8
cells from 64, with noise. The sweep folders are written by the real writer (sweep.py's
write_sweep, from a mixture file that loads) with the cells' availability given; no run.

The default model's proposal is within L1 0.1 of the optimum; an optimum beyond a cell's
epoch cap lands on the cap; the same seed gives the same files; the CLI's errors name
what is wrong. The other models' distances are printed (pytest -s) and not asserted."""

from __future__ import annotations

import csv
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from pipeline import config
from pipeline.io import atomic
from pipeline.tune import fit, space, sweep
from tests.conftest import curate


def mixture_file(d: Path, k: int) -> Path:
    """A mixture of k sources s0.. (inputs that need not exist: nothing runs) whose filter
    names a file, so the variants' rebased paths are checked beyond `paths`."""
    cells = [f"s{i}" for i in range(k)]
    (d / "block.txt").write_text("spam.example\n")
    lines = ["name: syn", "output: out", "sources:"]
    lines += [f"  {c}: {{paths: [\"data/{c}/*.jsonl\"], filters: [blocked]}}" for c in cells]
    weights = ", ".join(f"{c}: {w}" for c, w in zip(cells, [round(1 / k, 6)] * (k - 1) + [round(1 - (k - 1) * round(1 / k, 6), 6)],
                                                    strict=True))
    lines += ["filters:", "  blocked: {type: url, blocklist: block.txt}",
              f"mixture: {{target_tokens: 1000000, max_epochs: 2, weights: {{{weights}}}}}"]
    (d / "syn.yaml").write_text("\n".join(lines) + "\n")
    return d / "syn.yaml"


def groups(cells: list[str], caps: list[float], weights: list[float]) -> list[dict]:
    """availability()'s shape: tokens so that cap = max_epochs (2) x tokens / target (1e6)."""
    return [{"phase": None, "target": 1_000_000, "cells": cells,
             "available": {c: int(round(u * 1_000_000 / 2)) for c, u in zip(cells, caps, strict=True)},
             "max_epochs": {c: 2.0 for c in cells}, "weights": dict(zip(cells, weights, strict=True))}]


def bowl(k: int, rng):
    opt = rng.dirichlet(np.full(k, 3.0))
    a = rng.uniform(0.5, 2.0, k)
    return (lambda W: np.sum(a * (np.atleast_2d(W) - opt) ** 2, axis=1)), opt


def loglinear(k: int, rng, caps):
    """olmix's law y = c + exp(w . t); its minimum fills cells in order of t up to their caps."""
    t = rng.uniform(-2, 1, k)
    w, left = np.zeros(k), 1.0
    for i in np.argsort(t):
        w[i] = min(caps[i], left)
        left -= w[i]
    return (lambda W: 1.0 + np.exp(np.atleast_2d(W) @ t)), w


def make_sweep(tmp: Path, k: int, runs: int, caps: list[float], seed: int = 0) -> tuple[Path, dict]:
    d = tmp / f"k{k}"
    d.mkdir(exist_ok=True)
    lm = config.load(mixture_file(d, k))
    cells = [f"s{i}" for i in range(k)]
    folder = sweep.write_sweep(lm, groups(cells, caps, [1 / k] * k), d / "syn-sweep", runs, seed, 1.0, log=lambda m: None)
    return folder, atomic.read_json(folder / "sweep.json")




def write_results(folder: Path, info: dict, f, noise: float, seed: int, extra: dict | None = None) -> Path:
    rng = np.random.default_rng(seed)
    X = np.array([[v["weights"][c] for c in info["columns"]] for v in info["variants"]])
    y = f(X)
    y = y + rng.normal(0, noise * np.std(y), len(y))
    path = folder.parent / "results.csv"
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["variant", "loss", "other"])
        for v, val in zip(info["variants"], y, strict=True):
            w.writerow([v["name"], (extra or {}).get(v["name"], f"{val:.8g}"), "1"])
    return path


CASES = [(3, 24, "bowl"), (3, 24, "loglinear"), (8, 64, "bowl"), (8, 64, "loglinear")]


@pytest.mark.parametrize("k,runs,law", CASES)
def test_the_default_model_finds_the_optimum(tmp_path, k, runs, law):
    rng = np.random.default_rng(k * 10 + (law == "bowl"))
    caps = [1.0] * k if law == "bowl" else [0.6] * k  # the law's optimum then fills two cells to their caps
    folder, info = make_sweep(tmp_path, k, runs, caps)
    f, opt = bowl(k, rng) if law == "bowl" else loglinear(k, rng, np.array(caps))
    res = write_results(folder, info, f, noise=0.03, seed=1)
    out = {}
    # every model's proposal is checked feasible on 3 cells; on 8, auto's alone (it cross-validates them all)
    for model in ("auto", "quadratic", "gp", "loglinear", "linear", "lightgbm") if k <= 3 else ("auto",):
        r = fit.fit(str(folder), str(res), "loss", minimize=True, model=model, out=str(tmp_path / f"{model}.yaml"),
                    log=lambda m: None)
        w = np.array([r["proposed"][c] for c in info["columns"]])
        assert abs(w.sum() - 1) < 1e-9 and np.all(w <= np.array(caps) + 1e-9) and np.all(w >= 0), (model, w)
        out[model] = (float(np.abs(w - opt).sum()), r["model"], r["cv_spearman"])
    print(f"\n{law} over {k} cells from {runs} runs, L1 to the optimum: "
          + ", ".join(f"{m} {d:.3f}" + (f" ({used})" if m == "auto" else "") for m, (d, used, _) in out.items()))
    assert out["auto"][0] <= 0.1, out


def test_an_optimum_beyond_a_cap_lands_on_the_cap(tmp_path):
    """A bowl centred at (0.7, 0.2, 0.1) with cell s0 capped at 0.5 by its epochs: the
    feasible optimum is (0.5, 0.3, 0.2) (the excess shared equally, equal curvatures)."""
    caps = [0.5, 1.0, 1.0]
    folder, info = make_sweep(tmp_path, 3, 24, caps)
    centre = np.array([0.7, 0.2, 0.1])
    res = write_results(folder, info, lambda W: np.sum((np.atleast_2d(W) - centre) ** 2, axis=1), noise=0.02, seed=2)
    r = fit.fit(str(folder), str(res), "loss", minimize=True, out=str(tmp_path / "p.yaml"), log=lambda m: None)
    w = np.array([r["proposed"][c] for c in info["columns"]])
    assert w[0] <= 0.5 + 1e-12 and w[0] >= 0.49, w
    assert np.abs(w - [0.5, 0.3, 0.2]).sum() <= 0.1, w
    assert all(v["weights"]["s0"] <= 0.5 + 1e-12 for v in info["variants"])  # the sweep is feasible too
    lm = config.load(tmp_path / "p.yaml")  # the proposal is a mixture file that loads, with its own name
    assert lm.mixture.name == "p" and lm.mixture.mixture.weights == r["proposed"]
    fit.fit(str(folder), str(res), "loss", minimize=True, out=str(tmp_path / "p2.yaml"), log=lambda m: None)
    assert (tmp_path / "p.yaml").read_text().replace("name: p\n", "") == \
        (tmp_path / "p2.yaml").read_text().replace("name: p2\n", "")  # the same seed, the same proposal
    # olmix's KL term pulls the proposal to the cells' natural shares of tokens (here cap/2 each, normalized)
    prior = np.array([0.25, 0.5, 0.5]) / 1.25
    r = fit.fit(str(folder), str(res), "loss", minimize=True, kl=100.0, out=str(tmp_path / "k.yaml"), log=lambda m: None)
    assert np.abs(np.array([r["proposed"][c] for c in info["columns"]]) - prior).sum() < 0.02, r["proposed"]


def test_sweep_files_their_tables_and_determinism(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    folder, info = make_sweep(tmp_path / "a", 8, 16, [1.0] * 8)
    again, _ = make_sweep(tmp_path / "b", 8, 16, [1.0] * 8)
    names = sorted(p.name for p in folder.glob("*.yaml"))
    assert names == [f"syn-sweep-{i:03d}.yaml" for i in range(16)]  # exactly N, nothing else
    for n in names:
        assert (folder / n).read_bytes() == (again / n).read_bytes()  # same seed, same files
        lm = config.load(folder / n)
        assert lm.mixture.name == n[:-5]
        assert lm.output_dir() == (tmp_path / "a" / "k8" / "out" / lm.mixture.name).resolve()  # the same output
        src = lm.mixture.sources["s0"].paths[0]
        assert (folder / src).resolve() == (tmp_path / "a" / "k8" / "data" / "s0" / "*.jsonl").resolve()
        f = lm.mixture.filters["blocked"]
        assert Path(f.blocklist) == (tmp_path / "a" / "k8" / "block.txt").resolve()  # a filter's file, rebased
    base = np.full(8, 1 / 8)
    far = [np.abs(np.array([v["weights"][c] for c in info["columns"]]) - base).sum() for v in info["variants"]]
    assert sum(x >= 0.5 for x in far) >= len(far) / 4, far  # spread over the simplex
    rows = list(csv.DictReader(open(folder / "sweep.csv")))
    assert [r["variant"] for r in rows] == [v["name"] for v in info["variants"]]
    assert all(abs(sum(float(r[c]) for c in info["columns"]) - 1) < 1e-9 for r in rows)
    ratios = list(csv.reader(open(folder / "ratios.csv")))
    assert ratios[0] == ["run", "name", "index", *info["columns"]]  # olmix's ratios.csv
    priors = {r[0]: r[1:] for r in csv.reader(open(folder / "priors.csv"))}
    assert set(priors) == {"prior", "token_counts", "relative_sizes", "max_weight"}


def test_clip_and_round_keep_every_cap():
    sp = space.Space([space.Group(None, ["a", "b", "c"], np.array([0.2, 0.5, 1.0]), np.full(3, 1 / 3))])
    w = sp.clip(np.array([0.6, 0.3, 0.1]))
    assert np.allclose(w, [0.2, 0.5, 0.3])  # a and b capped; c takes the rest
    for x in np.random.default_rng(0).dirichlet(np.ones(3), 200):
        r = sp.rounded(sp.clip(x))
        assert sp.feasible(r) and abs(r.sum() - 1) < 1e-12 and np.all(np.round(r, 4) == r)
    with pytest.raises(ValueError, match="caps sum to less than 1"):
        space.water_fill(np.ones(2), np.array([0.3, 0.3]))


def test_the_fit_command_and_its_errors(tmp_path):
    folder, info = make_sweep(tmp_path, 3, 24, [1.0] * 3)
    rng = np.random.default_rng(5)
    f, _ = bowl(3, rng)
    nan = {info["variants"][2]["name"]: "nan", info["variants"][5]["name"]: ""}
    res = write_results(folder, info, f, noise=0.02, seed=3, extra=nan)
    r = curate("fit", str(folder), str(res), "--metric", "loss", "--minimize")
    assert r.returncode == 0, r.stderr
    assert "2 run(s) without a finite loss, left out: syn-sweep-002 (line 4: 'nan'), syn-sweep-005 (line 7: '')" in r.stdout
    assert "cross-validated Spearman" in r.stdout and "the sweep's best" in r.stdout and "+-" in r.stdout
    proposed = folder.parent / "syn-fit.yaml"
    assert proposed.exists() and not (folder / "syn-fit.yaml").exists()
    for i in range(3):  # the inputs the file names, so that validate checks its globs too
        (folder.parent / "data" / f"s{i}").mkdir(parents=True, exist_ok=True)
        (folder.parent / "data" / f"s{i}" / "a.jsonl").write_text('{"text": "x"}\n')
    v = curate("validate", str(proposed))
    assert v.returncode == 0 and "ok (3 sources, 3 input files)" in v.stdout, v.stdout + v.stderr
    assert config.load(proposed).mixture.name == "syn-fit"
    svg = ET.parse(folder / "fit.svg").getroot()
    assert svg.tag.endswith("svg") and len(list(svg.iter("{http://www.w3.org/2000/svg}polyline"))) == 3  # a curve a cell
    # errors name the file, the line or the column, and what to do
    r = curate("fit", str(folder), str(res), "--metric", "accuracy")
    assert r.returncode == 2 and "no column 'accuracy'; its metric columns are loss, other" in r.stderr
    bad = tmp_path / "bad.csv"
    bad.write_text("variant,loss\nsyn-sweep-000,1\nsomeone-else,2\n")
    r = curate("fit", str(folder), str(bad), "--metric", "loss")
    assert r.returncode == 2 and "1 variant(s) the sweep in syn-sweep did not write: someone-else (line 3)" in r.stderr
    few = tmp_path / "few.csv"
    few.write_text("variant,loss\n" + "".join(f"syn-sweep-{i:03d},{i}\n" for i in range(4)))
    r = curate("fit", str(folder), str(few), "--metric", "loss", "--model", "quadratic")
    assert r.returncode == 2 and "--model quadratic over 3 weights needs at least 7 runs" in r.stderr
    r = curate("fit", str(folder), str(tmp_path / "none.csv"), "--metric", "loss")
    assert r.returncode == 2 and "no such results file" in r.stderr


def test_a_variant_reads_and_writes_where_its_file_does(tmp_path):
    """Paths the loader leaves relative (eval sets, a tokenizer.json) and a file without
    `output:` (the default `out` beside it): a variant in another folder means the same files."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "tok.json").write_text("{}")
    y = tmp_path / "m" / "x.yaml"
    y.write_text("""name: x
sources:
  a: {paths: ["data/a/*.jsonl"]}
  b: {paths: ["data/b/*.jsonl"]}
decontaminate: {against: [{name: ev, paths: ["evals/ev.jsonl"]}]}
tokenize: {tokenizer: tok.json}
publish: {dir: pub}
mixture: {target_tokens: 1000, weights: {a: 0.5, b: 0.5}}
""")
    lm = config.load(y)
    folder = sweep.write_sweep(lm, groups(["a", "b"], [1.0, 1.0], [0.5, 0.5]), tmp_path / "elsewhere" / "sw", 2, 0, 1.0,
                               log=lambda m: None)
    v = config.load(folder / "x-sweep-000.yaml")
    assert v.output_dir() == (tmp_path / "m" / "out" / "x-sweep-000").resolve()
    assert v.store_dir() == lm.store_dir()
    ev = v.mixture.decontaminate.against[0].paths[0]
    assert (folder / ev).resolve() == (tmp_path / "m" / "evals" / "ev.jsonl").resolve()
    assert (folder / v.mixture.tokenize.tokenizer).resolve() == (tmp_path / "m" / "tok.json").resolve()
    assert v.mixture.publish is None  # a proxy's mixture is not published


def test_fit_without_signal_and_a_sweep_of_one_cell_are_refused(tmp_path):
    """Issue 51, item 5: all-equal metrics are no signal (exit 2, said so), not a NaN Spearman and
    a proposal +- 0; a sweep of one cell is refused as its message says."""
    folder, info = make_sweep(tmp_path, 3, 24, [1.0] * 3)
    flat = tmp_path / "flat.csv"
    flat.write_text("variant,loss\n" + "".join(f"{v['name']},0.5\n" for v in info["variants"]))
    r = curate("fit", str(folder), str(flat), "--metric", "loss")
    assert r.returncode == 2 and "every run's loss is 0.5: no signal" in r.stderr, r.stdout + r.stderr
    assert not (folder.parent / "syn-fit.yaml").exists()
    one = tmp_path / "one"
    one.mkdir()
    y = mixture_file(one, 1)
    with pytest.raises(Exception, match="name at least two"):
        sweep.availability(config.load(y), log=lambda m: None)


def test_a_fit_proposal_does_not_publish(tmp_path):
    """Issue 51, item 7: `fit` drops `publish:` as `sweep` does: a proposal never writes over the
    base mixture's published folder."""
    folder, info = make_sweep(tmp_path, 3, 24, [1.0] * 3)
    base = Path(info["mixture"])
    base.write_text(base.read_text() + "publish: {dir: pub}\n")
    f, _ = bowl(3, np.random.default_rng(1))
    res = write_results(folder, info, f, noise=0.02, seed=3)
    r = curate("fit", str(folder), str(res), "--metric", "loss", "--minimize")
    assert r.returncode == 0, r.stderr
    assert "publish:" in base.read_text() and "publish:" not in (folder.parent / "syn-fit.yaml").read_text()
