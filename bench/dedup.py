"""Near-duplicate dedup: datatrove vs Curate on the same documents, in the same run.

    python -m bench.dedup [--docs 6000] [--workers 1]

1. Signatures, one core, in-process: Curate's signature path (normalise, shingle,
   MinHash, LSH band keys; pipeline/steps/dedup/fuzzy.py:sig_shard's inner loop) against
   datatrove's MinhashDedupSignature.run(), both with 5-grams, 14 bands x 8 rows. MB/s
   counts the UTF-8 bytes of the input text.
2. The whole fuzzy dedup, from JSONL on disk to the decision of what to remove:
   Curate: `curate run` with only `dedup.fuzzy` (verified), `--workers N`, timed from the
   steps' own wall times in run.json (signatures, buckets, fetch, verify, clusters, apply), plus
   the whole command; peak memory is the largest worker RSS in the shard markers.
   datatrove: its four stages (signature -> buckets -> cluster -> filter), each run as
   its tasks in one process one after another (one core), in a child process whose peak
   RSS is reported.
   The removed sets are compared: datatrove removes every pair that shares a bucket;
   Curate removes only pairs whose true Jaccard is at least the threshold.

The corpus is the demo crawl generator (real Wikipedia text in crawl-like pages, with
planted exact and near copies), article pages lengthened to about 2.7 KB. Not a test:
timings never gate CI.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.corpora import crawl_pages as corpus


def curate_signatures(texts: list[str]) -> float:
    import numpy as np

    from pipeline.shards import text as T
    from pipeline.steps.dedup.fuzzy import CHUNK_BYTES, chunks, okey

    a, b = T.permutations(112, 0)
    ids = [str(i) for i in range(len(texts))]
    t0 = time.perf_counter()
    for i in range(0, len(texts), 1024):  # as sig_shard: batches of documents, numpy passes of <= 1 MB
        batch = texts[i : i + 1024]
        lengths = np.array([len(t.encode()) for t in batch])
        for lo, hi in chunks(lengths, CHUNK_BYTES):
            h, d = T.shingles(batch[lo:hi], 5, ["case", "punctuation", "digits"])
            sig, which = T.minhash(h, d, hi - lo, a, b)
            T.band_buckets(sig, 14, 8)
            okey(0, [ids[i + lo + int(k)] for k in which])
    return time.perf_counter() - t0


def datatrove_signatures(texts: list[str], folder: str) -> float:
    from datatrove.data import Document
    from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupSignature

    step = MinhashDedupSignature(output_folder=folder, config=MinhashConfig())
    docs = (Document(text=t, id=str(i)) for i, t in enumerate(texts))
    t0 = time.perf_counter()
    for _ in step.run(docs, rank=0, world_size=1) or ():
        pass
    return time.perf_counter() - t0


def datatrove_all(jsonl: str, folder: str) -> dict:
    """The four stages, one core; run in a child process (see main)."""
    from datatrove.data import Document
    from datatrove.pipeline.dedup.minhash import (MinhashConfig, MinhashDedupBuckets, MinhashDedupCluster,
                                                  MinhashDedupFilter, MinhashDedupSignature)

    cfg = MinhashConfig()
    texts = [json.loads(line) for line in open(jsonl)]

    def docs():
        return (Document(text=r["text"], id=r["id"]) for r in texts)

    out = {}
    t0 = time.perf_counter()
    for _ in MinhashDedupSignature(output_folder=f"{folder}/sigs", config=cfg).run(docs(), rank=0, world_size=1) or ():
        pass
    out["signatures"] = time.perf_counter() - t0
    t = time.perf_counter()
    for rank in range(cfg.num_buckets):
        for _ in MinhashDedupBuckets(input_folder=f"{folder}/sigs", output_folder=f"{folder}/buckets", config=cfg).run(
                rank=rank, world_size=cfg.num_buckets) or ():
            pass
    out["buckets"] = time.perf_counter() - t
    t = time.perf_counter()
    for _ in MinhashDedupCluster(input_folder=f"{folder}/buckets", output_folder=f"{folder}/remove", config=cfg).run(
            world_size=1) or ():
        pass
    out["clusters"] = time.perf_counter() - t
    t = time.perf_counter()
    kept = [d.id for d in MinhashDedupFilter(input_folder=f"{folder}/remove").run(docs(), rank=0, world_size=1)]
    out["filter"] = time.perf_counter() - t
    out["total"] = time.perf_counter() - t0
    out["removed"] = sorted({r["id"] for r in texts} - set(kept))
    return out


def curate_all(data_dir: Path, out_dir: Path, workers: int) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    y = out_dir / "bench.yaml"
    y.write_text(f"name: bench\ntokenizer: null\nsources:\n  web: {{paths: ['{data_dir}/*.jsonl'], id_field: id}}\n"
                 "dedup:\n  fuzzy: {}\n")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "pipeline", "run", str(y), "--workers", str(workers), "--output", str(out_dir)],
                       capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(r.stderr[-3000:])
    run = out_dir / "bench"
    steps = json.loads((run / "run.json").read_text())["steps"]
    out = {"command": wall}
    peaks = {}
    for name, st in steps.items():
        if name.startswith("dedup-fuzzy"):
            key = name.removeprefix("dedup-fuzzy-") if name != "dedup-fuzzy" else "apply"
            out[key] = st.get("seconds", 0.0)
            peaks[key] = max([json.loads(m.read_text()).get("peak_rss_mb", 0) for m in (run / st["dir"] / "_markers").glob("*.json")] or [0])
    out["total"] = sum(v for k, v in out.items() if k != "command")
    out["peak_rss_mb"] = max(peaks.values() or [0])
    out["peaks"] = peaks
    import pyarrow.parquet as pq

    removed = set()
    for f in (run / steps["dedup-fuzzy"]["dir"]).glob("*/part-*.parquet"):
        t = pq.read_table(f, columns=["id", "keep"]).to_pylist()
        removed |= {r["id"] for r in t if r["keep"] is False}
    out["removed"] = sorted(removed)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=6000)
    ap.add_argument("--workers", type=int, default=1, help="Curate's workers for the whole-dedup part (1 = per core)")
    ap.add_argument("--datatrove-child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.datatrove_child:
        res = datatrove_all(*args.datatrove_child)
        res["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
        print(json.dumps(res))
        return
    texts = corpus(args.docs)
    mb = sum(len(t.encode()) for t in texts) / 1e6
    print(f"corpus: {len(texts):,} documents, {mb:.1f} MB")
    with tempfile.TemporaryDirectory() as tmp:
        curate_signatures(texts[:1024])  # warm: per-process tables
        t_cu = curate_signatures(texts)
        t_dt = datatrove_signatures(texts, f"{tmp}/dt-sigs")
        print("\n1. signatures, one core")
        print(f"   datatrove MinhashDedupSignature  {mb / t_dt:8.2f} MB/s   ({t_dt:.1f} s)")
        print(f"   curate                           {mb / t_cu:8.2f} MB/s   ({t_cu:.1f} s)")
        print(f"   ratio curate/datatrove: {t_dt / t_cu:.1f}x")

        data = Path(tmp) / "data"
        data.mkdir()
        with open(data / "part-0.jsonl", "w") as f:
            for i, t in enumerate(texts):
                f.write(json.dumps({"id": f"d{i:07d}", "text": t}) + "\n")
        cu = curate_all(data, Path(tmp) / "curate", args.workers)
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        r = subprocess.run([sys.executable, "-m", "bench.dedup", "--datatrove-child", str(data / "part-0.jsonl"), f"{tmp}/dt"],
                           capture_output=True, text=True, env=env)
        if r.returncode:
            raise SystemExit(r.stderr[-3000:])
        dt = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"\n2. whole fuzzy dedup (Curate --workers {args.workers}; datatrove one core)")
    print(f"   datatrove: {' + '.join(f'{k} {dt[k]:.1f}' for k in ('signatures', 'buckets', 'clusters', 'filter'))}"
          f" = {dt['total']:.1f} s, peak RSS {dt['peak_rss_mb']:.0f} MB")
    parts = [k for k in ("signatures", "buckets", "fetch", "verify", "clusters", "apply") if k in cu]
    print(f"   curate:    {' + '.join(f'{k} {cu[k]:.1f}' for k in parts)} = {cu['total']:.1f} s "
          f"(whole `curate run` incl. Ray start and reading JSONL: {cu['command']:.1f} s), peak worker RSS {cu['peak_rss_mb']:.0f} MB")
    print(f"   ratio curate/datatrove: {dt['total'] / cu['total']:.1f}x (steps), {dt['total'] / cu['command']:.1f}x (whole command)")
    a, b = set(dt["removed"]), set(cu["removed"])
    print(f"   removed: datatrove {len(a):,}, curate {len(b):,}, both {len(a & b):,}")
    explain_differences(texts, a - b, b - a)
    print("   peak worker RSS by Curate step (MB): " + ", ".join(f"{k} {v:.0f}" for k, v in cu["peaks"].items()))


def explain_differences(texts: list[str], only_dt: set, only_cu: set):
    """Why the removed sets differ: the best true Jaccard each datatrove-only removal has
    with any other document, and how many Curate-only removals are shorter than 5 words."""
    from pipeline.shards import text as T

    sets = [set(T.shingle_set(t, 5).tolist()) for t in texts]
    best = []
    for i in sorted(only_dt):
        k = int(i[1:])
        best.append(max((len(sets[k] & s) / len(sets[k] | s) for j, s in enumerate(sets) if j != k and s), default=0.0))
    short = sum(len(texts[int(i[1:])].split()) < 5 for i in only_cu)
    if best:
        print(f"   only datatrove: {len(best)}; their best true Jaccard with any other document: "
              f"max {max(best):.2f}, median {sorted(best)[len(best) // 2]:.2f} (under the 0.8 threshold: {sum(x < 0.8 for x in best)})")
    print(f"   only curate: {len(only_cu)}, of which {short} have fewer than 5 words (datatrove gives them no signature;"
          " Curate makes them one shingle, so identical short pages are duplicates)")


if __name__ == "__main__":
    main()
