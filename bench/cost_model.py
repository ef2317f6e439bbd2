"""A cost model to 10^9 and 2.5x10^10 documents from measured per-task figures: the N and
4N runs of bench.objstore (a whole run against an S3 API with request latency injected,
documents, shards and partitions all x4), extrapolated with the code's own formulas for
how many tasks each step has and how many files each task reads.

    python -m bench.objstore --docs 10000 --scales 1,4 --docs-per-partition 2500 --json os.json
    python -m bench.cost_model os.json [--nodes 100 --cores 64 --latency-ms 20]

Per step, at D documents (every assumption is printed beside the table):

- **tasks**, by the step's kind as the planner counts them: per document shard, S = D /
  50,000 (`max_shard_rows`' default) times the step's tasks per shard in the bench; per
  shuffle partition, rows / 4M (dedup maps: kept documents, x `bands` for fuzzy, x 8 for
  paragraphs as the planner guesses; ids 4M, the id index 32M a task), fuzzy verify 2 x
  pairs x bytes per document / 64 MB, the mixture's rows / `shard_rows`; the merge tier
  ceil(W / group_size(W)) tasks over a shuffle's W writers past 32 (pipeline/steps/merge.py),
  times R = a group's bytes / 2 GB for the text-carrying shuffles (mix-route, fuzzy fetch);
  one task for a model; a threshold, the mixture's selection and the samples one task up to
  1,024 files (one a document shard), past that their tree: 1 + 2 x ceil(files / 1,024)
  tasks (shards/select.py; the samples' 1 + ceil(files / 1,024)), CPU linear in the files.
- **files a task reads from a shuffle**: W, or past 32 writers the merge tier's files,
  at most 64 whatever D.
- **requests per task**: a + b x files read, a and b solved from the N and 4N runs (the
  step's readers read different numbers of files at each); a step reading no shuffle: the
  4N run's mean per task.
- **CPU**: the 4N run's task CPU seconds per document (its shards' `cpu_seconds`; until
  issue 52 the tasks' wall seconds, which held every request's 20 ms as well) x D, x (3,000
  bytes / the bench's bytes per document) for the steps that read text (`--per-request`:
  less the client CPU of the step's requests, s3fs's ~3.5 ms a request measured by
  bench.objstore in the same run, charged per modelled request instead, since a
  50,000-row task makes about as many requests as a bench task of 2,500-5,000 rows); the fuzzy
  components' round tasks: their wall seconds (their CPU is not in a marker), an upper
  bound. The bench's shards are 2,500-5,000 rows, so a task's fixed CPU (its requests'
  client CPU, imports, footers) is counted 10-20x what a 50,000-row shard pays: an upper
  bound too.
- **task time**: CPU + requests x `latency`, serially (an upper bound: shuffle reads keep
  16 in flight).
- **wall**: a step's waves, ceil(tasks / cores), x task time (a step of fewer tasks than
  cores takes a task's time, not a fraction of it); steps one after
  another (the executor overlaps ready steps: this is the pessimistic sum).
- **peak memory per task**: measured; for per-shard steps also the bound if memory grew with
  the shard's rows (50,000 against the bench's rows per shard) above a 300 MB worker.
- **driver**: CPU per task: bench.driver's 1.7 ms measured with empty tasks (`--driver-ms`),
  and the marginal cost from N to 4N of the S3 run as an upper bound; memory: the 4N run's
  peak + 2.2 KB per shard of the largest step (its specs, bench.driver) + 0.82 KB per
  task of the run (every finished shard's marker stays in the driver: the mean size of
  the 4N run's markers in Python).
- **the driver's work per shard, measured** (`--sim sim.json`, bench.scale_sim's largest
  size): each phase's CPU, peak memory and files opened per document shard (planning, shard
  specs, content keys, resume, the mixture's planning over cells, ledger, report, manifest)
  x the document shards at D; these replace the per-task guess for those phases. Still
  modelled, not measured: the driver's CPU per Ray task submitted (`--driver-ms`), the
  object store's latency per request a phase opens (a file opened = one request), and the
  phases scale_sim leaves out (the dedup and quality planning between steps, which read
  one marker a shard as the keys phase does).
Not modelled: stragglers, retries (1% transient faults cost ~1% more requests), network
bandwidth, the object store's per-prefix request rate (S3: 5,500 GET/s per prefix).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from bench.scale import _step_group
from pipeline.steps.merge import GROUP, SPLIT_BYTES, group_size

TEXT_BYTES = 3000  # FineWeb: ~15 T GPT-2 tokens over ~25 B documents ~ 600 tokens ~ 3 KB of text per document
SHARD_DOCS = 50_000  # max_shard_rows' default
PARTITION_ROWS = 4_000_000  # dedup and ids partitions (dedup/plan.py, ingest/ids.py)
INDEX_ROWS = 32_000_000  # id index (ingest/idindex.py)
VERIFY_BYTES = 64 << 20
EDGES_PER_PARTITION = 5_000_000  # connected components (dedup/fuzzy.py)  # fuzzy verify text per partition (dedup/plan.py)
MIX_ROWS = 100_000  # mixture shard_rows' default
BANDS, PARAGRAPHS_PER_DOC = 14, 8
DRIVER_KB_PER_SHARD = 2.2  # bench.driver: planning and resuming a step of 10^5 shards
DRIVER_KB_PER_MARKER = 0.82  # a finished shard's marker held by the driver (mean over the 4N local run's steps)
BASE_RSS = 300.0
# steps whose work grows with the bytes of text (samples-pick reads the texts of the records it picks only)
TEXT_STEPS = ("ids-", "ingest-", "filter-", "dedup-fuzzy-signatures", "dedup-fuzzy-fetch", "dedup-fuzzy-verify",
              "dedup-paragraph-map", "dedup-exact-map", "classify-", "mix-route", "mix")
SPLIT_WRITERS = ("mix-route", "dedup-fuzzy-fetch")  # merged by partition ranges past SPLIT_BYTES a group
ONE = ("-train", "-threshold", "mix-select", "samples", "dedup-fuzzy-clusters")
SELECT_GROUP = 1024  # key files a selecting task reads itself (engine.select_group); past it, its tree's tasks
# reader -> the shuffle it reads (its writer step); a -merge step between them joins the writers' files
READS = {"unique-ids-": "ids-", "id-index-": "ingest-", "dedup-exact-reduce": "dedup-exact-map",
         "dedup-exact": "dedup-exact-reduce", "dedup-fuzzy-buckets": "dedup-fuzzy-signatures",
         "dedup-fuzzy-fetch": "dedup-fuzzy-buckets", "dedup-fuzzy-verify": "dedup-fuzzy-fetch",
         "dedup-paragraph-reduce": "dedup-paragraph-map", "dedup-paragraph": "dedup-paragraph-reduce", "mix": "mix-route",
         "dedup-fuzzy": "dedup-fuzzy-clusters"}


def is_merge(name: str) -> bool:
    return name.endswith("-merge") or name.startswith("merge-")


def writer_of(name: str) -> str | None:
    if name.endswith("-merge"):
        return name[: -len("-merge")]
    if name.startswith("merge-ids-"):
        return "ids-" + name[len("merge-ids-"):]
    if name.startswith("merge-id-index-"):
        return "ingest-" + name[len("merge-id-index-"):]
    for reader, writer in READS.items():
        if name == reader or (reader.endswith("-") and name.startswith(reader)):
            return writer + name[len(reader):] if reader.endswith("-") else writer
    return None


def files_read(writers: int) -> int:
    """Files a reader of `writers` writers' shuffle reads (pipeline/steps/merge.py)."""
    return writers if writers <= GROUP else math.ceil(writers / group_size(writers, GROUP))


