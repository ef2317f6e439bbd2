"""Small runs against their work (issue 35): a 1,000-document run and a weights-only variant
of the demo, every step on Ray (`CURATE_INLINE_DOCS=0`, as before small steps ran in
process) and with the default (small steps in curate's own process while no Ray is up).

For each: the whole command's wall time (`curate run` in a subprocess, as a user types it),
the sum of its computed shards' task seconds (their markers), the target 2 x work + 3 s,
and whether the mixture bytes are the same in both modes.

    python -m bench.small [--docs 1000] [--repeat 3] [--demo data/demo]

The variant part needs the demo corpus (`curate demo-data data/demo`) and runs the demo
once first if its steps are not in the store. Not a test: timings never gate CI.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SMALL = """
name: {name}
output: {out}
tokenizer: gpt2
sources:
  web: {{paths: ["{docs}"], filters: [rep, qual]}}
filters:
  rep: {{type: gopher_repetition}}
  qual: {{type: gopher_quality}}
dedup: {{exact: {{}}}}
mixture: {{target_tokens: 100000, weights: {{web: 1.0}}}}
"""


def run(yaml: Path, inline: bool) -> tuple[float, float, dict]:
    """(wall seconds, task seconds of the shards this run computed, mixture file -> sha256)."""
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    if inline:
        env.pop("CURATE_INLINE_DOCS", None)
    else:
        env["CURATE_INLINE_DOCS"] = "0"
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "pipeline", "run", str(yaml), "--quiet"], env=env,
                       capture_output=True, text=True)
    wall = time.time() - t0
    if r.returncode:
        sys.exit(f"{yaml}: curate run failed:\n{r.stderr[-2000:]}")
    text = yaml.read_text()
    name = re.search(r"^name: (\S+)", text, re.M).group(1)
    out = Path(re.search(r"^output: (\S+)", text, re.M).group(1))
    out = out if out.is_absolute() else (yaml.parent / out).resolve()
    rec = json.loads((out / name / "run.json").read_text())
    task = 0.0
    for step, v in rec["steps"].items():
        if not v["computed"]:
            continue
        for f in glob.glob(str(out / "_store" / "steps" / f"{step}-*" / "_markers" / "*.json")):
            m = json.loads(Path(f).read_text())
            if m.get("writer", "").startswith(rec["run_id"]):
                task += m.get("seconds", 0)
    man = json.loads((out / name / "manifest.json").read_text())
    return wall, task, {f["path"]: f["sha256"] for f in man["files"]}


def small_runs(corpus: Path, ndocs: int, repeat: int, tmp: Path) -> None:
    import zstandard

    src = sorted((corpus / "web").glob("*.jsonl.zst"))[0]
    lines = io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(src.open("rb"))).read().splitlines()[:ndocs]
    docs = tmp / "docs.jsonl"
    docs.write_text("\n".join(lines) + "\n")
    print(f"{len(lines):,}-document run (language-free: two Gopher filters, exact dedup, the mixture), fresh store each time")
    rows = {}
    for inline in (False, True):
        walls, tasks, shas = [], [], set()
        for i in range(repeat):
            y = tmp / f"s-{int(inline)}-{i}.yaml"
            y.write_text(SMALL.format(name="small", out=tmp / f"out-{int(inline)}-{i}", docs=docs))
            w, t, sha = run(y, inline)
            walls.append(w)
            tasks.append(t)
            shas.add(hashlib.sha256(json.dumps(sha, sort_keys=True).encode()).hexdigest())
        rows[inline] = (statistics.median(walls), statistics.median(tasks), shas)
    _table(rows)


def variant_runs(corpus: Path, repeat: int, tmp: Path) -> None:
    base = (ROOT / "mixtures" / "demo.yaml").read_text().replace("../data/demo", str(corpus.resolve()))
    base = base.replace("output: ../out", f"output: {tmp / 'out'}").replace("dir: ../out/_published/{name}", f"dir: {tmp}/pub/{{name}}")
    y = tmp / "demo.yaml"
    y.write_text(base)
    print("the demo, first run (fills the store) ...", flush=True)
    run(y, False)
    print("weights-only variants of the demo (web/q5 and web/q3-q4 shifted; every step but the mix reused)")
    rows = {}
    k = 0
    for inline in (False, True):
        walls, tasks = [], []
        for _ in range(repeat):
            k += 1
            v = tmp / f"v{k}.yaml"
            v.write_text(base.replace("name: demo", f"name: demo-v{k}").replace(
                "web/q5: 0.25, web/q3-q4: 0.35", f"web/q5: {0.25 - k / 100:.2f}, web/q3-q4: {0.35 + k / 100:.2f}"))
            w, t, _ = run(v, inline)
            walls.append(w)
            tasks.append(t)
        rows[inline] = (statistics.median(walls), statistics.median(tasks), None)
    _table(rows)


def _table(rows: dict) -> None:
    print("| every step | wall (median) | task seconds | target 2 x work + 3 s | within |")
    print("| --- | ---: | ---: | ---: | --- |")
    for inline, (w, t, _) in rows.items():
        target = 2 * t + 3
        print(f"| {'small steps in process (default)' if inline else 'on Ray (CURATE_INLINE_DOCS=0)'} | {w:.2f} s | "
              f"{t:.2f} s | {target:.2f} s | {'yes' if w <= target else 'no'} |")
    if all(r[2] is not None for r in rows.values()):
        same = len(rows[True][2] | rows[False][2]) == 1
        print(f"same mixture bytes in every run: {same}")
    print(f"wall, Ray / in process: {rows[False][0] / rows[True][0]:.2f}x\n", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--demo", default=str(ROOT / "data" / "demo"), help="the demo corpus (curate demo-data DIR)")
    ap.add_argument("--no-variant", action="store_true", help="only the small run")
    a = ap.parse_args(argv)
    corpus = Path(a.demo)
    if not (corpus / "web").is_dir():
        sys.exit(f"{corpus}: no demo corpus; run `curate demo-data {corpus}` first")
    with tempfile.TemporaryDirectory(prefix="bench-small-") as t:
        small_runs(corpus, a.docs, a.repeat, Path(t))
        if not a.no_variant:
            variant_runs(corpus, a.repeat, Path(t))


if __name__ == "__main__":
    main()
