"""Cost against corpus size: does every figure that should stay flat stay flat from N to 4N?

    python -m bench.scale [--docs 50000] [--scales 1,2,4] [--workers 2] [--json out.json]
                          [--partitions-x 4] [--skew]
    python -m bench.scale --docs 20000 --heavy 1000   # heavy LSH buckets uncut and cut
    python -m bench.scale --docs 25000 --scales 1,4 --opens   # + files opened for reading (strace)

A synthetic corpus of small crawl pages (the demo generator: real Wikipedia text in pages
with boilerplate, spam, exact and near copies) in input files of a fixed 5,000 documents,
at N, 2N and 4N; `dedup.partitions` grows with N (one per 20,000 documents, as the
defaults would at scale, where a partition holds 4M shuffle rows). The full chain runs:
language + Gopher + C4 filters, exact / fuzzy / paragraph dedup, a fastText classifier
trained in the run (wiki its positives), the mixture of the web source alone (so that it grows
with N: wiki's documents do not), its token files (Megatron and OLMo memmap, encoded per
document shard by `tokenize-*`, written per mixture shard by `tokens-*`), samples, report.

Each scale runs `curate` in a child process of its own (the driver), with `--workers`
Ray workers. Printed per step: files written, tasks, longest and total task seconds,
peak worker RSS; the driver's peak RSS and CPU seconds; the wall. Then the ratios from N
to 4N against the targets of issue 18 (files per document <= 1.25x, longest task <= 1.6x,
largest worker <= 1.3x, driver memory <= 1.5x, driver CPU seconds per document <= 1.3x).

`--partitions-x K` adds a run at the largest scale with K times the partitions (files per
document should not move). `--skew` adds skewed corpora at the smallest scale, with 4x
the partitions: one paragraph in 10% of the documents, one near-duplicate cluster of 5% and one of 10%,
beside an unskewed run; per reduce step, the largest task's input rows against the
step's mean, and the longest task.

Not a test: timings never gate CI.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "bench"
DOCS_PER_FILE = 5000
DOCS_PER_PARTITION = 20_000
TARGETS = {"files opened per document": 1.25, "files per document": 1.25, "longest task": 1.6, "largest worker RSS": 1.3, "driver peak RSS": 1.5,
           "driver CPU s per document": 1.3}
BOILERPLATE = ("This page uses cookies to improve your experience. By continuing to browse the site you agree to our "
               "use of cookies and to our privacy policy, which you can read at any time from the footer of every page.")


def build_corpus(n_docs: int, skew: str | None = None, wiki_docs: int | None = None) -> Path:
    """web/crawl-XXXXX.jsonl.zst of small pages, wiki/summaries_en.parquet; cached by size
    and skew (`paragraph`: one paragraph in 10% of documents; `cluster`: 5% of documents
    near-copies of one page; `bucket`: 10%, so every LSH band has a bucket of 10% of the
    documents). `wiki_docs`: the first that many Wikipedia rows (default all ~10,000: then
    the web pages alone grow with `n_docs`)."""
    import orjson
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    from pipeline import demo_data

    out = CACHE / f"scale-{n_docs}-{DOCS_PER_FILE}{'-' + skew if skew else ''}{f'-w{wiki_docs}' if wiki_docs else ''}"
    if (out / "_DONE").exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    (out / "web").mkdir(parents=True)
    (out / "wiki").mkdir()
    wheels = Path(os.environ.get("CURATE_WHEEL_DIR") or ROOT / ".cache" / "wheels")
    wiki = demo_data.wiki_records(demo_data.wheel(wheels))["en"]
    pq.write_table(pa.Table.from_pylist(wiki[:wiki_docs] if wiki_docs else wiki), out / "wiki" / "summaries_en.parquet", compression="zstd",
                   **({"row_group_size": 500} if wiki_docs else {}))  # Parquet splits by row groups: let max_shard_rows split it
    pages = demo_data.web_records(wiki, n_docs, seed=11)
    rng = random.Random(5)
    hub = None
    for i, p in enumerate(pages):
        p.pop("copy_of", None)
        if skew == "paragraph" and i % 10 == 3:
            p["text"] = p["text"] + "\n\n" + BOILERPLATE
        elif (skew == "cluster" and i % 20 == 7) or (skew == "bucket" and i % 10 == 7):
            if hub is None:
                hub = p["text"] + "\n\n" + " ".join(rng.choice(wiki)["text"] for _ in range(3))
            words = hub.split(" ")
            j = rng.randrange(len(words))
            words[j] = words[j] + "s"  # a one-word edit: Jaccard with the hub well above 0.8
            p["text"] = " ".join(words)
    cctx = zstandard.ZstdCompressor(level=3)
    for k in range(0, n_docs, DOCS_PER_FILE):
        lines = b"".join(orjson.dumps({"id": f"w{k + j:08d}", **p}) + b"\n" for j, p in enumerate(pages[k:k + DOCS_PER_FILE]))
        (out / "web" / f"crawl-{k // DOCS_PER_FILE:05d}.jsonl.zst").write_bytes(cctx.compress(lines))
    (out / "_DONE").write_text("")
    return out


SEMANTIC = [False]  # --semantic: dedup.semantic with its defaults too (embed-<source>, dedup-semantic-*)


def mixture_yaml(corpus: Path, out: Path, partitions: int, wiki_shard_rows: int | None = None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    y = out / "scale.yaml"
    y.write_text(f"""name: scale