def merge_tasks(writers: int) -> int:
    return 0 if writers <= GROUP else math.ceil(writers / group_size(writers, GROUP))


def tasks_at(name: str, run: dict, docs: float, shards: float, at: dict) -> int:
    """The step's task count at `docs` documents (`at`: the counts already computed, for
    the merge tier's writers)."""
    st, n = run["steps"][name], run["docs"]
    sums = st.get("sums", {})
    kept = run["steps"].get("dedup-exact-map", {}).get("sums", {}).get("rows", n) / n * docs  # documents reaching dedup
    if is_merge(name):
        return merge_tasks(at.get(writer_of(name), 0))
    if name.startswith("unique-ids-"):
        return max(1, math.ceil(at.get("ids-" + name[len("unique-ids-"):], 1) * SHARD_DOCS / PARTITION_ROWS))
    if name.startswith("id-index-"):
        return max(1, math.ceil(at.get("ingest-" + name[len("id-index-"):], 1) * SHARD_DOCS / INDEX_ROWS))
    if name == "dedup-exact-reduce":
        return max(1, math.ceil(kept / PARTITION_ROWS))
    if name == "dedup-fuzzy-buckets":
        return max(1, math.ceil(kept * BANDS / PARTITION_ROWS))
    if name == "dedup-paragraph-reduce":
        return max(1, math.ceil(kept * PARAGRAPHS_PER_DOC / PARTITION_ROWS))
    if name == "dedup-fuzzy-verify":
        pairs = run["steps"].get("dedup-fuzzy-buckets", {}).get("sums", {}).get("pairs", 0) / n * docs
        return max(1, math.ceil(2 * pairs * TEXT_BYTES / VERIFY_BYTES))
    if name == "mix":
        rows = sums.get("rows", 0) / n * docs
        return max(1, math.ceil(rows / MIX_ROWS))
    if name.endswith(ONE):
        return 1
    return max(1, math.ceil(shards * st["tasks"] / run["shards"]))


