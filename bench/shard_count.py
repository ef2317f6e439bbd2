"""The same documents in K times as many shards (issue 70): what the command costs beyond its
tasks, counting every process (a cgroup: the driver, Ray's processes, idle workers), against
the number of shards. Flat per shard, or falling, is the target: the driver's work is
linear in shards at most.

Each run is `curate run` on bench.scale's corpus (crawl-like pages and Wikipedia summaries:
exact, fuzzy and paragraph dedup, a classifier, the mixture, token files), once with its
default shards and once with `max_shard_rows` cut K-fold; the tasks' CPU is the sum of
their markers' `cpu_seconds`.

    python -m bench.shard_count [--docs 20000] [--x 13] [--workers 2]

Not a test: timings never gate CI.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(corpus: Path, out: Path, shard_rows: int, workers: int) -> dict:
    from bench import scale
    from bench.reuse import cpu_run
    from pipeline.engine.step import read_markers

    shutil.rmtree(out, ignore_errors=True)
    y = scale.mixture_yaml(corpus, out, max(1, 20_000 // scale.DOCS_PER_PARTITION))
    text = y.read_text()
    text = re.sub(r"max_shard_rows: \d+", f"max_shard_rows: {shard_rows}", text)
    text = text.replace("    id_field: id\nfilters:", f"    id_field: id\n    max_shard_rows: {shard_rows}\nfilters:")
    # compressed JSONL under 8 MB is one shard whatever its rows: a small max_shard_bytes has every
    # file scanned for its line count (in both runs), then split by rows
    text = text.replace(f"    max_shard_rows: {shard_rows}\n", f"    max_shard_rows: {shard_rows}\n    max_shard_bytes: 65536\n")
    text = text.replace("name: scale\n", f"name: scale\noutput: {out}\n")
    y.write_text(text)
    cpu, wall = cpu_run(y, f"sc{shard_rows}", ["--workers", str(workers)])
    run_dir = out / "scale"
    steps = json.loads((run_dir / "run.json").read_text())["steps"]
    tasks = shards = 0.0
    doc_shards = 0
    for name, rec in steps.items():
        if rec.get("status") != "SUCCESS":
            continue
        ms = read_markers(run_dir / rec["dir"])
        tasks += sum(m.get("cpu_seconds", 0.0) for m in ms.values())
        shards += len(ms)
        if name.startswith("ingest-"):
            doc_shards += len(ms)
    return {"shard_rows": shard_rows, "document_shards": doc_shards, "shards": int(shards), "cpu": round(cpu, 2),
            "tasks_cpu": round(tasks, 2), "beyond_tasks": round(cpu - tasks, 2), "wall": round(wall, 1)}


def main(argv=None) -> int:
    from bench import scale

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=20_000)
    ap.add_argument("--x", type=int, default=13, help="how many times as many shards the second run has")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--tmp", type=Path, default=None)
    a = ap.parse_args(argv)
    work = a.tmp or Path(tempfile.mkdtemp(prefix="curate-shards-"))
    corpus = scale.build_corpus(a.docs)
    base = scale.DOCS_PER_FILE
    rows = [run(corpus, work / f"r{base}", base, a.workers), run(corpus, work / f"r{base // a.x}", base // a.x, a.workers)]
    print(f"{a.docs:,} documents, {a.workers} workers; CPU of every process of `curate run` (a cgroup), less its tasks':")
    print("| max_shard_rows | document shards | shards (all steps) | command CPU s | tasks CPU s | beyond the tasks s | "
          "beyond the tasks, ms a shard |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['shard_rows']:,} | {r['document_shards']:,} | {r['shards']:,} | {r['cpu']} | {r['tasks_cpu']} | "
              f"{r['beyond_tasks']} | {1000 * r['beyond_tasks'] / max(1, r['shards']):.1f} |")
    a0, a1 = rows
    print(f"shards x{a1['shards'] / a0['shards']:.1f}; beyond the tasks x{a1['beyond_tasks'] / max(a0['beyond_tasks'], 1e-9):.2f} "
          f"(per shard x{(a1['beyond_tasks'] / a1['shards']) / max(a0['beyond_tasks'] / a0['shards'], 1e-9):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