seed: 0
tokenizer: gpt2
sources:
  web:
    paths: ["{corpus}/web/*.jsonl.zst"]
    id_field: id
    max_shard_rows: {DOCS_PER_FILE}
    filters: [english, gopher_quality, c4_quality]
    quality: {{classifier: wiki_vs_web, keep_fraction: 0.5}}
  wiki:
    paths: ["{corpus}/wiki/*.parquet"]
    id_field: id{f"{chr(10)}    max_shard_rows: {wiki_shard_rows}" if wiki_shard_rows else ""}
filters:
  english: {{type: language, languages: [en], min_score: 0.65}}
  gopher_quality: {{type: gopher_quality}}
  c4_quality: {{type: c4_quality, filter_no_terminal_punct: false}}
dedup:
  partitions: {partitions}
  exact: {{}}
  fuzzy: {{ngram: 5, num_perm: 112, bands: 14, threshold: 0.8, verify: true}}
  paragraph: {{min_chars: 50, max_occurrences: 5}}{chr(10) + "  semantic: {}" if SEMANTIC[0] else ""}
classifiers:
  wiki_vs_web: {{type: fasttext, positive: [wiki], negative: [web], max_examples_per_class: 5000, epochs: 3}}
mixture:
  weights: {{web: 1.0}}
  shard_rows: 5000
tokenize:
  formats: [megatron, memmap]
""")
    return y


# ---------------------------------------------------------------- one run, in a child process (the driver)


def _child(yaml_path: str, workers: int, output: str) -> None:
    """Run curate in this process and print the driver's own figures as JSON."""
    import resource

    from pipeline import config
    from pipeline.run import runner

    t0 = time.perf_counter()
    runner.run(config.load(Path(yaml_path)), workers=workers, output=output, log=lambda m: None, quiet=True)
    wall = time.perf_counter() - t0
    ru = resource.getrusage(resource.RUSAGE_SELF)
    hwm = 0.0
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) / 1024
    print("RESULT " + json.dumps({"wall": wall, "driver_cpu": ru.ru_utime + ru.ru_stime, "driver_rss_mb": hwm}))


OPENS = [False]  # --opens: count the files every process of the run opens for reading (strace)
_OPEN = re.compile(r'openat\(AT_FDCWD, "([^"]+)", (O_[A-Z_|]+)')