def per_task_requests(name: str, small: dict, big: dict, writers_small: int, writers_big: int) -> tuple[float, float]:
    """(a, b): requests per task = a + b x files read, from the two runs."""
    def q(run):
        st = run["steps"][name]
        return sum(st["requests"].values()) / max(1, st["tasks"]), files_read(writers_small if run is small else writers_big)
    (q0, f0), (q1, f1) = q(small), q(big)
    if writer_of(name) is None or f0 == f1:
        return q1, 0.0
    b = max(0.0, (q1 - q0) / (f1 - f0))
    return max(0.0, q1 - b * f1), b


def cpu_of(st: dict) -> float:
    """A step's CPU seconds in the bench: its shards' `cpu_seconds` (the worker process's CPU
    during the task); runs recorded before markers had them: the tasks' wall seconds, which
    also hold every request's latency (the model adds latency to wall time on its own)."""
    return st["cpu"] if st.get("cpu") else st["total"]


def model(small: dict, big: dict, docs: float, cores: int, latency: float, per_request: dict | None = None) -> list[dict]:
    n = big["docs"]
    text_factor = TEXT_BYTES / (big["chars"] / n)
    shards = docs / SHARD_DOCS
    at: dict[str, int] = {}
    for _ in range(4):  # readers' and merges' counts depend on their writers': to a fixed point (the chain is short)
        for name in big["steps"]:
            at[name] = 1 if name == "dedup-fuzzy-clusters" else tasks_at(name, big, docs, shards, at)
    rows = []
    for name, st in big["steps"].items():
        t = at[name]
        w = writer_of(name)
        w_small, w_big = (small["steps"].get(w, {}).get("tasks", 1), big["steps"].get(w, {}).get("tasks", 1)) if w else (1, 1)
        a, b = per_task_requests(name, small, big, w_small, w_big)
        reads = files_read(at.get(w, 1)) if w else 0
        req_task = a + b * reads
        f = text_factor if name.startswith(TEXT_STEPS) and not is_merge(name) else 1.0
        cpu = cpu_of(st) / n * docs * f
        if per_request:  # the client's CPU per request charged per modelled request, the rest per document
            asked = st["requests"]
            spent = sum(per_request.get("GET" if k == "LIST" else k, per_request["GET"]) * v for k, v in asked.items())
            mean = spent / max(1, sum(asked.values()))
            cpu = max(0.0, cpu_of(st) - spent) / n * docs * f + mean * req_task * t
        if is_merge(name):
            # no merge task ran in the bench (at most 32 writers): the code's figures. A task streams its
            # group's files front to back with MERGE_BUFFER read-ahead, ~1 GET per 4 MB, writes one file
            k = group_size(at.get(w, 1), GROUP) if t else 0
            wbytes = big["steps"][w]["bytes"] / n * docs * (text_factor if w.startswith(TEXT_STEPS) else 1.0)
            per_file = wbytes / max(1, at.get(w, 1))
            # text-carrying shuffles: a group over SPLIT_BYTES is merged by R tasks, one per partition range
            ranges = max(1, math.ceil(k * per_file / SPLIT_BYTES)) if t and w in SPLIT_WRITERS else 1
            t *= ranges
            req_task = 2 * k * max(1.0, per_file / ranges / (4 << 20)) + 4 if t else sum(st["requests"].values())
            cpu = wbytes / 200e6  # a byte copy at ~200 MB/s
            reads = k
        elif name == "dedup-fuzzy-clusters":
            # a coordinator running rounds of waves of tasks over edge partitions (dedup/components.py): each
            # wave's nparts tasks read their segment of each file of the wave before (2 GETs a file) and write
            # one file; past 32 partitions those files are first joined by the merge tier (steps/rounds.py:
            # ceil(nparts / k) merge tasks streaming k files each), so a task reads at most 64 files.
            # nparts = edges / 5M at scale (the bench sets it to its dedup partitions)
            edges = max(1.0, st["sums"].get("edges", 0) / n * docs)
            nparts = max(1, math.ceil(edges / EDGES_PER_PARTITION))
            waves = 6 * max(1, st["sums"].get("rounds", 1)) + 5
            k = group_size(nparts, GROUP) if nparts > GROUP else 0
            files = math.ceil(nparts / k) if k else nparts
            merge_req = files * (2 * k + 4) if k else 0  # per wave: each merge task reads k indexes and k data files
            t = waves * (nparts + (files if k else 0))
            req_task = waves * (2 * nparts * files + 3 * nparts + merge_req) / t  # per round or merge task
            cpu = st["total"] * max(1.0, edges / max(1, st["sums"].get("edges", 1)))  # round tasks ~ linear in edges
            reads = files
        elif name.endswith("-train"):
            # reads one small candidates file (ids and texts) per examples task, 32 in flight (classify/tasks.py)
            files = at.get(name[: -len("-train")] + "-examples", 1)
            req_task = sum(st["requests"].values()) + 2 * files
            cpu = cpu_of(st)
            reads = files
            task_s = cpu + 2 * files * latency / 32
            rows.append({"step": name, "tasks": 1, "files_read": reads, "requests": req_task, "cpu_h": cpu / 3600,
                         "wall_h": task_s / 3600, "rss": st["rss"], "rss_bound": st["rss"]})
            continue
        elif name.endswith("-threshold") or name in ("mix-select", "samples"):
            # a selection over key files, one a document shard (shards/select.py): up to SELECT_GROUP read by
            # the selecting task; past that a tree: tasks of SELECT_GROUP files sum their footers' histograms,
            # then read the answer's bin, and the selecting task adds their results up. CPU: the bench's per
            # key file, x files; requests: a footer and a row group a file (the bench's land in the score folder)
            base = {"mix-select": "mix-priority", "samples": "samples-pick"}.get(name) or next(
                (k for k in big["steps"] if k.startswith("classify-") and k.endswith("-" + name[len("quality-"):-len("-threshold")])),
                "mix-priority")
            files = at.get(base, 1)
            cpu = cpu_of(st) / max(1, big["steps"][base]["tasks"]) * files
            groups = math.ceil(files / SELECT_GROUP) if files > SELECT_GROUP else 0
            waves = 1 if name == "samples" else 2  # the samples' tasks keep their groups' best in one pass
            t = 1 + waves * groups
            req_task = (2 * files + sum(st["requests"].values())) / t
            reads = min(files, SELECT_GROUP)
            task_s = cpu / t + req_task * latency / 32  # 32 reads in flight (fs.read_many)
            rows.append({"step": name, "tasks": t, "files_read": reads, "requests": t * req_task, "cpu_h": cpu / 3600,
                         "wall_h": (waves * math.ceil(groups / cores) + 1) * task_s / 3600 if groups else task_s / 3600,
                         "rss": st["rss"], "rss_bound": st["rss"]})
            continue
        elif name.endswith(ONE):  # one task: its requests and CPU as they grew from N to 4N (a power law)
            grow = lambda x0, x1: x1 * (docs / n) ** max(0.0, math.log(max(x1, 1e-9) / max(x0, 1e-9)) / math.log(n / small["docs"]))  # noqa: E731
            req_task = grow(sum(small["steps"][name]["requests"].values()), sum(st["requests"].values()))
            cpu = grow(cpu_of(small["steps"][name]), cpu_of(st))
        task_s = cpu / max(1, t) + req_task * latency
        wall = math.ceil(t / cores) * task_s  # waves of `cores` tasks: a step of fewer tasks than cores takes one task's time
        if name == "dedup-fuzzy-clusters":  # its waves run one after another
            wall = waves * max(task_s, nparts * task_s / cores)
        rss_bound = st["rss"] if not name.startswith(TEXT_STEPS) or t == 1 else \
            BASE_RSS + max(0.0, st["rss"] - BASE_RSS) * SHARD_DOCS / (n / big["shards"])
        rows.append({"step": name, "tasks": t, "files_read": reads, "requests": t * req_task, "cpu_h": cpu / 3600,
                     "wall_h": wall / 3600, "rss": st["rss"], "rss_bound": rss_bound})
    return rows


