"""Planning reads of input Parquet files on an object store, from N to 4N input files
(issue 58, term 4): the requests and bytes the driver spends to plan a source's ingest
(its `ids-<source>` and `ingest-<source>` steps both split the files by row groups, from
their footers), against moto's S3 server with every request held `--latency-ms`.

    python -m bench.planning [--files 8] [--scales 1,4] [--latency-ms 20] [--file-mb 8]

Each input file is `--file-mb` of Wikipedia-like rows in 4 MB row groups; the corpus grows
by files. Printed per scale: requests by kind, bytes sent by the server (its access log's
response sizes), wall seconds of the planning; and the ratios 4N / N per input file.
Not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bench.objstore import LINE, Server



def _files(n: int, mb: int, root: Path) -> list[Path]:
    text = ("Curate plans a corpus by its files. " * 60)[:2000]
    rows = max(1, (mb << 20) // 2100)
    out = []
    for i in range(n):
        t = pa.table({"id": [f"f{i}-{j}" for j in range(rows)], "text": [text] * rows})
        p = root / f"wiki-{i:05d}.parquet"
        pq.write_table(t, p, row_group_size=max(1, rows // max(1, mb // 4)), compression="none", use_dictionary=False)
        out.append(p)
    return out


RANGE = re.compile(r"^range (\S+) (?:bytes=(\d+)-(\d+)|whole)")


def _since(server: Server, mark: int, sizes: dict[str, int]) -> tuple[Counter, int]:
    """Requests by kind since `mark`, and the bytes the GETs of input files asked for (a
    whole object: its size; a range: its length), from the server's log."""
    c: Counter = Counter()
    sent = 0
    for line in server.log.read_text(errors="replace").splitlines()[mark:]:
        if (r := RANGE.match(line)) is not None:
            path, a, b = r.groups()
            sent += (int(b) - int(a) + 1) if a is not None else sizes.get(path, 0)
        elif (m := LINE.search(line)) is not None:
            method, path = m.groups()
            c["LIST" if method == "GET" and "list-type" in path else method] += 1
    return c, sent


def run_one(server: Server, n: int, mb: int, work: Path) -> dict:
    import s3fs

    from pipeline import config
    from pipeline.run import graph

    os.environ.update({k: v for k, v in server.env.items() if k.startswith("AWS_")})
    s3 = s3fs.S3FileSystem(anon=False, client_kwargs={"endpoint_url": server.env["AWS_ENDPOINT_URL"]})
    bucket = f"plan{n}"
    s3.mkdir(bucket)
    local = work / f"in{n}"
    local.mkdir()
    sizes = {}
    for p in _files(n, mb, local):
        s3.put(str(p), f"{bucket}/wiki/{p.name}")
        sizes[f"/{bucket}/wiki/{p.name}"] = p.stat().st_size
    y = work / f"m{n}.yaml"
    y.write_text(f"""name: plan{n}
output: {work}/out{n}
tokenizer: gpt2
sources:
  wiki: {{paths: ["s3://{bucket}/wiki/*.parquet"], id_field: id, max_shard_rows: 100000000}}
mixture: {{weights: {{wiki: 1.0}}}}
""")
    lm = config.load(y)
    ctx = graph.build(lm, lm.output_dir(), lm.store_dir())  # discovery's listing happens here
    mark = server.mark()
    t0 = time.perf_counter()
    stats = defaultdict(dict)  # the steps before them not run: no repeated ids, no scan
    specs = {s.name: list(s.shards(s, stats)) for s in ctx.steps if s.name in ("ids-wiki", "ingest-wiki")}
    wall = time.perf_counter() - t0
    kinds, sent = _since(server, mark, sizes)
    return {"files": n, "bytes_in": n * (mb << 20), "requests": dict(kinds), "sent": sent, "wall": wall,
            "shards": {k: len(v) for k, v in specs.items()}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--scales", default="1,4")
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--file-mb", type=int, default=8)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        server = Server(Path(d) / "s3.log", a.latency_ms)
        try:
            res = [run_one(server, a.files * int(s), a.file_mb, Path(d)) for s in a.scales.split(",")]
        finally:
            server.close()
    print("| input files | input MB | requests (ids + ingest plans) | requests per file | MB sent | MB sent per input MB "
          "| wall s | shards |")
    print("| ---: | ---: | --- | ---: | ---: | ---: | ---: | --- |")
    for r in res:
        n = sum(r["requests"].values())
        print(f"| {r['files']} | {r['bytes_in'] / 2**20:.0f} | {dict(sorted(r['requests'].items()))} | {n / r['files']:.2f} "
              f"| {r['sent'] / 2**20:.2f} | {r['sent'] / r['bytes_in']:.4f} | {r['wall']:.2f} | {r['shards']} |")
    a0, b0 = res[0], res[-1]
    print(f"\n4N / N per input file: requests {sum(b0['requests'].values()) / b0['files'] / (sum(a0['requests'].values()) / a0['files']):.2f}, "
          f"bytes {b0['sent'] / b0['files'] / max(1, a0['sent'] / a0['files']):.2f}, wall {b0['wall'] / b0['files'] / (a0['wall'] / a0['files']):.2f}")


if __name__ == "__main__":
    main()
