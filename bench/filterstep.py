"""The filter step in a real run against datatrove's own pipeline, one worker each, per kind of text.

    python -m bench.filterstep [--docs 800] [--kinds K,..]

For each kind (bench/textkinds.py) the same documents are written as two JSONL.zst files.
Curate: `curate run --workers 1` of a mixture with that one source and the chain Gopher
repetition -> Gopher quality -> C4 quality -> FineWeb quality; the figure is the filter
step's task seconds from its shard markers (reading the shard, filtering, writing the
decisions). datatrove: JsonlReader -> the same four filters -> JsonlWriter under its
LocalPipelineExecutor with two tasks and one worker, its wall time (reading, filtering,
writing). Both start from a cold process, as a run does. Printed per kind: docs/s and MB/s
per core for both, the ratio, and the worst kind. Not a test: timings never gate CI.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import orjson
import zstandard

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / ".cache" / "bench" / "filterstep"


def write_corpus(texts: list[str], d: Path):
    shutil.rmtree(d, ignore_errors=True)
    (d / "docs").mkdir(parents=True)
    half = (len(texts) + 1) // 2
    for k, part in enumerate((texts[:half], texts[half:])):
        data = b"".join(orjson.dumps({"id": f"d{k}-{i}", "text": t}) + b"\n" for i, t in enumerate(part))
        (d / "docs" / f"part-{k}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))


def run_curate(corpus: Path, out: Path) -> float:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    y = out / "kind.yaml"
    y.write_text(f"""name: kind
seed: 0
sources:
  docs:
    paths: ["{corpus}/docs/*.jsonl.zst"]
    id_field: id
    filters: [gopher_repetition, gopher_quality, c4_quality, fineweb_quality]
filters:
  gopher_repetition: {{type: gopher_repetition}}
  gopher_quality: {{type: gopher_quality}}
  c4_quality: {{type: c4_quality, filter_no_terminal_punct: false}}
  fineweb_quality: {{type: fineweb_quality}}
mixture:
  weights: {{docs: 1.0}}
""")
    r = subprocess.run([sys.executable, "-m", "pipeline", "run", str(y), "--workers", "1", "--output", str(out), "--quiet"],
                       capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        raise SystemExit(f"curate run failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    steps = json.loads((out / "kind" / "run.json").read_text())["steps"]
    st = steps["filter-docs"]
    return sum(json.loads(m.read_text())["seconds"] for m in (out / "kind" / st["dir"] / "_markers").glob("*.json"))


def datatrove_child(corpus: str, work: str) -> dict:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.filters import C4QualityFilter, FineWebQualityFilter, GopherQualityFilter, GopherRepetitionFilter
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter

    pipeline = [JsonlReader(f"{corpus}/docs", glob_pattern="*.jsonl.zst"), GopherRepetitionFilter(), GopherQualityFilter(),
                C4QualityFilter(filter_no_terminal_punct=False), FineWebQualityFilter(),
                JsonlWriter(f"{work}/out", compression="zstd", output_filename="${rank}.jsonl.zst")]
    t0 = time.perf_counter()
    LocalPipelineExecutor(pipeline, tasks=2, workers=1, logging_dir=f"{work}/logs").run()
    return {"wall": time.perf_counter() - t0}


def run_datatrove(corpus: Path, work: Path) -> float:
    shutil.rmtree(work, ignore_errors=True)
    r = subprocess.run([sys.executable, "-m", "bench.filterstep", "--datatrove-child", str(corpus), str(work)],
                       capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        raise SystemExit(f"datatrove failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])["wall"]


def main(argv=None):
    from bench import textkinds

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=800, help="documents of each kind")
    ap.add_argument("--kinds", default=",".join(textkinds.KINDS))
    ap.add_argument("--datatrove-child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.datatrove_child:
        print(json.dumps(datatrove_child(*args.datatrove_child)))
        return
    kinds = textkinds.build(args.docs)
    print("| kind | docs | KB/doc | datatrove docs/s (MB/s) | Curate filter step docs/s (MB/s) | ratio |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    worst = None
    for kind in args.kinds.split(","):
        texts = kinds[kind]
        d = WORK / kind.replace(" ", "-")
        write_corpus(texts, d / "corpus")
        mb = sum(len(t.encode()) for t in texts) / 1e6
        t_cu = run_curate(d / "corpus", d / "curate")
        t_dt = run_datatrove(d / "corpus", d / "datatrove")
        n = len(texts)
        ratio = t_dt / t_cu
        worst = min(worst or (ratio, kind), (ratio, kind))
        print(f"| {kind} | {n:,} | {1e3 * mb / n:.1f} | {n / t_dt:,.0f} ({mb / t_dt:.2f}) | {n / t_cu:,.0f} ({mb / t_cu:.2f}) | "
              f"**{ratio:.1f}x** |", flush=True)
    print(f"worst kind: {worst[1]} at {worst[0]:.1f}x datatrove (one worker each, filter step's task seconds vs datatrove's wall)")


if __name__ == "__main__":
    main()
