"""Every step of a whole chain against its filters and the I/O floor, per kind of text (issue 52).

    python -m bench.steps [--docs 8000] [--scales 1,4] [--per-file 2000] [--kinds K,..] [--workers 2] [--json F]

For each kind of text (bench/textkinds.py) and each size (`--docs` x each of `--scales`,
files x the scale too, so shards and partitions grow with the corpus), the documents are
written as JSONL.zst files of `--per-file` and `curate run --workers W` runs a mixture of that one
source through the chain a crawl gets: ingest -> filters -> exact, fuzzy (verified) and
paragraph dedup -> the mixture (Parquet) -> samples and the report. Prose, technical
documents, code and non-English prose get the full heuristic chain (Gopher repetition,
Gopher quality, C4, FineWeb); short texts get two cheap filters (length, Gopher repetition),
as a crawl's short pages would. No classifier: its cost is the model's.

Printed per kind and size: every step's task CPU (its shards' markers) in µs per input
document and per input MB, the tokenizer's time (`tokenizer_seconds` of the filter and
paragraph steps' markers) taken out of its step as "token counts", a model's cost; the I/O floor measured in the same run (one core: read,
decompress, parse, write Parquet, nothing else) in the same units; the chain's task CPU over
the filter steps' (the issue's ratio) and over the floor; the CPU of every process of the
command (a cgroup: Ray's start and the driver included). Not a test: timings never gate CI.
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / ".cache" / "bench" / "steps"
PER_FILE = 2000
FULL = ["gopher_repetition", "gopher_quality", "c4_quality", "fineweb_quality"]
CHEAP = ["long_enough", "gopher_repetition"]
STAGES = [  # (stage, step-name prefixes), in pipeline order
    ("ingest", ("scan-", "ids-", "unique-ids", "ingest-", "id-index")),
    ("filters", ("filter-",)),
    ("exact dedup", ("dedup-exact",)),
    ("fuzzy dedup", ("dedup-fuzzy",)),
    ("paragraph dedup", ("dedup-paragraph",)),
    ("mixture", ("mix",)),
    ("samples", ("samples",)),
    ("token counts", ()),  # the tokenizer, as a model: taken out of the step that runs it
]


def stage_of(step: str) -> str:
    for stage, prefixes in STAGES:
        if step.startswith(prefixes):
            return stage
    return "other: " + step.split("-")[0]


def write_corpus(texts: list[str], folder: Path, prefix: str, per_file: int = PER_FILE) -> float:
    """JSONL.zst files of `per_file` documents; returns the texts' MB."""
    import orjson
    import zstandard

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(0, len(texts), per_file):
        lines = b"".join(orjson.dumps({"id": f"{prefix}{j:08d}", "text": t}) + b"\n"
                         for j, t in enumerate(texts[i:i + per_file], start=i))
        (folder / f"part-{i // per_file:05d}.jsonl.zst").write_bytes(zstandard.ZstdCompressor(level=3).compress(lines))
    return sum(len(t.encode()) for t in texts) / 1e6


def io_floor(folder: Path, tmp: Path) -> float:
    """CPU seconds of one core reading, decompressing, parsing and writing the files as Parquet."""
    import orjson
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    tmp.mkdir(parents=True, exist_ok=True)
    def convert(f: Path) -> None:
        ids, texts = [], []
        with f.open("rb") as fh, zstandard.ZstdDecompressor().stream_reader(fh) as r:
            for line in io.BufferedReader(r, 1 << 20):
                rec = orjson.loads(line)
                ids.append(rec["id"])
                texts.append(rec["text"])
        pq.write_table(pa.table({"id": ids, "text": texts}), tmp / f"{f.name}.parquet", compression="zstd")

    files = sorted(folder.glob("*.jsonl.zst"))
    convert(files[0])  # imports and first calls are not the floor
    c0 = time.process_time()
    for f in files:
        convert(f)
    return time.process_time() - c0


DEDUP = """dedup:
  exact: {}
  fuzzy: {ngram: 5, num_perm: 112, bands: 14, threshold: 0.8, verify: true}
  paragraph: {min_chars: 50, max_occurrences: 5}
"""


def mixture_yaml(folder: Path, out: Path, filters: list[str], name: str = "steps", dedup: bool = True) -> Path:
    """A mixture of one source (`web`) of JSONL.zst files with these filters, all dedup
    kinds (or none), the whole source in the mixture; bench.whole uses it without dedup."""
    y = out / f"{name}.yaml"
    out.mkdir(parents=True, exist_ok=True)
    y.write_text(f"""name: {name}
output: {out}
seed: 0
tokenizer: gpt2
sources:
  web: {{paths: ["{folder}/*.jsonl.zst"], id_field: id, filters: [{", ".join(filters)}]}}
filters:
  long_enough: {{type: length, min_chars: 200}}
  gopher_repetition: {{type: gopher_repetition}}
  gopher_quality: {{type: gopher_quality}}
  c4_quality: {{type: c4_quality, filter_no_terminal_punct: false}}
  fineweb_quality: {{type: fineweb_quality}}
{DEDUP if dedup else ""}mixture:
  target_tokens: 1000000000000
  weights: {{web: 1.0}}
  max_epochs: 1
  on_shortfall: renormalize
""")
    return y


