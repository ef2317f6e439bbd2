"""Object-store requests per input document, from N to 4N: a whole run against a real S3
API (moto's server on loopback, s3fs as the client, as tests/pipeline/test_remote.py uses),
inputs and run directory both on S3.

    python -m bench.objstore [--docs 10000] [--scales 1,4] [--workers 2]
                             [--docs-per-partition 20000] [--groups 100000,4]

The corpus and mixture are bench.scale's (small crawl pages in 5,000-document files, the
full chain). Requests are counted from the server's access log, by HTTP method (LIST is
a GET on a bucket with `list-type`); then `curate plan` on the finished run, whose
requests should not grow with the shards. Ratios 4N / N per input document are printed.

`--docs-per-partition` sets how fast the shuffles' partitions grow with N (bench.scale's
one per 20,000 documents by default; smaller shows the writers x readers reads at these
sizes), and `--groups` runs every scale once per shuffle merge group
(`CURATE_SHUFFLE_GROUP`; 100000: no merge tier, every reader reads every writer's file).
Not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from bench.scale import CACHE, DOCS_PER_PARTITION, ROOT, build_corpus, mixture_yaml

LINE = re.compile(r'"(?:\x1b\[[0-9;]*m)*(GET|PUT|POST|HEAD|DELETE) (\S+) HTTP')  # some lines are ANSI-coloured


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """moto's S3 server in a child process, its access log in a file."""

    def __init__(self, log: Path):
        self.port = _free_port()
        self.log = log
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=open(log, "w"), stderr=subprocess.STDOUT)
        self.env = {**os.environ, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                    "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.port}"}
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                if time.time() > deadline or self.proc.poll() is not None:
                    raise SystemExit(f"moto server did not start: {log.read_text()[-2000:]}")
                time.sleep(0.2)

    def mark(self) -> int:
        return len(self.log.read_bytes().splitlines())

    def since(self, mark: int) -> Counter:
        c: Counter = Counter()
        for line in self.log.read_text(errors="replace").splitlines()[mark:]:
            m = LINE.search(line)
            if m:
                method, path = m.groups()
                c["LIST" if method == "GET" and "list-type" in path else method] += 1
        return c

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _curate(env: dict, *args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "pipeline", *args], env=env, capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        raise SystemExit(f"curate {' '.join(args)} failed:\n{r.stderr[-3000:]}")
    return r


def run_one(server: Server, n: int, workers: int, per_partition: int = DOCS_PER_PARTITION, group: int | None = None) -> dict:
    import s3fs

    os.environ.update({k: v for k, v in server.env.items() if k.startswith("AWS_")})
    s3 = s3fs.S3FileSystem(skip_instance_cache=True)
    bucket = f"curate-bench-{n}-{group or 0}-{per_partition}"
    corpus = build_corpus(n)
    if not s3.exists(bucket):
        s3.mkdir(bucket)
    for sub in sorted(p.relative_to(corpus) for p in corpus.rglob("*") if p.is_file() and p.name != "_DONE"):
        s3.put(str(corpus / sub), f"{bucket}/in/{sub}")
    work = CACHE / "objstore" / f"n{n}-g{group or 0}-p{per_partition}"
    y = mixture_yaml(corpus, work, max(1, n // per_partition))
    text = y.read_text().replace(str(corpus), f"s3://{bucket}/in").replace("name: scale\n", f"name: scale\noutput: s3://{bucket}/runs\n", 1)
    y.write_text(text)
    env = {**server.env, "CURATE_INLINE_DOCS": "0"}  # every step on Ray, as at scale
    if group:
        env["CURATE_SHUFFLE_GROUP"] = str(group)
    m = server.mark()
    t = time.perf_counter()
    _curate(env, "run", str(y), "--workers", str(workers))
    wall = time.perf_counter() - t
    run_req = server.since(m)
    objects = len(s3.find(f"{bucket}/runs"))
    m = server.mark()
    _curate(env, "plan", str(y))
    plan_req = server.since(m)
    import json

    steps = len(json.loads(s3.cat(f"{bucket}/runs/scale/run.json"))["steps"])  # a run on S3 links no steps/ folder

    docs = sum(e["in"] for e in json.loads(s3.cat(f"{bucket}/runs/scale/ledger.json"))["sources"].values())
    return {"n": n, "docs": docs, "wall": wall, "run": dict(run_req), "plan": dict(plan_req), "objects": objects, "steps": steps,
            "group": group, "partitions": max(1, n // per_partition)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.objstore", description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=10_000, help="N (default 10,000)")
    ap.add_argument("--scales", default="1,4")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--docs-per-partition", type=int, default=DOCS_PER_PARTITION)
    ap.add_argument("--groups", default="", help="shuffle merge groups to compare, e.g. 100000,4 (default: the default group)")
    a = ap.parse_args(argv)
    (CACHE / "objstore").mkdir(parents=True, exist_ok=True)
    server = Server(CACHE / "objstore" / "moto.log")
    groups = [int(g) for g in a.groups.split(",") if g] or [None]
    try:
        res = {g: [run_one(server, a.docs * int(k), a.workers, a.docs_per_partition, g) for k in a.scales.split(",")]
               for g in groups}
    finally:
        server.close()
    for g, rs in res.items():
        _table(rs, g)


def _table(res: list[dict], group: int | None) -> None:
    kinds = sorted({k for r in res for k in r["run"]})
    print(f"\nshuffle merge group: {group or 'default'}")
    print("| documents (web + wiki) | partitions | wall s | objects in the run | " + " | ".join(f"{k} requests" for k in kinds)
          + " | requests per document | `curate plan` requests (steps) |")
    print("|" + " ---: |" * (6 + len(kinds)))
    for r in res:
        total = sum(r["run"].values())
        print(f"| {r['docs']:,} | {r['partitions']} | {r['wall']:.0f} | {r['objects']:,} | " + " | ".join(f"{r['run'].get(k, 0):,}" for k in kinds)
              + f" | {total / r['docs']:.4f} | {sum(r['plan'].values()):,} ({r['steps']}) |")
    a0, a1 = res[0], res[-1]
    per = [sum(r["run"].values()) / r["docs"] for r in (a0, a1)]
    print(f"\nrequests per document {a1['n'] // a0['n']}N / N: {per[1] / per[0]:.2f}x; "
          f"plan requests: {sum(a1['plan'].values()) / max(1, sum(a0['plan'].values())):.2f}x")


if __name__ == "__main__":
    main()
