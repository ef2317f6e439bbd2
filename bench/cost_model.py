"""A cost model to 1 B and 25 B documents, computed from the per-shard figures bench.scale
measured, with every assumption printed beside the table.

    python -m bench.scale --json scale.json && python -m bench.cost_model scale.json [--nodes 100 --cores 64]

For each step of the largest measured run: CPU seconds per document (per-shard steps),
per shuffle row (reducers) or per shard summary (merges), objects written per task, bytes
written per document, peak RSS per task. Extrapolated to D documents on nodes x cores:

- document shards S = D / 50,000 (`max_shard_rows`' default; the bench's shards are 5,000
  documents, so the per-document figures carry 10x their fixed per-task cost);
- reduce partitions P = shuffle rows / 4,000,000 (the default, `dedup.partitions` unset);
  rows per document as measured (exact 1, fuzzy `bands`, paragraph as counted);
- text-bound steps (ingest, filters, signatures, fetch, verify, paragraph, scoring, samples
  picks, mixture) scale with bytes: x (TEXT_BYTES / the bench's average document bytes);
- a step's wall = its CPU seconds / cores (they are embarrassingly parallel), and steps run
  one after another (the executor overlaps ready steps; this is the pessimistic sum);
- merge steps (one task per source) cost their measured seconds per shard x S;
- the driver's marginal CPU per task (from the smallest to the largest run) x the number of tasks.
Not modelled: object-store latency per request, stragglers, retries, network.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

TEXT_BYTES = 3000  # FineWeb: ~15 T GPT-2 tokens over ~25 B documents ~ 600 tokens ~ 3 KB of text per document
SHARD_DOCS = 50_000
PARTITION_ROWS = 4_000_000
TEXT_STEPS = ("ingest-", "filter-", "dedup-fuzzy-signatures", "dedup-fuzzy-fetch", "dedup-fuzzy-verify", "dedup-paragraph", "classify-",
              "samples-pick", "mix-route", "mix", "dedup-exact-map", "ids-")
REDUCERS = ("dedup-exact-reduce", "dedup-fuzzy-buckets", "dedup-paragraph-reduce", "unique-ids-", "id-index-")
MERGES = ("mix-select", "samples", "dedup-fuzzy-clusters", "classify-wiki_vs_web-train")
FIXED_OUTPUT = ("-train", "mix-select", "-threshold")  # a model, a cutoff: their output does not grow with the corpus
BYTES_PER_ROW = {"dedup-exact-reduce": 48, "dedup-fuzzy-buckets": 24, "dedup-paragraph-reduce": 60, "unique-ids-": 40}


def kind(name: str) -> str:
    if name.startswith(REDUCERS):
        return "reduce"
    if name in MERGES or name.endswith("-threshold"):
        return "merge"
    return "shard"


def model(run: dict, docs: float, cores: int, shard_docs: int = SHARD_DOCS) -> list[dict]:
    n = run["docs"]
    avg_bytes = run["chars"] / n
    text_factor = TEXT_BYTES / avg_bytes
    S = math.ceil(docs / shard_docs)
    bench_shards = max(s["tasks"] for s in run["steps"].values())
    rows_per_doc = {name: st["rows"] / n for name, st in run["steps"].items()}
    out = []
    for name, st in run["steps"].items():
        k = kind(name)
        f = text_factor if name.startswith(TEXT_STEPS) else 1.0
        if k == "shard":
            cpu = st["total"] / n * docs * f
            tasks = math.ceil(S * st["tasks"] / bench_shards) if st["tasks"] > 1 else 1
            rss = st["rss"]
        elif k == "reduce":
            src = {"dedup-exact-reduce": "dedup-exact-map", "dedup-fuzzy-buckets": "dedup-fuzzy-signatures",
                   "dedup-paragraph-reduce": "dedup-paragraph-map"}.get(name)
            rows = (run["steps"][src]["rows"] if src else st["rows"]) / n * docs
            if name == "dedup-fuzzy-buckets":
                rows *= 14  # bands: the signatures marker counts documents, the shuffle carries one row per band
            tasks = max(1, math.ceil(rows / PARTITION_ROWS))
            cpu = st["total"] / max(st["rows"], 1) * rows if st["rows"] else st["total"] / n * docs
            rss = 350 + BYTES_PER_ROW.get(name.rsplit("-", 0)[0], 50) * PARTITION_ROWS / 2**20 * 3  # rows + sort + arrow
        else:
            tasks = 1
            cpu = st["longest"] / bench_shards * S  # a merge reads one summary per shard
            rss = st["rss"]
        out.append({"step": name, "kind": k, "tasks": tasks, "objects": math.ceil(st["files"] / max(st["tasks"], 1) * tasks),
                    "bytes_written": st["bytes"] if name.endswith(FIXED_OUTPUT) else st["bytes"] / n * docs * (f if k == "shard" else 1.0),
                    "cpu_s": cpu,
                    "wall_h": (cpu / cores if k != "merge" else cpu) / 3600, "rss_mb": rss, "rows_per_doc": rows_per_doc[name]})
    by = {r["step"]: r for r in out}
    edges = run["steps"].get("dedup-fuzzy-verify", {}).get("rows", 0) / n * docs
    for r in out:
        r["shuffle_reads"] = 2 * S * _readers_of(r["step"], by, edges)
    return out


def _readers_of(name: str, by: dict, edges: float) -> int:
    """How many shuffle files each of the S per-shard maps (or readers) meets in this step:
    a reducer reads its segment of every map's file, a per-shard step its segment of every
    reducer's file (an index read and a data read each)."""
    tasks = lambda pre: sum(r["tasks"] for k, r in by.items() if k.startswith(pre))  # noqa: E731
    if name.startswith(REDUCERS) or name == "dedup-fuzzy-verify":
        return by[name]["tasks"]
    source = {"dedup-exact": "dedup-exact-reduce", "dedup-paragraph": "dedup-paragraph-reduce",
              "dedup-fuzzy-fetch": "dedup-fuzzy-buckets"}.get(name)
    if source:
        return tasks(source)
    if name == "dedup-fuzzy":
        return max(1, math.ceil(edges / 5_000_000))  # the clusters step's outputs, one per edge partition
    if name.startswith("ingest-"):
        return tasks("unique-ids-" + name[len("ingest-"):])
    if name == "mix":
        return by[name]["tasks"]  # each mix task reads its segment of every route file
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.cost_model", description=__doc__.split("\n\n")[0])
    ap.add_argument("scale_json")
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--cores", type=int, default=64)
    ap.add_argument("--shard-docs", type=int, default=SHARD_DOCS, help="documents per shard (max_shard_rows)")
    a = ap.parse_args(argv)
    data = json.loads(Path(a.scale_json).read_text())
    run = data["results"][-1]
    cores = a.nodes * a.cores
    first = data["results"][0]
    ntasks = [sum(s["tasks"] for s in r["steps"].values()) for r in (first, run)]
    average = run["driver_cpu"] / ntasks[1]  # with the fixed costs (Ray start, planning, report)
    # the marginal cost of a task, from the smallest to the largest run (the fixed costs cancel)
    driver_per_task = (run["driver_cpu"] - first["driver_cpu"]) / (ntasks[1] - ntasks[0]) if ntasks[1] > ntasks[0] else average
    print(f"measured: {run['docs']:,} documents, {run['chars'] / run['docs']:.0f} bytes each on average; "
          f"modelled: {TEXT_BYTES} bytes per document, {a.shard_docs:,} per shard, {a.nodes} nodes x {a.cores} cores")
    for docs in (1e9, 25e9):
        rows = model(run, docs, cores, a.shard_docs)
        print(f"\n### {docs / 1e9:g} B documents\n")
        print("| step | tasks | objects written | GB written | shuffle reads | CPU hours | wall hours | peak RSS per task MB |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in rows:
            print(f"| {r['step']} | {r['tasks']:,} | {r['objects']:,} | {r['bytes_written'] / 1e9:,.1f} | {r['shuffle_reads']:.2g} | "
                  f"{r['cpu_s'] / 3600:,.1f} | {r['wall_h']:.2f} | {r['rss_mb']:.0f} |")
        tasks = sum(r["tasks"] for r in rows)
        reads = sum(r["shuffle_reads"] for r in rows)
        print(f"| **total** | {tasks:,} | {sum(r['objects'] for r in rows):,} | {sum(r['bytes_written'] for r in rows) / 1e9:,.0f} | {reads:.2g} | "
              f"{sum(r['cpu_s'] for r in rows) / 3600:,.0f} | {sum(r['wall_h'] for r in rows):.1f} | |")
        print(f"\nshuffle reads: {reads / docs:.3f} per document (index + data ranged reads; on an object store, GETs)")
        print(f"driver: {driver_per_task * 1000:.2f} ms CPU per task (marginal, {ntasks[0]:,} -> {ntasks[1]:,} tasks; "
              f"{average * 1000:.1f} ms with the fixed costs) -> {driver_per_task * tasks / 3600:.2f} h for {tasks:,} tasks")


if __name__ == "__main__":
    main()