def _group(name: str) -> str:
    """Per-source steps folded into one row (bench.scale's grouping, and the per-source merge steps)."""
    for pre in ("merge-ids-", "merge-id-index-"):
        if name.startswith(pre):
            return pre + "*"
    return _step_group(name)


# ---------------------------------------------------------------- terms that grow faster than the corpus (issue 58)

INPUT_FILE_BYTES = 2 << 30  # an input Parquet file (FineWeb's are ~2 GB); planning reads its footer
OUTPUT_FILES_PER_MIX_SHARD = 1 + 2 * 2  # a mixture file, and two token formats' file pairs
FOOTER_BYTES = 64 << 10
INDEX_WINDOW = 64 << 20  # pipeline/shards/shuffle.py
STREAM_FRAMING = 696  # bytes of an IPC stream of the signatures' 4 columns beyond its rows' 32 B (a 1-row stream: 728 B)
RAW_HEADER = 43  # a raw segment of the same 4 columns: magic, row count and layout (a 1-row segment: 75 B)


def growth_terms(docs: float, latency: float, cores: int) -> list[tuple[str, str, str, str]]:
    """(term, formula, before, after) at `docs` documents: the terms issue 58 names, from the
    code's own constants; 'after' is this code."""
    shards = docs / SHARD_DOCS
    g = group_size(int(shards), GROUP)
    out = []
    for name, rows in (("signatures -> buckets", docs * BANDS), ("ids -> unique ids", docs)):
        parts = max(1, math.ceil(rows / PARTITION_ROWS))
        whole = g * (parts + 1) * 8
        windows = math.ceil(whole / INDEX_WINDOW)
        out.append((f"merge index per task, {name}",
                    f"group {g:,} maps x {parts:,} partitions x 8 B",
                    f"{whole / 2**30:.2f} GB held, {g:,} GETs",
                    f"{min(whole, INDEX_WINDOW) / 2**20:.0f} MB held, {g * windows:,} ranged GETs "
                    f"({g * windows * latency / 32 / 60:.0f} min at 32 in flight)"))
    files = docs * TEXT_BYTES / INPUT_FILE_BYTES
    out.append(("planning reads of input Parquet footers",
                f"{files:,.0f} files of {INPUT_FILE_BYTES >> 30} GB",
                f"2 x {files:,.0f} serial reads ({2 * files * latency / 3600:.2f} h of latency; whole objects "
                f"under 64 MB)",
                f"{files:,.0f} ranged GETs of 64 KB, 32 in flight ({files * latency / 32 / 60:.1f} min; "
                f"{files * FOOTER_BYTES / 2**30:.1f} GB read)"))
    published = docs / MIX_ROWS * OUTPUT_FILES_PER_MIX_SHARD
    out.append(("publishing into an object-store run directory",
                f"{published:,.0f} files (mixture, two token formats)",
                f"10.1 requests a file, serial: {published * 0.270 / 3600:,.1f} h (270 ms a file measured)",
                f"2.0 requests a file, 32 in flight: {published * 2 * latency / 32 / 3600:.2f} h "
                "(bench/publish.py: 8-12 ms a file)"))
    # the signatures shuffle's segments: each map's 14 x 50,000 band rows over its partitions
    rows, parts = SHARD_DOCS * BANDS, max(1, math.ceil(docs * BANDS / PARTITION_ROWS))
    segs = shards * parts * (1 - math.exp(-rows / parts))  # non-empty (map, partition) pairs
    data = docs * BANDS * 32
    raw = rows / parts <= 256  # shuffle.RAW_ROWS: small fixed-width segments are written raw
    out.append(("segment framing, signatures -> buckets",
                f"{segs:,.0f} segments of {rows / parts:,.1f} rows; {data / 1e9:,.0f} GB of rows",
                f"an IPC stream a segment, {STREAM_FRAMING} B: {segs * STREAM_FRAMING / 1e9:,.0f} GB of framing",
                (f"raw segments, a {RAW_HEADER} B header: {segs * RAW_HEADER / 1e9:,.0f} GB" if raw else
                 "as before (segments past 256 rows stay streams, whose framing is then under 10% of their rows)")))
    n = docs / 5000
    out.append(("semantic dedup's clusters", "k <= sample / 20 = 5,000",
                f"{n:,.0f} documents a cluster, all pairs: {n / 2:,.0f} comparisons a member",
                "groups of <= 50,000 by bisection (max_cluster_rows): <= 25,000 comparisons a member, "
                f"{math.ceil(math.log2(max(1, n / 50_000)))} bisection levels"))
    return out


