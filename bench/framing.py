"""Shuffle bytes per document from N to 4N with partitions x4 (issue 58, the framing term):
writers of a fixed number of documents, each writing 14 band rows a document (bucket,
okey, okey2, gid: fuzzy dedup's signatures shuffle), partitioned over P partitions that
grow with the corpus, so a segment holds fewer rows at 4N. Each segment an Arrow IPC
stream (before: `RAW_ROWS = 0`) against small fixed-width segments written raw (now);
both in the same run, every partition read back and compared.

    python -m bench.framing [--docs 5000] [--writers 8] [--partitions 10000] [--kind exact]

`--kind exact`: exact dedup's keys instead, one row a document (h1, h2, rank, a 16-character
id, gid: 44 bytes), over partitions a fourteenth as many (its rows are a fourteenth).

Not a test: timings never gate CI.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.shards import shuffle

BANDS = 14


def table(kind: str, rng, i: int, docs: int) -> pa.Table:
    """A writer's rows: fuzzy dedup's band keys (14 a document) or exact dedup's keys (one)."""
    if kind == "exact":
        return pa.table({"h1": rng.integers(0, 2**63, docs, dtype=np.int64).astype(np.uint64),
                         "h2": rng.integers(0, 2**63, docs, dtype=np.int64).astype(np.uint64),
                         "rank": np.zeros(docs, np.int32), "id": pa.array([f"{i:06d}-{j:09d}" for j in range(docs)]),
                         "gid": np.arange(i * docs, (i + 1) * docs, dtype=np.int64)})
    n = docs * BANDS
    return pa.table({"bucket": rng.integers(0, 2**63, n, dtype=np.int64).astype(np.uint64),
                     "okey": rng.integers(0, 2**63, n, dtype=np.int64).astype(np.uint64),
                     "okey2": rng.integers(0, 2**63, n, dtype=np.int64).astype(np.uint64),
                     "gid": np.repeat(np.arange(i * docs, (i + 1) * docs, dtype=np.int64), BANDS)})


def run(tmp: Path, writers: int, docs: int, nparts: int, raw_rows: int, kind: str = "signatures") -> dict:
    shuffle.RAW_ROWS = raw_rows
    rng = np.random.default_rng(0)
    out = tmp / f"w{writers}-p{nparts}-r{raw_rows}"
    c0 = time.process_time()
    for i in range(writers):
        t = table(kind, rng, i, docs)
        shuffle.write_partitions(t, shuffle.partition_of(t.column(t.column_names[0]).to_numpy(), nparts), nparts,
                                 shuffle.map_file(out, i))
    write_cpu = time.process_time() - c0
    size = sum(shuffle._with(shuffle.map_file(out, i), ".data").stat().st_size for i in range(writers))
    c0 = time.process_time()
    sample = range(0, nparts, max(1, nparts // 200))  # 200 partitions read back
    rows = [shuffle.read_partition(out, writers, p) for p in sample]
    read_cpu = (time.process_time() - c0) * nparts / len(sample)
    return {"bytes": size, "write_cpu": write_cpu, "read_cpu": read_cpu, "rows": rows, "dir": out}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=5000, help="documents a writer")
    ap.add_argument("--writers", type=int, default=8, help="writers at N (x4 at 4N)")
    ap.add_argument("--partitions", type=int, default=10000, help="partitions at N (x4 at 4N)")
    ap.add_argument("--kind", default="signatures", choices=["signatures", "exact"])
    a = ap.parse_args(argv)
    rows_a_doc = BANDS if a.kind == "signatures" else 1
    nparts0 = a.partitions if a.kind == "signatures" else max(1, a.partitions // BANDS)
    tmp = Path(tempfile.mkdtemp(prefix="curate-framing-"))
    print("| documents | writers | partitions | rows a segment | before: bytes a document | now | now / before "
          "| before: write + read CPU µs a document | now |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    try:
        for k in (1, 4):
            w, p = a.writers * k, nparts0 * k
            docs = w * a.docs
            before = run(tmp, w, a.docs, p, 0, a.kind)
            now = run(tmp, w, a.docs, p, 256, a.kind)
            assert all((x is None and y is None) or x.equals(y) for x, y in zip(before["rows"], now["rows"]))
            per = a.docs * rows_a_doc / p
            print(f"| {docs:,} | {w} | {p:,} | {per:.1f} | {before['bytes'] / docs:.0f} | {now['bytes'] / docs:.0f} | "
                  f"{now['bytes'] / before['bytes']:.3f} | {1e6 * (before['write_cpu'] + before['read_cpu']) / docs:.1f} | "
                  f"{1e6 * (now['write_cpu'] + now['read_cpu']) / docs:.1f} |", flush=True)
            shutil.rmtree(before["dir"])
            shutil.rmtree(now["dir"])
        print(f"(rows: {BANDS} of 32 bytes a document = {BANDS * 32} bytes)" if a.kind == "signatures" else
              "(rows: one of 44 bytes a document)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
