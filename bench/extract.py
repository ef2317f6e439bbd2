"""Web extraction throughput: WARC reading and HTML-to-text, per core, against datatrove.

    python -m bench.extract [--pages 6000] [--json FILE]

The crawl: the demo's generated pages (real Wikipedia text with navigation, cookie banners,
spam and copies; pipeline/demo_data.py) rendered as HTML and written as WARC.gz by
pipeline/demo_warc.py, `--pages` of them, cached under .cache/bench/warc-<pages>/. Each
figure is measured on one core in this run:

1. reading: Curate's reader (FastWARC, with its length checks) against warcio (the library
   under datatrove's WarcReader): records/s and compressed MB/s.
2. extraction in process, CPU time: resiliparse and trafilatura with Curate's defaults,
   after decoding: pages/s per core.
3. the same through Curate's sandbox (a child process with a CPU-time limit per page), as
   ingest runs it: pages/s of wall time, parent and child together.
4. Curate's ingest task on each file, in this process (read, decode, extract in the
   sandbox, write the Parquet shard): pages/s of wall time, and per core (CPU of the task
   and its extractor process together; they overlap, one page ahead).
5. datatrove: WarcReader -> Trafilatura (its sandbox, same options, deduplicate off) ->
   JsonlWriter, one task, one worker: the same two figures; and how often its text equals
   Curate's trafilatura text.

Needs the bench extra (`pip install -e '.[bench]'`: warcio, faust-cchardet, python-magic
for datatrove's reader). Prints a table; --json writes every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAFILATURA = {"type": "trafilatura", "timeout": 5.0, "favor_precision": True, "favor_recall": False,
               "include_comments": False, "include_tables": True, "include_images": False, "include_links": False,
               "include_formatting": False}


def build_crawl(pages: int) -> Path:
    from pipeline import demo_data, demo_warc

    d = ROOT / ".cache" / "bench" / f"warc-{pages}"
    if (d / "warc" / ".done").exists():
        return d / "warc"
    wheels = Path(os.environ.get("CURATE_WHEEL_DIR") or ROOT / ".cache" / "wheels")
    wiki = demo_data.wiki_records(demo_data.wheel(wheels))["en"]
    web = [{k: v for k, v in r.items() if k != "copy_of"} for r in demo_data.web_records(wiki, pages)]
    demo_warc.build(d, web)
    (d / "warc" / ".done").touch()
    return d / "warc"


def html_pages(files: list[Path]) -> list[tuple[str, str]]:
    """(url, decoded HTML) of every page ingest would extract."""
    from pipeline.steps.ingest import extract
    from pipeline.io import warc

    out = []
    for f in files:
        for r in warc.iter_records(str(f), "gzip", 1 << 26, {}):
            if r.status == 200 and extract.is_html(r.content_type, r.payload):
                out.append((r.url, extract.decode(r.payload, r.charset)[0]))
    return out


def bench_read(files: list[Path]) -> dict:
    from warcio.archiveiterator import ArchiveIterator as WarcioIterator

    from pipeline.io import warc

    mb = sum(f.stat().st_size for f in files) / 1e6
    t = time.process_time()
    n = 0
    for f in files:
        n += sum(1 for _ in warc.iter_records(str(f), "gzip", 1 << 26, {}))
    curate_s = time.process_time() - t
    t = time.process_time()
    m = 0
    for f in files:
        with open(f, "rb") as fh:
            for rec in WarcioIterator(fh):
                if rec.rec_type in ("response", "conversion", "resource"):
                    rec.content_stream().read()
                    m += 1
    warcio_s = time.process_time() - t
    return {"records": n, "mb": round(mb, 1), "curate_s": round(curate_s, 3), "warcio_s": round(warcio_s, 3),
            "curate_rec_s": round(n / curate_s), "warcio_rec_s": round(m / warcio_s)}


def bench_inprocess(pages: list[tuple[str, str]], spec: dict) -> dict:
    from pipeline.steps.ingest import extract

    fn = extract.make_extractor(spec)
    fn(pages[0][1])
    t = time.process_time()
    texts = [fn(h) for _, h in pages]
    s = time.process_time() - t
    return {"pages": len(pages), "cpu_s": round(s, 3), "pages_s": round(len(pages) / s, 1), "texts": texts}


def bench_sandbox(pages: list[tuple[str, str]], spec: dict) -> dict:
    from pipeline.steps.ingest import extract

    sb = extract.Sandbox(spec)
    sb.extract(pages[0][1])  # started
    t0, c0 = time.monotonic(), time.process_time()
    for _, h in pages:
        sb.extract(h)
    wall, parent_cpu = time.monotonic() - t0, time.process_time() - c0
    sb.close()
    return {"pages": len(pages), "wall_s": round(wall, 3), "parent_cpu_s": round(parent_cpu, 3),
            "pages_s": round(len(pages) / wall, 1)}


def _cpu() -> float:
    """CPU seconds of this process and its finished children (the extractor processes)."""
    import resource

    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def bench_ingest(files: list[Path], spec: dict, work: Path) -> dict:
    """Curate's ingest task on each file (read, decode, extract in the sandbox, write the
    document shard), in this process: wall time, and CPU of the task and its extractor."""
    from pipeline.steps.ingest import documents as ingest

    class Out:
        def __init__(self, d: Path):
            self.dir, self.index = d, 0

        def path(self, suffix, sub=None):
            p = self.dir / (sub or "") / f"part-00000{suffix}"
            p.parent.mkdir(parents=True, exist_ok=True)
            return p

    pages = 0
    t, c = time.monotonic(), _cpu()
    for i, f in enumerate(files):
        fd = {"path": str(f), "rel": f.name, "format": "warc", "compression": "gzip", "size": f.stat().st_size,
              "mtime_ns": 0, "unreadable": None}
        spec_ = {"source": "crawl", "tokenizer": None, "on_bad_record": "quarantine", "max_doc_bytes": 1 << 26,
                 "extract": spec, "html_field": None, "text_field": "text", "id_field": None, "split": {"file": fd}}
        pages += ingest.run_shard(spec_, Out(work / f"ingest-{spec['type']}-{i}"))["extract"]["pages"]
    wall, cpu = time.monotonic() - t, _cpu() - c
    return {"pages": pages, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "pages_s_wall": round(pages / wall, 1),
            "pages_s_core": round(pages / cpu, 1)}


def bench_datatrove(warc_dir: Path, work: Path) -> dict:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.extractors import Trafilatura
    from datatrove.pipeline.readers import WarcReader
    from datatrove.pipeline.writers import JsonlWriter

    out = work / "dt"
    shutil.rmtree(out, ignore_errors=True)
    ex = LocalPipelineExecutor(pipeline=[
        WarcReader(str(warc_dir), glob_pattern="*.warc.gz"),
        Trafilatura(favour_precision=True, timeout=5.0, deduplicate=False),
        JsonlWriter(str(out / "docs"), compression=None),
    ], tasks=1, workers=1, logging_dir=str(out / "logs"))
    t, c = time.monotonic(), _cpu()
    ex.run()  # one task, one worker: in this process; its extractor sandbox is a forked child
    wall, cpu = time.monotonic() - t, _cpu() - c
    docs = [json.loads(x) for f in sorted((out / "docs").glob("*.jsonl")) for x in open(f)]
    return {"docs": len(docs), "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "texts": {d["metadata"]["url"]: d["text"] for d in docs}}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.extract", description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=6000, help="crawl pages (HTML responses, plus the planted odd records)")
    ap.add_argument("--json", help="write every figure here")
    args = ap.parse_args(argv)
    warc_dir = build_crawl(args.pages)
    files = sorted(warc_dir.glob("*.warc.gz"))
    pages = html_pages(files)
    print(f"crawl: {len(files)} WARC.gz files, {sum(f.stat().st_size for f in files) / 1e6:.1f} MB, {len(pages):,} HTML pages",
          file=sys.stderr)
    from pipeline.config import ResiliparseExtract

    specs = {"resiliparse": ResiliparseExtract().model_dump(mode="json"), "trafilatura": TRAFILATURA}
    res: dict = {"pages": len(pages), "read": bench_read(files)}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, spec in specs.items():
            r = {"in_process": bench_inprocess(pages, spec), "sandbox": bench_sandbox(pages, spec),
                 "ingest": bench_ingest(files, spec, work)}
            res[name] = r
            print(f"{name}: {r['in_process']['pages_s']} pages/s in process, {r['sandbox']['pages_s']} sandboxed, "
                  f"{r['ingest']['pages_s_core']} per core in the ingest task", file=sys.stderr)
        dt = bench_datatrove(warc_dir, work)
    ours = dict(zip([u for u, _ in pages], res["trafilatura"]["in_process"]["texts"], strict=True))
    both = [u for u in dt["texts"] if u in ours]
    differ = [u for u in both if ours[u] != dt["texts"][u]]
    charset = [u for u in differ if "declared" in u]  # the planted pages that lie about their charset
    res["datatrove"] = {"docs": dt["docs"], "wall_s": dt["wall_s"], "cpu_s": dt["cpu_s"],
                        "pages_s_wall": round(dt["docs"] / dt["wall_s"], 1), "pages_s_core": round(dt["docs"] / dt["cpu_s"], 1),
                        "compared": len(both), "same_text": len(both) - len(differ), "differ_charset": len(charset),
                        "differ_other": differ[:20] if len(differ) > len(charset) else [],
                        "only_datatrove": len([u for u in dt["texts"] if u not in ours])}
    rd = res["read"]
    tr, rs, d = res["trafilatura"], res["resiliparse"], res["datatrove"]
    rows = [
        ("read WARC.gz (records/s, one core)", rd["warcio_rec_s"], rd["curate_rec_s"]),
        ("trafilatura alone, in process (pages/s per core)", None, tr["in_process"]["pages_s"]),
        ("trafilatura: read, extract, write (pages/s per core)", d["pages_s_core"], tr["ingest"]["pages_s_core"]),
        ("trafilatura: read, extract, write (pages/s, one task)", d["pages_s_wall"], tr["ingest"]["pages_s_wall"]),
        ("resiliparse alone, in process (pages/s per core)", None, rs["in_process"]["pages_s"]),
        ("resiliparse: read, extract, write (pages/s per core)", None, rs["ingest"]["pages_s_core"]),
        ("resiliparse: read, extract, write (pages/s, one task)", None, rs["ingest"]["pages_s_wall"]),
    ]
    print(f"\n{'':58} {'datatrove':>10} {'Curate':>10} {'ratio':>7}")
    for label, a, b in rows:
        print(f"{label:58} {a if a is not None else '':>10} {b:>10} {(f'{b / a:.2f}x' if a else ''):>7}")
    print(f"\nsandbox cost: resiliparse {res['resiliparse']['sandbox']['pages_s']} pages/s sandboxed vs "
          f"{res['resiliparse']['in_process']['pages_s']} in process; trafilatura {res['trafilatura']['sandbox']['pages_s']} vs "
          f"{res['trafilatura']['in_process']['pages_s']}")
    print(f"same trafilatura text as datatrove on {d['same_text']:,} of the {d['compared']:,} pages both extracted "
          f"({100 * d['same_text'] / max(1, d['compared']):.2f}%); different: {d['differ_charset']} pages that lie about "
          f"their charset (see RESULTS.md), {len(differ) - len(charset)} others; datatrove also keeps {d['only_datatrove']} "
          "pages Curate removes (HTTP errors: its reader does not look at the status)")
    if args.json:
        for name in specs:
            res[name]["in_process"].pop("texts", None)
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
