"""A shuffle's object-store requests against its size, with and without the merge tier
(issue 35): S writers' files of P partitions each on S3 (moto's server on loopback, s3fs
as the client), then every partition read by its reader; at N and 4N documents with the
writers and the partitions growing 4x together, as the defaults grow them.

    python -m bench.shuffle [--maps 16] [--rows 20000] [--group 8] [--fanin 2] [--scales 1,4]

Counted from the server's access log: the readers' requests without the tier (every
reader reads every writer's file: 2 ranged GETs per writer), then the merge tasks'
requests and the readers' requests over the merged files. Every partition's rows are
checked to be the same both ways. Rows are 16-byte keys with an 8-byte payload, as the
exact dedup map writes. The groups are sized as the product sizes them
(`pipeline.steps.merge.group_size`: at least `--group` writers, more when a reader would
read more than `--fanin` files); the defaults 8 and 2 instead of the product's 32 and 64
show the regime of a large corpus (tens of thousands of writers) at a size that runs in
a few minutes. Not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import pyarrow as pa

from bench.objstore import Server
from bench.scale import CACHE


def one(server: Server, k: int, maps: int, rows: int, least: int, fanin: int) -> dict:
    from pipeline.io import fs
    from pipeline.shards import shuffle
    from pipeline.steps.merge import group_size, read_ahead

    s, p = maps * k, maps * k
    root = fs.path(f"s3://bench-shuffle-{k}")
    fs.path(f"s3://bench-shuffle-{k}").fs.mkdir(f"bench-shuffle-{k}")
    rng = np.random.default_rng(k)
    for i in range(s):
        keys = rng.integers(0, 2**63, rows, dtype=np.int64)
        t = pa.table({"h1": keys, "h2": keys ^ 0x5BD1E995, "gid": np.arange(rows, dtype=np.int64) + i * rows})
        shuffle.write_partitions(t, shuffle.partition_of(keys.view(np.uint64), p), p, shuffle.map_file(root / "maps", i))
    m = server.mark()
    t0 = time.perf_counter()
    plain = [shuffle.read_partition(root / "maps", s, q) for q in range(p)]
    t_plain = time.perf_counter() - t0
    reads_plain = sum(server.since(m).values())
    m = server.mark()
    t0 = time.perf_counter()
    group = group_size(s, least, fanin)
    groups = [(a, min(s, a + group)) for a in range(0, s, group)]
    for j, (a, b) in enumerate(groups):
        shuffle.merge(root / "maps", a, b, shuffle.map_file(root / "merged", j), buffering=read_ahead(b - a))
    merge_req = sum(server.since(m).values())
    m = server.mark()
    merged = [shuffle.read_partition(root / "merged", len(groups), q) for q in range(p)]
    t_tier = time.perf_counter() - t0
    reads_tier = sum(server.since(m).values())
    assert all((a is None and b is None) or a.equals(b) for a, b in zip(plain, merged)), "merged rows differ"
    return {"k": k, "docs": s * rows, "maps": s, "partitions": p, "plain": reads_plain, "t_plain": t_plain,
            "merge": merge_req, "tier": reads_tier, "t_tier": t_tier, "groups": len(groups), "group": group}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.shuffle", description=__doc__.split("\n\n")[0])
    ap.add_argument("--maps", type=int, default=16, help="writers (and partitions) at N")
    ap.add_argument("--rows", type=int, default=20_000, help="rows per writer")
    ap.add_argument("--group", type=int, default=8, help="writers per merge task at least (the product's: 32)")
    ap.add_argument("--fanin", type=int, default=2, help="files a reader reads at most (the product's: 64)")
    ap.add_argument("--scales", default="1,4")
    a = ap.parse_args(argv)
    (CACHE / "shuffle").mkdir(parents=True, exist_ok=True)
    server = Server(CACHE / "shuffle" / "moto.log")
    os.environ.update({k: v for k, v in server.env.items() if k.startswith("AWS_")})
    try:
        res = [one(server, int(k), a.maps, a.rows, a.group, a.fanin) for k in a.scales.split(",")]
    finally:
        server.close()
    print("| documents | writers S | partitions P | no tier: reader requests | per document | merge tier: group, "
          "merge requests + reader requests | per document |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in res:
        print(f"| {r['docs']:,} | {r['maps']} | {r['partitions']} | {r['plain']:,} ({r['t_plain']:.1f} s) | "
              f"{r['plain'] / r['docs']:.4f} | {r['group']}: {r['merge']:,} + {r['tier']:,} ({r['t_tier']:.1f} s) | "
              f"{(r['merge'] + r['tier']) / r['docs']:.4f} |")
    a0, a1 = res[0], res[-1]
    f = lambda r, key: (sum(r[x] for x in key)) / r["docs"]  # noqa: E731
    print(f"\nrequests per document {a1['k'] // a0['k']}N / N: no tier {f(a1, ['plain']) / f(a0, ['plain']):.2f}x, "
          f"merge tier {f(a1, ['merge', 'tier']) / f(a0, ['merge', 'tier']):.2f}x")


if __name__ == "__main__":
    main()
