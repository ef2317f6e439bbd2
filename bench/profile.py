"""Where a whole `curate run` spends its CPU: py-spy over the driver and every Ray worker.

    pip install py-spy        # a profiler, not a dependency of Curate
    python -m bench.profile [--docs 50000] [--workers 2] [--top 25]

Runs the end-to-end bench mixture (bench/e2e.py) on the cached corpus of that size under
`py-spy record --subprocesses` (sampling, 50 Hz, native frames off) and prints the CPU
samples by Curate step (the `run_shard`-style entry each worker stack passes through), by
library (our code, pyarrow, numpy, tokenizers, fastText, spaCy, datatrove, Ray itself) and
the functions with the most self time. Not a test.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.e2e import ROOT, build_corpus, curate_yaml

STEP_FNS = {  # entry function in a worker's stack -> what the step does
    "pipeline/steps/ingest/documents.py:run_shard": "ingest", "pipeline/steps/ingest/ids.py:map_shard": "ids",
    "pipeline/steps/ingest/ids.py:reduce_shard": "ids", "pipeline/steps/ingest/splits.py:scan_shard": "ingest",
    "pipeline/steps/filter.py:run_shard": "filters", "pipeline/steps/dedup/exact.py": "exact dedup",
    "pipeline/steps/dedup/fuzzy.py": "fuzzy dedup", "pipeline/steps/dedup/components.py": "fuzzy dedup",
    "pipeline/shards/apply.py": "dedup apply", "pipeline/steps/classify/tasks.py": "quality",
    "pipeline/steps/classify/quality.py": "quality",
    "pipeline/steps/mix/tasks.py": "mixture", "pipeline/steps/samples/tasks.py": "samples",
}
LIBS = [("pyarrow", "pyarrow"), ("numpy", "numpy"), ("tokenizers", "tokenizers"), ("tiktoken", "tiktoken"),
        ("fasttext", "fastText"), ("spacy", "spaCy"), ("datatrove", "datatrove"), ("ray", "Ray"),
        ("/filters/", "Curate filters"), ("/pipeline/", "Curate pipeline"), ("orjson", "orjson"), ("xxhash", "xxhash"),
        ("zstandard", "zstandard"), ("re.py", "re"), ("threading.py", "threads (waiting)")]


def _frame(f: str) -> tuple[str, str]:
    m = re.match(r"(.*) \((.*?)(?::\d+)?\)$", f)
    return (m.group(1), m.group(2)) if m else (f, "")


def summarize(raw: Path, top: int) -> str:
    by_step, by_lib, self_time = collections.Counter(), collections.Counter(), collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        n = int(n)
        frames = stack.split(";")
        total += n
        step = "driver / other"
        for f in frames:
            fn, path = _frame(f)
            key = next((v for k, v in STEP_FNS.items() if k in f"{path}:{fn}" or (":" not in k and k in path)), None)
            if key:
                step = key
                break
        by_step[step] += n
        fn, path = _frame(frames[-1])
        lib = next((v for k, v in LIBS if k in path), "other")
        by_lib[lib] += n
        self_time[f"{fn} ({path.split('site-packages/')[-1].replace(str(ROOT) + '/', '')})"] += n

    def table(title, c, k):
        rows = [f"{title} ({total:,} samples)"]
        rows += [f"  {v / total:6.1%}  {name}" for name, v in c.most_common(k)]
        return "\n".join(rows)

    return "\n\n".join([table("by step", by_step, 20), table("by library (self time)", by_lib, 20),
                        table("functions with the most self time", self_time, top)])


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=50_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--raw", help="keep py-spy's collapsed stacks in this file")
    args = ap.parse_args(argv)
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        raise SystemExit("py-spy is not installed: pip install py-spy")
    corpus = build_corpus(args.docs)
    with tempfile.TemporaryDirectory() as tmp:
        y = curate_yaml(corpus, Path(tmp))
        raw = Path(args.raw or Path(tmp) / "stacks.txt")
        t0 = time.perf_counter()
        r = subprocess.run([spy, "record", "--subprocesses", "--rate", "50", "--format", "raw", "-o", str(raw), "--",
                            sys.executable, "-m", "pipeline", "run", str(y), "--workers", str(args.workers), "--output", tmp,
                            "--quiet"], capture_output=True, text=True, cwd=ROOT)
        if r.returncode:
            raise SystemExit(r.stderr[-4000:])
        print(f"{args.docs:,} pages, {args.workers} workers, {time.perf_counter() - t0:.0f} s under py-spy\n")
        print(summarize(raw, args.top))


if __name__ == "__main__":
    main()
