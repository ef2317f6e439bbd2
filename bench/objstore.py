"""Object-store requests per input document, from N to 4N: a whole run against a real S3
API (moto's server on loopback, s3fs as the client, as tests/pipeline/io/test_remote.py uses),
inputs and run directory both on S3, every request held `--latency-ms` (20) before its answer.

    python -m bench.objstore [--docs 10000] [--scales 1,4] [--workers 2] [--latency-ms 20]
                             [--docs-per-partition 20000] [--groups 100000,4] [--fanin 2]

The corpus and mixture are bench.scale's (small crawl pages in 5,000-document files, the
full chain) with Wikipedia grown with N too (N/4 rows in 2,500-row shards), so that the
documents, the shards and the partitions all grow 4x from N to 4N. Requests are counted from the server's access log, by HTTP method (LIST is
a GET on a bucket with `list-type`); then `curate plan` on the finished run, whose
requests should not grow with the shards. Ratios 4N / N per input document are printed.

`--docs-per-partition` sets how fast the shuffles' partitions grow with N (bench.scale's
one per 20,000 documents by default; smaller shows the writers x readers reads at these
sizes), and `--groups` runs every scale once per shuffle merge group
(`CURATE_SHUFFLE_GROUP`; 100000: no merge tier, every reader reads every writer's file);
`--fanin` caps the files a reader reads (`CURATE_SHUFFLE_FANIN`, the product's 64): with
`--groups 2 --fanin 2` the run is in the regime that the product's 32 and 64 reach past
2,048 writers, about 10^8 documents.
Not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

from pipeline.engine.step import read_markers
from pipeline.io import fs

from bench.scale import CACHE, DOCS_PER_PARTITION, ROOT, build_corpus, mixture_yaml

STEP = re.compile(r"/steps/([^/?&]+-[0-9a-f]{8,})(?:/|$|&|\?)")  # a key (or a LIST prefix) inside a step's folder
LINE = re.compile(r'"(?:\x1b\[[0-9;]*m)*(GET|PUT|POST|HEAD|DELETE) (\S+) HTTP')  # some lines are ANSI-coloured


WIKI_SHARD_ROWS = 2_500  # wiki's shards grow with N too (web's: one per 5,000-page file)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """moto's S3 server in a child process, its access log in a file."""

    def __init__(self, log: Path, latency_ms: float = 0.0):
        self.port = _free_port()
        self.log = log
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.objstore", "--serve", str(self.port), "--latency-ms", str(latency_ms)],
                                     stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=ROOT)
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

    def since(self, mark: int, by_step: bool = False):
        """Requests logged since `mark`, by kind (LIST is a GET on a bucket with `list-type`);
        with `by_step`, also by the step folder (`<name>-<hash>`) each request's key names."""
        c: Counter = Counter()
        steps: dict[str, Counter] = {}
        for line in self.log.read_text(errors="replace").splitlines()[mark:]:
            m = LINE.search(line)
            if m:
                method, path = m.groups()
                kind = "LIST" if method == "GET" and "list-type" in path else method
                c[kind] += 1
                s = STEP.search(unquote(path))
                if s:
                    steps.setdefault(s.group(1), Counter())[kind] += 1
        return (c, steps) if by_step else c

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def serve(port: int, latency_ms: float) -> None:
    """moto's S3 app (as `python -m moto.server` runs it) behind a middleware that holds every
    request `latency_ms` before answering: a store's first-byte latency (S3: ~10-30 ms), so
    requests a task makes one after another cost what they would cost there."""
    from moto.moto_server.threaded_moto_server import MotoRequestHandler
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import run_simple

    app = DomainDispatcherApplication(create_backend_app)

    def slow(environ, start_response):
        if environ.get("REQUEST_METHOD") == "GET":  # what a GET asked for: bench/planning.py counts the bytes
            sys.stdout.write(f"range {environ.get('PATH_INFO')} {environ.get('HTTP_RANGE') or 'whole'}\n")  # one write a line
            sys.stdout.flush()
        time.sleep(latency_ms / 1000)
        return app(environ, start_response)

    run_simple("127.0.0.1", port, slow, threaded=True, request_handler=MotoRequestHandler)


