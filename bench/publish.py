"""Publishing into a run directory on an object store, from N to 4N files (issue 58, term
3): `atomic.link_tree`, what every stage's publish calls (mixture/, tokenized/,
validation/, quarantine/, samples/), from a store folder to the run directory, both on
moto's S3 server with every request held `--latency-ms`; then again over the same folder
(a rerun replaces it). Requests by kind per published file and wall seconds per file.

    python -m bench.publish [--files 50] [--scales 1,4] [--latency-ms 20] [--kb 64]

Not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.objstore import LINE, Server


def _count(server: Server, mark: int) -> Counter:
    c: Counter = Counter()
    for line in server.log.read_text(errors="replace").splitlines()[mark:]:
        if (m := LINE.search(line)) is not None:
            method, path = m.groups()
            c["LIST" if method == "GET" and "list-type" in path else method] += 1
    return c


def run_one(server: Server, n: int, kb: int) -> dict:
    import s3fs

    from pipeline.io import atomic, fs

    os.environ.update({k: v for k, v in server.env.items() if k.startswith("AWS_")})
    s3 = s3fs.S3FileSystem(anon=False, client_kwargs={"endpoint_url": server.env["AWS_ENDPOINT_URL"]})
    bucket = f"pub{n}"
    s3.mkdir(bucket)
    blob = os.urandom(kb << 10)
    for i in range(n):
        s3.pipe(f"{bucket}/store/step-0123abcd/part-{i:05d}.parquet", blob)
    s3.invalidate_cache()
    pairs = [(fs.path(f"s3://{bucket}/store/step-0123abcd/part-{i:05d}.parquet"), f"part-{i:05d}.parquet")
             for i in range(n)]
    out = {"files": n}
    for label in ("first", "again"):
        mark = server.mark()
        t = time.perf_counter()
        atomic.link_tree(pairs, fs.path(f"s3://{bucket}/run/mixture"))
        out[label] = {"wall": time.perf_counter() - t, "requests": dict(_count(server, mark))}
    s3.invalidate_cache()
    got = sorted(p.rsplit("/", 1)[1] for p in s3.find(f"{bucket}/run"))
    assert got == [r for _, r in pairs], got[:5]  # exactly the files, nothing left of a temporary folder
    assert s3.cat_file(f"{bucket}/run/mixture/part-00000.parquet") == blob
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=50)
    ap.add_argument("--scales", default="1,4")
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--kb", type=int, default=64)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        server = Server(Path(d) / "s3.log", a.latency_ms)
        try:
            res = [run_one(server, a.files * int(s), a.kb) for s in a.scales.split(",")]
        finally:
            server.close()
    print("| files | publish | requests | requests per file | wall s | wall ms per file |")
    print("| ---: | --- | --- | ---: | ---: | ---: |")
    for r in res:
        for label in ("first", "again"):
            x = r[label]
            n = sum(x["requests"].values())
            print(f"| {r['files']} | {label} | {dict(sorted(x['requests'].items()))} | {n / r['files']:.2f} | {x['wall']:.2f} "
                  f"| {1000 * x['wall'] / r['files']:.1f} |")
    a0, b0 = res[0]["first"], res[-1]["first"]
    print(f"\n4N / N per file (first publish): requests {sum(b0['requests'].values()) / res[-1]['files'] / (sum(a0['requests'].values()) / res[0]['files']):.2f}, "
          f"wall {b0['wall'] / res[-1]['files'] / (a0['wall'] / res[0]['files']):.2f}")


if __name__ == "__main__":
    main()
