"""A differential fuzzer of edits: after any sequence of edits, an incremental run in a
shared store gives the bytes of a fresh run (issue 69).

It starts from a small corpus and its mixture (bench/fuzz_edits.py), applies random edits
(filters and thresholds, per_language, dedup kinds, order and thresholds, the classifier
and its pinning, the quality and language cells (an axis with buckets), topics, the tokenizer and the token formats, weights,
cells and phases, eval sets and their content, sources added, removed and renamed, input
files added, removed and replaced, one of them keeping its size and mtime, engine
settings, gc between runs) and after each one runs the mixture twice: in the store every
earlier variant ran in (reusing what it can), and fresh, in a store of its own. Every
output is compared byte for byte: the mixture, the token files, the samples, the
validation split, the quarantine, report.json, manifest.json, the ledger (less their
timings) and the published folder. Every few edits two variants run at once in the shared
store (two processes), each compared with its fresh run too.

A difference is minimised to the edits that cause it: the last edit alone on the first
state, then longer suffixes of the history, each replayed in a new store; the smallest that
still differs is printed as a repro, with the files that differ.

    python -m bench.fuzz_reuse --edits 500 --seed 1        # the long run: prints the count
    python -m bench.fuzz_reuse --edits 40 --seed 7 --tmp /tmp/fz --json fz.json

Runs are in this process (every step inline, no Ray: `CURATE_INLINE_DOCS`), so an edit
costs about a second and its fresh run two; the concurrent pairs are `curate run`
subprocesses.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

INLINE = {"CURATE_INLINE_DOCS": "1000000"}  # every step in the running process: no Ray, no local pool
os.environ.setdefault("OMP_NUM_THREADS", "1")

from bench import fuzz_edits as fe  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# the code's commit too (curate_commit, git_commit): a run holds it fixed; one made while the tree moves is no data
VOLATILE = ("second", "timing", "started", "finished", "run_id", "host", "created", "elapsed", "wall", "cpu", "rss", "_commit")
COMPARED = ("mixture", "tokenized", "samples", "validation", "quarantine")
JSONS = ("report.json", "manifest.json", "ledger.json")
CARD_STEPS = re.compile(rb"(\| [\w.-]+ \| [0-9a-f]{64} \| \d+ \|) \d+ \| \d+ \|")  # a step's computed and reused shards
CARD_VOLATILE = re.compile(rb"\d{4}-\d\d-\d\d \d\d:\d\d UTC|Run `[^`]+` \([0-9a-f]+\)|[\d.]+ s;|\d+ of \d+ steps were reused"
                           rb"|commit `[0-9a-f]+`( with uncommitted changes)?")


# ----- one run and its outputs --------------------------------------------------------------------

def run_in_process(yaml_path: Path) -> str | None:
    """`curate run` in this process; None, or the error it ended with (paths left out)."""
    from pipeline.config.load import load
    from pipeline.run import runner

    saved = {k: os.environ.get(k) for k in INLINE}
    os.environ.update(INLINE)
    try:
        runner.run(load(yaml_path), workers=2, quiet=True, log=lambda *a, **k: None)
        return None
    except Exception as e:  # noqa: BLE001 -- a run's failure is an outcome to compare
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def run_subprocess(yaml_path: Path) -> subprocess.Popen:
    env = {**os.environ, **INLINE}
    env.pop("RAY_ADDRESS", None)
    return subprocess.Popen([sys.executable, "-m", "pipeline", "run", str(yaml_path), "--quiet"], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def timeless(v, top: bool = True):
    """A JSON record without its timings (and a report's per-step statuses: a cached step is SKIPPED)."""
    if isinstance(v, dict):
        return {k: timeless(x, False) for k, x in v.items()
                if not any(w in k.lower() for w in VOLATILE) and not (top and k == "steps" and "conservation" in v)}
    if isinstance(v, list):
        return [timeless(x, False) for x in v]
    return v


def outputs(run_dir: Path, roots: list[str]) -> dict[str, str]:
    """relative path -> sha256 of every output a user reads (paths of the run, its store and
    its output folder written as placeholders; the JSON files less their timings)."""
    out: dict[str, str] = {}
    if not run_dir.exists():
        return out

    def digest(data: bytes) -> str:
        for i, r in enumerate(roots):
            data = data.replace(r.encode(), f"<ROOT{i}>".encode())
        return hashlib.sha256(data).hexdigest()[:16]

    for sub in COMPARED:
        for p in sorted((run_dir / sub).rglob("*")):
            if p.is_file():
                out[str(p.relative_to(run_dir))] = digest(p.read_bytes())
    for name in JSONS:
        p = run_dir / name
        if p.exists():
            out[name] = digest(json.dumps(timeless(json.loads(p.read_bytes())), sort_keys=True).encode())
    pub = run_dir.parent / "_published" / run_dir.name
    for p in sorted(pub.rglob("*")) if pub.exists() else []:
        rel = str(p.relative_to(pub))
        if not p.is_file() or rel in ("curate/run.json", "report.html", "curate/files.json"):
            continue  # run.json: where and how long (its config is mixture.yaml); files.json names run.json's digest
        data = p.read_bytes()
        if rel == "README.md":  # the card: the run's id, times and how much was reused are not the data's
            data = CARD_STEPS.sub(rb"\1", CARD_VOLATILE.sub(b"<V>", data))
        if p.suffix == ".json":
            data = json.dumps(timeless(json.loads(data)), sort_keys=True).encode()
        out["published/" + rel] = digest(data)
    return out


def _err(e: str | None, folder: Path) -> str | None:
    """An error with the folder it ran in left out (the same error in both runs is no difference)."""
    return e.replace(str(folder), "<FOLDER>") if e else e


def differences(a: dict, b: dict) -> list[str]:
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


# ----- the fuzzer ---------------------------------------------------------------------------------

class Fuzz:
    """A shared store taking a sequence of edits, each checked against a fresh run."""

    def __init__(self, tmp: Path, lib: fe.Library, state: dict | None = None, log=print):
        self.tmp, self.lib, self.log = Path(tmp), lib, log
        self.corpus = self.tmp / "corpus"
        self.shared = self.tmp / "shared"
        self.state = state or fe.base_state()
        self.n = 0
        self.history: list[tuple[str, list, str]] = []  # (kind, patch, what) applied since the first state
        self.counts: dict[str, int] = {}

    def yaml(self, folder: Path, name: str, state: dict | None = None) -> Path:
        """`<folder>/<name>.yaml`, its output `<folder>/out`: a fresh run's YAML differs from the
        shared store's only by the folder it is in (the same relative paths, the same config hash)."""
        text = fe.render(state or self.state, self.corpus, self.lib).replace("name: NAME", f"name: {name}")
        folder.mkdir(parents=True, exist_ok=True)
        y = folder / f"{name}.yaml"
        y.write_text(text)
        return y

    def first(self) -> None:
        self.lib.materialize(self.state, self.corpus)
        err = run_in_process(self.yaml(self.shared, "main"))
        if err is not None:
            raise RuntimeError(f"the first state does not run: {err}")
        self._pin_model("main")

    def _pin_model(self, name: str) -> None:
        """The run's trained model, copied: what a later `classifier pinned` edit names."""
        rd = self.shared / "out" / name
        try:
            steps = json.loads((rd / "run.json").read_text())["steps"]
        except (FileNotFoundError, ValueError, KeyError):
            return
        train = next((v for k, v in steps.items() if k.endswith("-train") and v.get("status") == "SUCCESS"), None)
        if train is not None:
            model = (rd / train["dir"]) / "model.bin"
            if model.exists():
                self.lib.pin(model, self.n)

    def step(self, rng: random.Random, kinds=None) -> dict | None:
        """One random edit, its incremental and fresh runs compared; the difference found, or None."""
        kind, patch, what = fe.edit(rng, self.state, self.lib, kinds)
        self.n += 1
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.history.append((kind, patch, what))
        return self.check(kind, patch, what)

    def name(self) -> str:
        """The variant's name: mostly `main`, edited and run again in place as a user does
        (its run directory replaced: steps keyed by it, such as the samples merge, rerun or
        are linked from its earlier self), every third a new one beside the others."""
        return "main" if self.n % 3 else f"v{self.n}"

    def check(self, kind: str, patch: list, what: str) -> dict | None:
        name = self.name()
        if kind == "gc":
            self._gc()
        self.state = fe.apply(self.state, patch)
        self.lib.materialize(self.state, self.corpus)
        t0 = time.time()
        err = run_in_process(self.yaml(self.shared, name))
        t1 = time.time()
        fresh = self.tmp / f"fresh-{name}"  # beside the shared folder: the same relative paths
        ferr = run_in_process(self.yaml(fresh, name))
        t2 = time.time()
        a = outputs(self.shared / "out" / name, self._roots(self.shared))
        b = outputs(fresh / "out" / name, self._roots(fresh))
        diff = differences(a, b)
        if not diff:  # kept where it differs, to look at
            shutil.rmtree(fresh, ignore_errors=True)
        self.log(f"[{self.n:4d}] {kind:13s} {what[:90]:90s} {t1 - t0:5.1f}s + fresh {t2 - t1:4.1f}s"
                 f"{'  ' + (err or '') if err else ''}{'  DIFFERS: ' + ', '.join(diff[:4]) if diff or _err(err, self.shared) != _err(ferr, fresh) else ''}")
        if err is None:
            self._pin_model(name)
        if diff or _err(err, self.shared) != _err(ferr, fresh):
            return {"edit": self.n, "kind": kind, "what": what, "files": diff, "error": err, "fresh_error": ferr}
        return None

    def concurrent(self, rng: random.Random) -> list[dict]:
        """Two variants of the current state (each a further random edit that touches no
        file) run at once in the shared store, each compared with a fresh run."""
        kinds = [k for k in fe.EDITS if k not in ("file", "gc", "eval", "verify")]
        states, ys = [], []
        for j in range(2):
            kind, patch, what = fe.edit(rng, self.state, self.lib, kinds)
            st = fe.apply(self.state, patch)
            states.append((st, what))
            ys.append(self.yaml(self.shared, f"c{self.n}-{j}", st))
        procs = [run_subprocess(y) for y in ys]
        errs = []
        for p in procs:
            _, e = p.communicate()
            errs.append(None if p.returncode == 0 else (e.strip().splitlines() or ["?"])[-1])
        found = []
        for j, ((st, what), err) in enumerate(zip(states, errs, strict=True)):
            name = f"c{self.n}-{j}"
            fresh = self.tmp / f"fresh-{name}"  # beside the shared folder: the same relative paths
            ferr = run_in_process(self.yaml(fresh, name, st))
            diff = differences(outputs(self.shared / "out" / name, self._roots(self.shared)),
                               outputs(fresh / "out" / name, self._roots(fresh)))
            shutil.rmtree(fresh, ignore_errors=True)
            self.log(f"[{self.n:4d}] concurrent    {what[:90]:90s}{'  DIFFERS: ' + ', '.join(diff[:4]) if diff or (err is None) != (ferr is None) else ''}")
            if diff or (err is None) != (ferr is None):
                found.append({"edit": self.n, "kind": "concurrent", "what": what, "files": diff, "error": err, "fresh_error": ferr})
        return found

    def _roots(self, folder: Path) -> list[str]:
        return [str(folder / "out" / "_store"), str(folder), str(self.corpus), str(self.lib.root)]

    def _gc(self) -> None:
        """Run directories but the last two removed, then `curate gc` of the shared output."""
        from pipeline.views import gc

        out = self.shared / "out"
        runs = sorted((d for d in out.iterdir() if d.is_dir() and not d.name.startswith("_") and (d / "run.json").exists()),
                      key=lambda d: d.stat().st_mtime)
        for d in runs[:-2]:
            shutil.rmtree(d)
        gc.collect(out)


def _replays(tmp: Path, lib: fe.Library, edits: list, tag: str) -> bool:
    """Whether `edits`, replayed one by one from the first state in a new store, end in a difference."""
    f = Fuzz(tmp / f"min-{tag}", lib, log=lambda *a: None)
    try:
        f.first()
        found = None
        for kind, patch, what in edits:
            f.n += 1
            found = f.check(kind, patch, what)
        return found is not None
    except RuntimeError:
        return False
    finally:
        shutil.rmtree(tmp / f"min-{tag}", ignore_errors=True)


def minimise(tmp: Path, lib: fe.Library, history: list, log=print, budget: int = 24) -> list | None:
    """The edits that cause a difference, its last edit always in: the shortest suffix of
    `history` that still ends in one (doubling), then each earlier edit of it dropped where
    the rest still does (one at a time, at most `budget` replays in all, each in a new store).
    None when no suffix does (the difference was not repeatable)."""
    n, tried, k = len(history), 0, 1
    found = None
    while tried < budget:
        tried += 1
        if _replays(tmp, lib, history[n - k:], str(tried)):
            found = history[n - k:]
            break
        if k >= n:
            return None
        k = min(n, 2 * k)
    if found is None:
        return None
    i = 0
    while i < len(found) - 1 and tried < budget:
        tried += 1
        fewer = found[:i] + found[i + 1:]
        if _replays(tmp, lib, fewer, str(tried)):
            found = fewer
        else:
            i += 1
    log(f"minimal repro: {len(found)} edit(s) from the first state: " + "; ".join(w for _, _, w in found))
    return [{"kind": k_, "patch": p, "what": w} for k_, p, w in found]


def fuzz(edits: int, seed: int, tmp: Path, wheel_dir: Path | None, concurrent_every: int = 10, log=print,
         stop_at_first: bool = False, kinds=None, lib: fe.Library | None = None, cover: bool = True) -> dict:
    """`edits` random edits from the first state, each checked; a difference minimised and
    the history started again from the state it left (a new store). With `cover`, the kinds
    come in shuffled rounds of every kind (so any 17 edits in a row hold each kind once);
    else each is drawn by its weight. Returns the counts."""
    rng = random.Random(seed)
    lib = lib or fe.Library.build(tmp / "lib", wheel_dir)
    names = sorted(kinds or fe.EDITS)
    rounds: list[str] = []
    found: list[dict] = []
    f = Fuzz(tmp / "s0", lib, log=log)
    f.first()
    done = 0
    counts: dict[str, int] = {}
    while done < edits:
        if cover and not rounds:
            rounds = rng.sample(names, len(names))
        d = f.step(rng, [rounds.pop()] if cover else names)
        done += 1
        if d is not None:
            d["repro"] = minimise(tmp, lib, f.history, log=log)
            found.append(d)
            if stop_at_first:
                break
            for k, v in f.counts.items():
                counts[k] = counts.get(k, 0) + v
            f = Fuzz(tmp / f"s{done}", lib, state=f.state, log=log)  # a new store from where it was
            f.first()
            continue
        if concurrent_every and done % concurrent_every == 0:
            found += f.concurrent(rng)
            counts["concurrent"] = counts.get("concurrent", 0) + 2
    for k, v in f.counts.items():
        counts[k] = counts.get(k, 0) + v
    return {"edits": done, "seed": seed, "differences": len(found), "found": found, "kinds": counts}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--edits", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tmp", type=Path, default=None, help="work folder (default: a temporary one, removed after)")
    ap.add_argument("--concurrent-every", type=int, default=10, help="two variants at once every N edits (0: never)")
    ap.add_argument("--wheel-dir", type=Path, default=ROOT / ".cache" / "wheels")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--kinds", default=None, help="edit kinds, comma-separated (default: all): " + ", ".join(fe.EDITS))
    ap.add_argument("--stop", action="store_true", help="stop at the first difference")
    ap.add_argument("--weighted", action="store_true", help="draw each edit's kind by its weight, not in rounds of every kind")
    a = ap.parse_args(argv)
    tmp = a.tmp or Path(tempfile.mkdtemp(prefix="curate-fuzz-"))
    t0 = time.time()
    try:
        res = fuzz(a.edits, a.seed, tmp, a.wheel_dir, a.concurrent_every, stop_at_first=a.stop,
                   kinds=a.kinds.split(",") if a.kinds else None, cover=not a.weighted)
    finally:
        if a.tmp is None:
            shutil.rmtree(tmp, ignore_errors=True)
    res["seconds"] = round(time.time() - t0, 1)
    print(f"{res['edits']} edits (seed {a.seed}), {res['kinds'].get('concurrent', 0)} concurrent variants: "
          f"{res['differences']} differences in {res['seconds']} s; edits by kind: "
          + ", ".join(f"{k} {v}" for k, v in sorted(res["kinds"].items())))
    if a.json:
        a.json.write_text(json.dumps(res, indent=1, default=str))
    return 1 if res["differences"] else 0


if __name__ == "__main__":
    sys.exit(main())