def count_opens(log: Path, steps_dir: Path) -> tuple[int, dict[str, int]]:
    """Files opened for reading under the step store's steps/ (not folders, not failed opens,
    not a temporary file reopened to be synced before its rename), in all, and per step (its
    folder's name without the hash), from `strace -f -e trace=openat`'s log."""
    total, per = 0, Counter()
    prefix = str(steps_dir) + "/"
    with open(log, errors="replace") as f:
        for line in f:
            if "= -1" in line:
                continue
            m = _OPEN.search(line)
            if not m or not m.group(1).startswith(prefix) or ".tmp-" in m.group(1):
                continue
            flags = m.group(2)
            if not flags.startswith("O_RDONLY") or "O_DIRECTORY" in flags:
                continue
            total += 1
            per[m.group(1)[len(prefix):].split("/", 1)[0].rsplit("-", 1)[0]] += 1
    return total, dict(per)


def run_one(corpus: Path, out: Path, workers: int, partitions: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    y = mixture_yaml(corpus, out, partitions)
    trace = ["strace", "-f", "-qq", "-e", "trace=openat", "-e", "signal=none", "-o", str(out / "opens.log")] \
        if OPENS[0] else []
    r = subprocess.run([*trace, sys.executable, "-m", "bench.scale", "--child", str(y), "--workers", str(workers),
                        "--output", str(out)], capture_output=True, text=True, cwd=ROOT)
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    if r.returncode or line is None:
        raise SystemExit(f"curate run failed:\n{r.stderr[-4000:]}")
    res = json.loads(line[7:])
    run = out / "scale"
    rec = json.loads((run / "run.json").read_text())
    led = json.loads((run / "ledger.json").read_text())
    res["docs"] = sum(e["in"] for e in led["sources"].values())
    res["web_docs"] = led["sources"]["web"]["in"]
    res["chars"] = sum(e["stages"][0].get("chars_out", 0) for e in led["sources"].values())  # after ingest
    steps = {}
    for name, st in rec["steps"].items():
        d = run / st["dir"]
        markers = _markers(d)
        walked = [(root, f) for root, _, fs_ in os.walk(d) for f in fs_]
        nfiles = len(walked)
        nbytes = sum(os.path.getsize(os.path.join(root, f)) for root, f in walked)
        # a coordinator (it takes no CPU slot and waits for its rounds' tasks) counts by its longest round task
        # (or its own CPU seconds, if more)
        secs = [max(m["round_task_longest"], m.get("coordinator_cpu_seconds", 0.0)) if "round_task_longest" in m
                else m.get("seconds", 0.0) for m in markers.values()]
        steps[name] = {"files": nfiles, "bytes": nbytes, "tasks": len(markers), "longest": max(secs or [0.0]), "total": sum(secs),
                       "rows": sum(m.get("rows", 0) or 0 for m in markers.values()),
                       "max_rows": max([m.get("rows", 0) or 0 for m in markers.values()] or [0]),
                       "rss": max([m.get("peak_rss_mb") or 0.0 for m in markers.values()] or [0.0]),
                       "wall": st.get("seconds", 0.0),
                       "coordinator_cpu": sum(m.get("coordinator_cpu_seconds", 0.0) for m in markers.values())}
    res["steps"] = steps
    res["files"] = sum(s["files"] for s in steps.values())
    res["longest"] = max(s["longest"] for s in steps.values())
    res["longest_step"] = max(steps, key=lambda k: steps[k]["longest"])
    res["worker_rss"] = max(s["rss"] for s in steps.values())
    if OPENS[0]:
        res["opens"], res["opens_by_step"] = count_opens(out / "opens.log", out / "_store" / "steps")
        (out / "opens.log").unlink()
    return res


def _markers(d: Path) -> dict:
    from pipeline.engine.step import read_markers

    return {str(k): v for k, v in read_markers(d).items()}


def _step_group(name: str) -> str:
    """Per-source steps folded into one row: filter-web, filter-wiki -> filter-*."""
    for pre in ("ids-", "unique-ids-", "id-index-", "ingest-", "filter-", "quality-", "tokenize-", "embed-"):
        if name.startswith(pre):
            rest = name[len(pre):]
            return pre + "*" + ("-threshold" if rest.endswith("-threshold") else "")
    if name.startswith("classify-"):
        return "classify-" + name.rsplit("-", 1)[-1]
    return name


def table(results: list[dict], labels: list[str]) -> str:
    groups: dict[str, list[dict]] = {}
    for r in results:
        g: dict[str, dict] = {}
        for name, s in r["steps"].items():
            e = g.setdefault(_step_group(name), {"files": 0, "tasks": 0, "longest": 0.0, "total": 0.0, "rss": 0.0})
            e["files"] += s["files"]
            e["tasks"] += s["tasks"]
            e["longest"] = max(e["longest"], s["longest"])
            e["total"] += s["total"]
            e["rss"] = max(e["rss"], s["rss"])
        for k, v in g.items():
            groups.setdefault(k, []).append(v)
    head = "| step | " + " | ".join(f"files {x}" for x in labels) + " | " + " | ".join(f"tasks {x}" for x in labels) \
        + " | " + " | ".join(f"longest s {x}" for x in labels) + " | longest ratio | " \
        + " | ".join(f"peak RSS MB {x}" for x in labels) + " |"
    lines = [head, "|" + " --- |" * (2 + 4 * len(labels))]
    for k, vs in groups.items():
        if len(vs) != len(labels):
            continue
        ratio = vs[-1]["longest"] / vs[0]["longest"] if vs[0]["longest"] > 0.05 else float("nan")
        lines.append(f"| {k} | " + " | ".join(f"{v['files']:,}" for v in vs) + " | " + " | ".join(f"{v['tasks']:,}" for v in vs)
                     + " | " + " | ".join(f"{v['longest']:.2f}" for v in vs) + f" | {ratio:.2f}x | "
                     + " | ".join(f"{v['rss']:.0f}" for v in vs) + " |")
    return "\n".join(lines)


def ratios(a: dict, b: dict) -> dict[str, float]:
    opens = {"files opened per document": (b["opens"] / b["docs"]) / (a["opens"] / a["docs"])} if "opens" in a else {}
    return {**opens,
        "files per document": (b["files"] / b["docs"]) / (a["files"] / a["docs"]),
        "longest task": b["longest"] / a["longest"],
        "largest worker RSS": b["worker_rss"] / a["worker_rss"],
        "driver peak RSS": b["driver_rss_mb"] / a["driver_rss_mb"],
        "driver CPU s per document": (b["driver_cpu"] / b["docs"]) / (a["driver_cpu"] / a["docs"]),
    }


SKEWED_STEPS = ("dedup-exact-reduce", "dedup-paragraph-reduce", "dedup-fuzzy-buckets", "dedup-fuzzy-verify",
                "dedup-fuzzy-clusters")


def skew_report(n: int, workers: int, work: Path, extra: dict) -> None:
    """The skewed corpora beside an unskewed one, all with 4x the partitions (so that one
    heavy key stands out against the others): per reduce step, the largest task's input
    rows and its ratio to the step's mean, and the slowest task."""
    parts = max(1, n // DOCS_PER_PARTITION) * 4
    runs = {}
    for kind in (None, "paragraph", "cluster", "bucket"):
        r = run_one(build_corpus(n, kind), work / f"n{n}-skew-{kind or 'none'}", workers, parts)
        runs[kind or "none"] = r
        extra[f"skew-{kind or 'none'}"] = r
    print(f"\nskew at {n:,} documents, {parts} partitions (paragraph: one paragraph in 10% of documents; "
          f"cluster: 5% of documents near-copies of one page; bucket: 10%)")
    print("| step | " + " | ".join(f"{k}: largest task rows (x mean) | {k}: longest s" for k in runs) + " |")
    print("|" + " --- |" * (1 + 2 * len(runs)))
    for step in SKEWED_STEPS:
        cells = []
        for r in runs.values():
            s = r["steps"].get(step)
            if not s:
                cells += ["", ""]
                continue
            mean = s["rows"] / max(1, s["tasks"])
            cells += [f"{s['max_rows']:,} ({s['max_rows'] / mean if mean else 0:.2f}x)", f"{s['longest']:.2f}"]
        print(f"| {step} | " + " | ".join(cells) + " |")
    base = runs["none"]
    for kind in ("paragraph", "cluster", "bucket"):
        r = runs[kind]
        print(f"skew {kind}: largest worker {r['worker_rss']:.0f} MB vs {base['worker_rss']:.0f} MB unskewed; "
              f"longest task {r['longest']:.2f} s ({r['longest_step']}) vs {base['longest']:.2f} s")


def heavy_report(n: int, workers: int, work: Path, rows_per_partition: int) -> dict:
    """The 10%-bucket corpus with partitions small enough that one band's bucket stands out
    (about `rows_per_partition` shuffle rows each, as at 10^9 documents a partition's 4
    million rows are small beside a 1% template), without and with heavy buckets cut into
    blocks of half a partition (CURATE_FUZZY_SALT_ROWS; pipeline/steps/dedup/salt.py)."""
    import pyarrow.parquet as pq

    parts = max(1, n * 14 // rows_per_partition)
    corpus = build_corpus(n, "bucket")
    out = {}
    for label, salt in (("uncut", None), ("cut", str(rows_per_partition // 2))):
        if salt:
            os.environ["CURATE_FUZZY_SALT_ROWS"] = salt
        try:
            r = run_one(corpus, work / f"n{n}-heavy-{label}", workers, parts)
        finally:
            os.environ.pop("CURATE_FUZZY_SALT_ROWS", None)
        run = work / f"n{n}-heavy-{label}" / "scale"
        d = run / json.loads((run / "run.json").read_text())["steps"]["dedup-fuzzy"]["dir"]
        removed = set()
        for f in sorted(d.glob("*/part-*.parquet")):
            t = pq.read_table(f, columns=["id", "keep"]).to_pylist()
            removed |= {x["id"] for x in t if x["keep"] is False}
        r["removed"] = removed
        out[label] = r
    print(f"\nheavy buckets at {n:,} documents (10% of them near-copies of one page), {parts} partitions "
          f"(~{rows_per_partition:,} rows each), cut into blocks of {rows_per_partition // 2:,}:")
    print("| run | buckets: largest task rows (x mean) | buckets: longest s | sample + heavy tasks, s | fuzzy removals | wall s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for label, r in out.items():
        s = r["steps"]["dedup-fuzzy-buckets"]
        mean = s["rows"] / max(1, s["tasks"])
        extra = [r["steps"].get(k, {}) for k in ("dedup-fuzzy-sample", "dedup-fuzzy-heavy")]
        print(f"| {label} | {s['max_rows']:,} ({s['max_rows'] / mean:.2f}x) | {s['longest']:.2f} | "
              f"{sum(e.get('tasks', 0) for e in extra)}, {sum(e.get('total', 0.0) for e in extra):.2f} | "
              f"{len(r['removed']):,} | {r['wall']:.1f} |")
    a, b = out["uncut"]["removed"], out["cut"]["removed"]
    print(f"removed by fuzzy dedup in one run only: {len(a - b)} uncut, {len(b - a)} cut")
    return {k: {**v, "removed": len(v["removed"])} for k, v in out.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=50_000, help="N, documents at scale 1 (default 50,000)")
    ap.add_argument("--scales", default="1,2,4")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--partitions-x", type=int, default=0, help="also run the largest scale with this many times the partitions")
    ap.add_argument("--skew", action="store_true", help="also run skewed corpora at the smallest scale")
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument("--semantic", action="store_true", help="add dedup.semantic (its defaults) to the mixture")
    ap.add_argument("--heavy", type=int, default=0, metavar="ROWS",
                    help="only compare heavy LSH buckets uncut and cut, with partitions of about ROWS shuffle rows")
    ap.add_argument("--docs-per-partition", type=int, default=DOCS_PER_PARTITION,
                    help="dedup.partitions: one per this many documents (default 20,000; smaller puts the smallest "
                    "scale past one partition, where the readers' fan-in shows)")
    ap.add_argument("--opens", action="store_true", help="count the files the run's processes open for reading under "
                    "steps/ (strace -f; slower), per document and per step")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--output", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return _child(a.child, a.workers, a.output)
    SEMANTIC[0] = a.semantic
    OPENS[0] = a.opens
    if a.heavy:
        res = heavy_report(a.docs, a.workers, CACHE / "scale-runs", a.heavy)
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=1, default=str))
        return 0
    scales = [int(x) for x in a.scales.split(",")]
    work = CACHE / "scale-runs"
    results, labels = [], []
    for k in scales:
        n = a.docs * k
        corpus = build_corpus(n)
        parts = max(1, n // a.docs_per_partition)
        t = time.perf_counter()
        r = run_one(corpus, work / f"n{n}", a.workers, parts)
        r.update({"n": n, "partitions": parts})
        results.append(r)
        labels.append(f"{k}N")
        print(f"{k}N = {n:,} docs, {parts} partitions: wall {r['wall']:.1f} s, {r['files']:,} files under steps/, "
              f"longest task {r['longest']:.2f} s ({r['longest_step']}), largest worker {r['worker_rss']:.0f} MB, "
              f"driver {r['driver_rss_mb']:.0f} MB and {r['driver_cpu']:.1f} CPU s ({time.perf_counter() - t:.0f} s)", flush=True)
    if OPENS[0]:
        print("\nfiles opened for reading under steps/, by the step whose files they are (" + " / ".join(labels) + "):")
        for name in sorted(set().union(*(r["opens_by_step"] for r in results))):
            cells = [r["opens_by_step"].get(name, 0) for r in results]
            per = [c / r["docs"] for c, r in zip(cells, results)]
            print(f"  {name:<32} " + " ".join(f"{c:>7,}" for c in cells) + "   "
                  + (f"x{per[-1] / per[0]:.2f} per document" if per[0] else ""))
        print("  " + " / ".join(f"{r['opens']:,} in all, {r['opens'] / r['docs']:.4f} a document" for r in results))
    print()
    print(table(results, labels))
    print()
    rt = ratios(results[0], results[-1])
    print(f"from {labels[0]} to {labels[-1]} (target):")
    for name, v in rt.items():
        print(f"  {name:<28} {v:5.2f}x  (<= {TARGETS[name]}x)  {'ok' if v <= TARGETS[name] else 'MISSED'}")
    extra = {}
    if a.partitions_x:
        n = a.docs * scales[-1]
        parts = max(1, n // DOCS_PER_PARTITION) * a.partitions_x
        r = run_one(build_corpus(n), work / f"n{n}-p{parts}", a.workers, parts)
        r.update({"n": n, "partitions": parts})
        extra["partitions"] = r
        base = results[-1]
        print(f"\n{labels[-1]} with {parts} partitions ({a.partitions_x}x): {r['files']:,} files "
              f"({r['files'] / r['docs']:.4f} per document, {base['files'] / base['docs']:.4f} with {base['partitions']})")
    if a.skew:
        skew_report(a.docs * scales[0], a.workers, work, extra)
    if a.json:
        Path(a.json).write_text(json.dumps({"results": results, "ratios": rt, "extra": extra}, indent=1))


if __name__ == "__main__":
    main()