def print_terms(latency: float, cores: int) -> None:
    for docs in (1e9, 2.5e10):
        print(f"\n#### terms that grow faster than the corpus, {docs:.2g} documents\n")
        print("| term | size | before | after |")
        print("| --- | --- | --- | --- |")
        for t in growth_terms(docs, latency, cores):
            print("| " + " | ".join(t) + " |")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.cost_model", description=__doc__.split("\n\n")[0])
    ap.add_argument("objstore_json", nargs="?", help="bench.objstore --json output with two scales (N and 4N); "
                    "without it, only the terms that grow faster than the corpus")
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--cores", type=int, default=64)
    ap.add_argument("--latency-ms", type=float, default=None, help="per request (default: the bench's)")
    ap.add_argument("--per-request", action="store_true",
                    help="charge a step's requests at the client's measured CPU per request and scale only the rest "
                         "with the documents (default: all of it with the documents, an upper bound: a 50,000-row "
                         "task makes about the requests of a bench task of 2,500-5,000 rows)")
    ap.add_argument("--driver-ms", type=float, default=1.7, help="driver CPU per task (bench.driver --tasks; default 1.7)")
    ap.add_argument("--sim", type=Path, default=None,
                    help="bench.scale_sim --json output: the driver's phases per document shard, measured")
    a = ap.parse_args(argv)
    if a.sim is not None:
        sim_terms(json.loads(a.sim.read_text()), (a.latency_ms or 20) / 1000)
    if a.objstore_json is None:
        print_terms((a.latency_ms or 20) / 1000, a.nodes * a.cores)
        return {}
    data = json.loads(Path(a.objstore_json).read_text())
    runs = next(iter(data["results"].values()))
    small, big = runs[0], runs[-1]
    for r in (small, big):
        r["shards"] = max(s["tasks"] for k, s in r["steps"].items() if k.startswith("filter-") or k == "dedup-exact-map")
    latency = (a.latency_ms if a.latency_ms is not None else data["latency_ms"]) / 1000
    cores = a.nodes * a.cores
    per_request = data.get("client_cpu_per_request") if a.per_request else None
    if a.per_request and not per_request:
        raise SystemExit(f"{a.objstore_json}: no client_cpu_per_request (a bench.objstore run before it measured it): "
                         "run bench.objstore again, or leave --per-request out")
    if per_request:
        print("client CPU per request, measured in the same bench run: " +
              ", ".join(f"{k} {v * 1000:.2f} ms" for k, v in per_request.items()) +
              "; charged per modelled request, the rest of a step's CPU per document (clamped at 0 where the "
              "serial rate exceeds what a step's concurrent requests cost: a lower estimate, not a bound)")
    else:
        print("every step's CPU scaled per document, its requests' client CPU too (an upper bound)")
    t_small = sum(s["tasks"] for s in small["steps"].values())
    t_big = sum(s["tasks"] for s in big["steps"].values())
    driver_per_task = max(0.0, (big["driver_cpu"] - small["driver_cpu"]) / max(1, t_big - t_small))
    print("driver CPU per task is an upper bound: the marginal from N to 4N also holds what grows with wall time "
          "(lease renewals, Ray's driver threads)")
    print(f"measured: {small['docs']:,} and {big['docs']:,} documents on S3 (moto) with {data['latency_ms']:g} ms a request, "
          f"{big['chars'] / big['docs']:.0f} bytes of text each; modelled: {TEXT_BYTES} bytes a document, {SHARD_DOCS:,} a shard, "
          f"{a.nodes} nodes x {a.cores} cores, {latency * 1000:g} ms a request")
    out = {}
    for docs in (1e9, 2.5e10):
        rows = model(small, big, docs, cores, latency, per_request)
        out[docs] = rows
        groups: dict[str, dict] = {}
        for r in rows:
            g = groups.setdefault(_group(r["step"]), {"tasks": 0, "files_read": 0, "requests": 0.0, "cpu_h": 0.0, "wall_h": 0.0,
                                                      "rss": 0.0, "rss_bound": 0.0})
            for k in ("tasks", "requests", "cpu_h", "wall_h"):
                g[k] += r[k]
            for k in ("files_read", "rss", "rss_bound"):
                g[k] = max(g[k], r[k])
        print(f"\n#### {docs:.2g} documents\n")
        print("| step | tasks | files a task reads | requests | requests per document | CPU hours | wall hours | peak RSS MB (bound at 50k rows) |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for k, g in groups.items():
            print(f"| {k} | {g['tasks']:,} | {g['files_read']:,} | {g['requests']:.3g} | {g['requests'] / docs:.4f} | {g['cpu_h']:,.0f} | "
                  f"{g['wall_h']:.2f} | {g['rss']:.0f} ({g['rss_bound']:.0f}) |")
        tasks = sum(r["tasks"] for r in rows)
        req = sum(r["requests"] for r in rows)
        biggest = max(r["tasks"] for r in rows)
        print(f"| **total** | {tasks:,} | | {req:.3g} | {req / docs:.4f} | {sum(r['cpu_h'] for r in rows):,.0f} | "
              f"{sum(r['wall_h'] for r in rows):.1f} | |")
        fuzzy = sum(r["cpu_h"] for r in rows if r["step"].startswith("dedup-fuzzy"))
        print(f"\nfuzzy dedup (its steps and merges): {fuzzy:,.0f} CPU hours, {fuzzy / docs * 1e9:,.0f} per 10^9 documents")
        mem = big["driver_rss_mb"] + DRIVER_KB_PER_SHARD * biggest / 1024 + DRIVER_KB_PER_MARKER * tasks / 1024
        print(f"\ndriver: {a.driver_ms:.2f} ms CPU per task (bench.driver) -> {a.driver_ms / 1000 * tasks / 3600:.2f} h for {tasks:,} tasks "
              f"(upper bound: {driver_per_task * 1000:.2f} ms, the marginal from {t_small:,} to {t_big:,} tasks on S3 -> "
              f"{driver_per_task * tasks / 3600:.2f} h); memory ~{mem:,.0f} MB (largest step: {biggest:,} shard specs; "
              f"{tasks:,} markers)")
        meas = [sum(sum(s['requests'].values()) for s in r['steps'].values()) / r['docs'] for r in (small, big)]
        print(f"requests per document in steps: measured {meas[0]:.4f} (N) and {meas[1]:.4f} (4N) at 2,500-5,000-row shards; "
              f"modelled {req / docs:.4f} at {SHARD_DOCS:,}-row shards")
    print_terms(latency, cores)
    return out


def sim_terms(rows: list[dict], latency: float) -> dict[float, dict[str, tuple[float, float, float]]]:
    """The driver's phases at 10^9 and 2.5x10^10 documents from bench.scale_sim's largest size
    (per document shard: CPU µs, peak bytes, files opened), one shard per SHARD_DOCS documents."""
    r = rows[-1]
    phases = [k[: -len("_cpu_us_per_shard")] for k in r if k.endswith("_cpu_us_per_shard")]
    print(f"\nthe driver's phases, measured by bench.scale_sim at {r['shards']:,} document shards and {r['cells']} cells "
          f"(a file opened: one request of {latency * 1000:g} ms, serially: an upper bound)")
    out = {}
    for docs in (1e9, 2.5e10):
        n = docs / SHARD_DOCS
        got = {p: (r[p + "_cpu_us_per_shard"] * n / 1e6 / 3600, r[p + "_bytes_per_shard"] * n / 2**20,
                   r[p + "_requests_per_shard"] * n * latency / 3600) for p in phases}
        out[docs] = got
        print(f"\n{docs:.2g} documents ({n:,.0f} document shards):\n")
        print("| phase | driver CPU h | peak driver MB | requests' latency h |")
        print("| --- | ---: | ---: | ---: |")
        for p, (cpu, mb, lat) in got.items():
            print(f"| {p} | {cpu:.3f} | {mb:,.0f} | {lat:.3f} |")
        print(f"| **total** | {sum(v[0] for v in got.values()):.2f} | {max(v[1] for v in got.values()):,.0f} (largest) | "
              f"{sum(v[2] for v in got.values()):.2f} |")
    return out


if __name__ == "__main__":
    main()