def _curate(env: dict, *args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "pipeline", *args], env=env, capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        raise SystemExit(f"curate {' '.join(args)} failed:\n{r.stderr[-3000:]}")
    return r


def run_one(server: Server, n: int, workers: int, per_partition: int = DOCS_PER_PARTITION, group: int | None = None,
            fanin: int | None = None) -> dict:
    import s3fs

    os.environ.update({k: v for k, v in server.env.items() if k.startswith("AWS_")})
    s3 = s3fs.S3FileSystem(skip_instance_cache=True)
    bucket = f"curate-bench-{n}-{group or 0}-{fanin or 0}-{per_partition}"
    corpus = build_corpus(n, wiki_docs=n // 4)  # both sources grow with N, and their shards
    if not s3.exists(bucket):
        s3.mkdir(bucket)
    for sub in sorted(p.relative_to(corpus) for p in corpus.rglob("*") if p.is_file() and p.name != "_DONE"):
        s3.put(str(corpus / sub), f"{bucket}/in/{sub}")
    work = CACHE / "objstore" / f"n{n}-g{group or 0}-f{fanin or 0}-p{per_partition}"
    y = mixture_yaml(corpus, work, max(1, n // per_partition), wiki_shard_rows=WIKI_SHARD_ROWS)
    # the classifier's sample capped below the positives at N too, as it is at any real size (else its training grows 2x)
    text = y.read_text().replace("max_examples_per_class: 5000", "max_examples_per_class: 2000")
    text = text.replace(str(corpus), f"s3://{bucket}/in").replace("name: scale\n", f"name: scale\noutput: s3://{bucket}/runs\n", 1)
    y.write_text(text)
    env = {**server.env, "CURATE_INLINE_DOCS": "0",  # every step on Ray, as at scale ...
           "CURATE_FUZZY_LOCAL_EDGES": "0"}  # ... and fuzzy clusters in rounds of tasks (the cost model scales them)
    if group:
        env["CURATE_SHUFFLE_GROUP"] = str(group)
    if fanin:
        env["CURATE_SHUFFLE_FANIN"] = str(fanin)
    m = server.mark()
    t = time.perf_counter()
    # the driver in a child process that reports its own CPU and peak memory (bench.scale's)
    r = subprocess.run([sys.executable, "-m", "bench.scale", "--child", str(y), "--workers", str(workers),
                        "--output", f"s3://{bucket}/runs"], env=env, capture_output=True, text=True, cwd=ROOT)
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    if r.returncode or line is None:
        raise SystemExit(f"curate run failed:\n{r.stderr[-4000:]}")
    wall = time.perf_counter() - t
    res = json.loads(line[7:])
    run_req, by_step = server.since(m, by_step=True)
    objects = len(s3.find(f"{bucket}/runs"))
    m = server.mark()
    _curate(env, "plan", str(y))
    plan_req = server.since(m)
    rec = json.loads(s3.cat(f"{bucket}/runs/scale/run.json"))
    led = json.loads(s3.cat(f"{bucket}/runs/scale/ledger.json"))
    docs = sum(e["in"] for e in led["sources"].values())
    chars = sum(e["stages"][0].get("chars_out", 0) for e in led["sources"].values())  # after ingest
    steps = {}
    for name, st in rec["steps"].items():
        d = st["dir"]
        markers = list(read_markers(fs.path(d)).values())
        files = s3.find(d.removeprefix("s3://"), detail=True)
        secs = [max(mk["round_task_longest"], mk.get("coordinator_cpu_seconds", 0.0)) if "round_task_longest" in mk
                else mk.get("seconds", 0.0) for mk in markers]
        cpus = [max(mk.get("cpu_seconds", 0.0), mk.get("coordinator_cpu_seconds", 0.0)) for mk in markers]
        steps[name] = {"tasks": len(markers), "files": len(files), "bytes": sum(f["size"] for f in files.values()),
                       "longest": max(secs or [0.0]), "total": sum(secs), "longest_cpu": max(cpus or [0.0]), "cpu": sum(cpus),
                       "rss": max([mk.get("peak_rss_mb") or 0.0 for mk in markers] or [0.0]),
                       "requests": dict(by_step.get(Path(d).name, {})),
                       # every numeric figure the markers hold, summed (rows, pairs, docs, bytes...): the cost model's sizes
                       "sums": _sums(markers)}
    return {"n": n, "docs": docs, "chars": chars, "wall": wall, "run": dict(run_req), "plan": dict(plan_req), "objects": objects,
            "steps": steps, "group": group, "fanin": fanin, "partitions": max(1, n // per_partition), "driver_cpu": res["driver_cpu"],
            "driver_rss_mb": res["driver_rss_mb"], "longest": max(s["longest"] for s in steps.values()),
            "longest_step": max(steps, key=lambda k: steps[k]["longest"]),
            "longest_cpu": max(s["longest_cpu"] for s in steps.values()),
            "longest_cpu_step": max(steps, key=lambda k: steps[k]["longest_cpu"]),
            "worker_rss": max(s["rss"] for s in steps.values())}


def _sums(markers: list[dict]) -> dict:
    out: Counter = Counter()
    for mk in markers:
        for k, v in mk.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[k] += v
    return dict(out)


def client_cpu_per_request(server: Server, n: int = 300) -> dict[str, float]:
    """The client's CPU seconds per request by kind (s3fs and botocore: signing, the HTTP
    exchange, parsing), measured in this process against the same server: small ranged GETs,
    HEADs and PUTs of 1 KB. bench.cost_model charges a step's requests at these rates and
    scales only the rest of its CPU with the documents: at a production shard size a task
    makes about the requests a bench task makes, for 10-20x the documents."""
    import s3fs

    os.environ.update({k: v for k, v in server.env.items() if k.startswith("AWS_")})
    s3 = s3fs.S3FileSystem(skip_instance_cache=True)
    s3.mkdir("calibrate")
    s3.pipe_file("calibrate/blob", os.urandom(1 << 16))
    out = {}
    for kind, call in (("GET", lambda i: s3.cat_file("calibrate/blob", start=i * 64, end=i * 64 + 64)),
                       ("HEAD", lambda i: (s3.invalidate_cache("calibrate/blob"), s3.info("calibrate/blob"))),
                       ("PUT", lambda i: s3.pipe_file(f"calibrate/put-{i:05d}", b"x" * 1024))):
        call(0)  # the first request of a kind sets up what later ones share
        t0 = time.process_time()
        for i in range(1, n + 1):
            call(i)
        out[kind] = (time.process_time() - t0) / n
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.objstore", description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=10_000, help="N (default 10,000)")
    ap.add_argument("--scales", default="1,4")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--docs-per-partition", type=int, default=DOCS_PER_PARTITION)
    ap.add_argument("--groups", default="", help="shuffle merge groups to compare, e.g. 100000,4 (default: the default group)")
    ap.add_argument("--fanin", type=int, help="files a shuffle's reader reads at most (default: the product's 64)")
    ap.add_argument("--latency-ms", type=float, default=20.0, help="held before each request is answered (default 20)")
    ap.add_argument("--json", help="write every figure here (the input of bench.cost_model)")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # internal: the server process
    a = ap.parse_args(argv)
    if a.serve:
        return serve(a.serve, a.latency_ms)
    (CACHE / "objstore").mkdir(parents=True, exist_ok=True)
    server = Server(CACHE / "objstore" / "moto.log", a.latency_ms)
    groups = [int(g) for g in a.groups.split(",") if g] or [None]
    try:
        res = {g: [run_one(server, a.docs * int(k), a.workers, a.docs_per_partition, g, a.fanin) for k in a.scales.split(",")]
               for g in groups}
        per_request = client_cpu_per_request(server)
    finally:
        server.close()
    print("client CPU per request (s3fs): " + ", ".join(f"{k} {v * 1000:.2f} ms" for k, v in per_request.items()))
    if a.json:
        Path(a.json).write_text(json.dumps({"latency_ms": a.latency_ms, "workers": a.workers, "results": res,
                                            "client_cpu_per_request": per_request}, indent=1))
    for g, rs in res.items():
        _table(rs, g)


def _table(res: list[dict], group: int | None) -> None:
    kinds = sorted({k for r in res for k in r["run"]})
    print(f"\nshuffle merge group: {group or 'default'}")
    print("| documents (web + wiki) | partitions | wall s | objects in the run | " + " | ".join(f"{k} requests" for k in kinds)
          + " | requests per document | longest task s (step) | most CPU in a task s (step) | largest worker MB | driver peak MB | driver CPU s "
            "| `curate plan` requests (steps) |")
    print("|" + " ---: |" * (12 + len(kinds)))
    for r in res:
        total = sum(r["run"].values())
        print(f"| {r['docs']:,} | {r['partitions']} | {r['wall']:.0f} | {r['objects']:,} | " + " | ".join(f"{r['run'].get(k, 0):,}" for k in kinds)
              + f" | {total / r['docs']:.4f} | {r['longest']:.2f} ({r['longest_step']}) | {r['longest_cpu']:.2f} ({r['longest_cpu_step']}) | {r['worker_rss']:.0f} | {r['driver_rss_mb']:.0f} "
                f"| {r['driver_cpu']:.1f} | {sum(r['plan'].values()):,} ({len(r['steps'])}) |")
    a, b = res[0], res[-1]
    per = lambda r, k: r[k] / r["docs"]  # noqa: E731
    total = lambda r: sum(r["run"].values())  # noqa: E731
    ratios = {"object-store requests per document": (total(b) / b["docs"]) / (total(a) / a["docs"]),
              "objects written per document": per(b, "objects") / per(a, "objects"),
              "longest task": b["longest"] / a["longest"], "most CPU in a task": b["longest_cpu"] / a["longest_cpu"],
              "largest worker RSS": b["worker_rss"] / a["worker_rss"],
              "driver peak RSS": b["driver_rss_mb"] / a["driver_rss_mb"],
              "driver CPU s per document": per(b, "driver_cpu") / per(a, "driver_cpu"),
              "`curate plan` requests": sum(b["plan"].values()) / max(1, sum(a["plan"].values()))}
    targets = {"object-store requests per document": 1.25, "objects written per document": 1.25, "longest task": 1.6,
               "most CPU in a task": 1.6,
               "largest worker RSS": 1.3, "driver peak RSS": 1.5, "driver CPU s per document": 1.3}
    print(f"\n{b['n'] // a['n']}N / N, partitions {a['partitions']} -> {b['partitions']}:\n")
    print("| figure | ratio | target |\n| --- | ---: | ---: |")
    for k, v in ratios.items():
        print(f"| {k} | {v:.2f}x | {'<= %.2fx' % targets[k] if k in targets else ''} |")
    # per step: requests per input document at each size (a step whose requests grow faster than the corpus shows here)
    print("\n| step | " + " | ".join(f"requests {r['docs']:,}" for r in res) + " | per document ratio | "
          + " | ".join(f"tasks {r['docs']:,}" for r in res) + " | " + " | ".join(f"longest s {r['docs']:,}" for r in res)
          + " | " + " | ".join(f"most CPU s {r['docs']:,}" for r in res) + " |")
    print("| --- |" + " ---: |" * (4 * len(res) + 1))
    for name in a["steps"]:
        if not all(name in r["steps"] for r in res):
            continue
        q = [sum(r["steps"][name]["requests"].values()) for r in res]
        ratio = (q[-1] / b["docs"]) / (q[0] / a["docs"]) if q[0] else float("nan")
        print(f"| {name} | " + " | ".join(f"{x:,}" for x in q) + f" | {ratio:.2f}x | "
              + " | ".join(f"{r['steps'][name]['tasks']:,}" for r in res) + " | "
              + " | ".join(f"{r['steps'][name]['longest']:.2f}" for r in res) + " | "
              + " | ".join(f"{r['steps'][name]['longest_cpu']:.2f}" for r in res) + " |")


if __name__ == "__main__":
    main()
