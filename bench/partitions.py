"""How evenly the dedup reducers share their work (issue 70): every reduce step's largest task
against the mean of its tasks, in rows, with `dedup.partitions: 8`.

The corpus is the filter benchmarks' kinds of text (bench/textkinds.py: crawl-like wiki
pages, long technical documents, code, non-English prose, short texts and spam), each with
planted exact and near copies (a word in twenty changed) and a boilerplate paragraph, so
that every dedup kind has work: exact, fuzzy (buckets, verify, clusters), paragraph and
semantic (WordLlama embeddings, k-means clusters). A step whose work follows its keys (a
bucket's rows, a cluster's members) must spread them over its reducers; semantic dedup once
sent every row to one (cluster numbers below 2^32 all fell in partition 0).

    python -m bench.partitions [--docs 1500] [--partitions 8] [--clusters 64] [--json F]

Prints, per reduce step, its tasks, the largest task's rows, the mean and their ratio
(target: at most 2x). Not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
REDUCERS = ("dedup-exact-reduce", "dedup-paragraph-reduce", "dedup-fuzzy-buckets", "dedup-fuzzy-verify",
            "dedup-fuzzy-clusters", "dedup-semantic-reduce")
BOILER = "This page is part of our archive. All content is provided as is, without warranty of any kind; see the terms."


def corpus(folder: Path, n: int) -> Path:
    """n documents of each kind, a file per kind, with copies, near copies and boilerplate planted."""
    from bench import textkinds

    rng = random.Random(70)
    makers = {"wiki": textkinds.wiki_pages, "tech": textkinds.technical_docs, "code": textkinds.code,
              "intl": textkinds.non_english, "short": textkinds.short_and_spam}
    folder.mkdir(parents=True, exist_ok=True)
    for name, make in makers.items():
        texts = make(n)
        docs = []
        for i, t in enumerate(texts):
            docs.append(t + ("\n\n" + BOILER if i % 7 == 0 else ""))
            if i % 10 == 0:
                docs.append(t)  # an exact copy
            if i % 10 == 5:
                words = t.split(" ")
                for k in range(0, len(words), 20):
                    words[k] = rng.choice(["the", "a", "this", "that"])
                docs.append(" ".join(words))  # a near copy
        (folder / f"{name}.jsonl").write_bytes(b"".join(orjson.dumps({"id": f"{name}{i}", "text": t}) + b"\n"
                                                        for i, t in enumerate(docs)))
    return folder


def run(folder: Path, partitions: int, clusters: int) -> Path:
    y = folder / "p.yaml"
    y.write_text(f"""name: p
output: out
sources:
  docs: {{paths: ["{folder}/*.jsonl"], id_field: id, max_shard_rows: 1000}}
dedup:
  partitions: {partitions}
  exact: {{}}
  fuzzy: {{}}
  paragraph: {{}}
  semantic: {{clusters: {clusters}}}
mixture: {{weights: {{docs: 1.0}}}}
""")
    r = subprocess.run([sys.executable, "-m", "pipeline", "run", str(y), "--quiet"], cwd=ROOT, capture_output=True, text=True)
    if r.returncode:
        sys.exit(r.stderr[-3000:])
    return folder / "out" / "p"


def balance(run_dir: Path) -> dict[str, dict]:
    """Per reduce step: tasks, their rows (each task's input rows, from its marker), the largest and the mean."""
    from pipeline.engine.step import read_markers

    steps = json.loads((run_dir / "run.json").read_text())["steps"]
    out = {}
    for name in REDUCERS:
        if name not in steps:
            continue
        ms = read_markers(run_dir / steps[name]["dir"]).values()
        rows = [int(m.get("rows", 0)) for m in ms]
        if not rows:
            continue
        mean = sum(rows) / len(rows)
        out[name] = {"tasks": len(rows), "rows": sum(rows), "largest": max(rows), "mean": round(mean, 1),
                     "ratio": round(max(rows) / mean, 2) if mean else 0.0}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=1500, help="documents of each kind, before the planted copies")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--clusters", type=int, default=64, help="semantic dedup's k-means clusters (its partitions are at most k)")
    ap.add_argument("--tmp", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    folder = corpus((a.tmp or Path(tempfile.mkdtemp(prefix="curate-parts-"))) / "corpus", a.docs)
    res = balance(run(folder, a.partitions, a.clusters))
    print(f"dedup reducers over {a.partitions} partitions, {a.docs:,} documents of each of 5 kinds (+ copies):")
    print("| step | tasks | rows | largest task | mean | largest / mean |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, r in res.items():
        print(f"| {name} | {r['tasks']} | {r['rows']:,} | {r['largest']:,} | {r['mean']:,} | {r['ratio']}x |")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