def step_cpu(out: Path, name: str = "steps") -> tuple[dict[str, float], dict[str, float]]:
    """Task CPU seconds per stage and per step of the last run under `out` (computed shards' markers)."""
    from pipeline.engine.step import read_markers

    run = json.loads((out / name / "run.json").read_text())
    cpu, steps = collections.Counter(), {}
    for name, v in run["steps"].items():
        if v.get("status") != "SUCCESS":
            continue
        ms = read_markers(out / "_store" / "steps" / v["dir"].split("/")[-1]).values()
        own = [m for m in ms if "reused_from" not in m]
        steps[name] = sum(m.get("cpu_seconds", 0) for m in own)
        tok = sum(st.get("tokenizer_seconds", 0) for m in own for st in (m.get("stages") or {}).values()
                  if isinstance(st, dict))  # the filter step counts the tokens of what it keeps: a tokenizer's cost
        tok += sum(m.get("tokenizer_seconds", 0) for m in own)  # paragraph dedup counts its cut texts again
        cpu[stage_of(name)] += steps[name] - tok
        cpu["token counts"] += tok
    return dict(cpu), steps


def one(kind: str, texts: list[str], scale: int, workers: int, per_file: int = PER_FILE) -> dict:
    from bench.reuse import cpu_run

    base = WORK / kind.replace(" ", "_") / str(len(texts))
    shutil.rmtree(base, ignore_errors=True)
    mb = write_corpus(texts, base / "in", "d", per_file)
    floor = io_floor(base / "in", base / "floor")
    y = mixture_yaml(base / "in", base / "out", CHEAP if kind.startswith("short") else FULL)
    cpu, wall = cpu_run(y, f"steps-{scale}", ["--workers", str(workers)])
    stages, steps = step_cpu(base / "out")
    executor = json.loads((base / "out" / "steps" / "run.json").read_text()).get("executor", "ray")
    shutil.rmtree(base, ignore_errors=True)
    return {"kind": kind, "docs": len(texts), "mb": mb, "scale": scale, "floor": floor, "stages": stages, "steps": steps, "executor": executor,
            "command_cpu": cpu, "wall": wall}


def table(rows: list[dict]) -> str:
    names = [s for s, _ in STAGES] + sorted({k for r in rows for k in r["stages"]} - {s for s, _ in STAGES})
    head = ["kind", "docs", "tasks ran in"] + names + ["I/O floor", "chain/filters", "with token counts", "chain/floor", "command CPU/chain"]
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * 3 + " ---: |" * (len(head) - 3)]
    for r in rows:
        d, tok = r["docs"], r["stages"].get("token counts", 0.0)
        chain = sum(r["stages"].values()) - tok
        us = lambda s: f"{1e6 * s / d:,.0f} ({s / r['mb'] * 1e6 / 1e6 * 1e3:,.0f})"  # noqa: E731  µs/doc (ms/MB)
        cells = [r["kind"], f"{d:,}", r.get("executor", "ray")] + [us(r["stages"].get(n, 0.0)) for n in names] + [us(r["floor"])]
        flt = max(r["stages"].get("filters", 0), 1e-9)
        cells += [f"{chain / flt:.2f}", f"{(chain + tok) / flt:.2f}", f"{chain / r['floor']:.1f}",
                  f"{r['command_cpu'] / (chain + tok):.2f}"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None) -> None:
    from bench import textkinds

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=8000)
    ap.add_argument("--per-file", type=int, default=PER_FILE)
    ap.add_argument("--scales", default="1,4")
    ap.add_argument("--kinds", default=",".join(textkinds.KINDS))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    rows = []
    scales = [int(s) for s in a.scales.split(",")]
    for kind in a.kinds.split(","):
        make = {"wiki pages": textkinds.wiki_pages, "technical docs": textkinds.technical_docs,
                "code": textkinds.code, "non-English prose": textkinds.non_english,
                "short texts and spam": textkinds.short_and_spam}[kind]
        for scale in scales:
            texts = make(a.docs * scale)
            rows.append(one(kind, texts, scale, a.workers, a.per_file))
            print(f"{kind} x{scale}: {len(texts):,} docs, chain {sum(rows[-1]['stages'].values()):.1f} task CPU-s, "
                  f"command {rows[-1]['command_cpu']:.1f} CPU-s", file=sys.stderr, flush=True)
    print("Task CPU per stage in µs per input document (ms per input MB). chain: every stage but the token counts "
          "(a tokenizer's cost, as a classifier's is the model's); chain/filters without them, then with them.\n")
    print(table(rows))
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
