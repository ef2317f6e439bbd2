"""A whole command against datatrove's chain on the same documents (issue 52): reader, the four
heuristic filters, writer, both with 2 worker processes, wall time and the CPU of every
process of the command.

    python -m bench.whole [--docs 8109,100000] [--kinds "wiki pages"] [--workers 2] [--skip-datatrove-above 20000]

Curate: `curate run --workers W` of a mixture with one source and the filters Gopher
repetition -> Gopher quality -> C4 -> FineWeb, the mixture written as Parquet (ingest,
token counts, filters, mixture, samples, report: more than datatrove's writer does).
datatrove: JsonlReader -> the same four filters -> JsonlWriter under LocalPipelineExecutor
with one task per input file and W workers. Both read the same JSONL.zst files of 1,000
documents and start from a cold process. Printed per size: both walls, their ratio, both
commands' CPU (a cgroup: Ray's processes included), Curate's task CPU, and Curate's wall
against the issue's bound 1.5 x task CPU / W + 1 s. datatrove's filters run at ~30
documents/s per core here: above `--skip-datatrove-above` documents it is not run (its
figure is then the smaller size's per-document rate, printed as such). Not a test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / ".cache" / "bench" / "whole"
CG = Path("/sys/fs/cgroup/cpuacct")
FILTERS = ["gopher_repetition", "gopher_quality", "c4_quality", "fineweb_quality"]


def timed(cmd: list[str], tag: str, env: dict | None = None) -> tuple[float, float, str]:
    """(wall, CPU of every process, stdout) of a command in its own cgroup (rusage of the
    waited-for children where no cgroup can be made)."""
    env = {k: v for k, v in (env or os.environ).items() if k != "RAY_ADDRESS"}
    cg = CG / f"curate-whole-{os.getpid()}-{tag}"
    use_cg = CG.is_dir() and os.geteuid() == 0
    if use_cg:
        cg.mkdir(exist_ok=True)
    import resource
    import shlex

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    pre = f"echo $$ > {cg}/cgroup.procs && exec " if use_cg else "exec "
    t0 = time.time()
    r = subprocess.run(["bash", "-c", pre + " ".join(map(shlex.quote, cmd))], env=env, capture_output=True, text=True, cwd=ROOT)
    wall = time.time() - t0
    if r.returncode:
        sys.exit(f"{cmd[:4]} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    if use_cg:
        time.sleep(0.5)
        cpu = int((cg / "cpuacct.usage").read_text()) / 1e9
        try:
            cg.rmdir()
        except OSError:
            pass
    else:
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu, r.stdout


def curate(corpus: Path, out: Path, workers: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    from bench.steps import mixture_yaml, step_cpu

    y = mixture_yaml(corpus, out, FILTERS, name="whole", dedup=False)
    wall, cpu, _ = timed([sys.executable, "-m", "pipeline", "run", str(y), "--workers", str(workers), "--quiet"], "curate")
    stages, _ = step_cpu(out, "whole")
    return {"wall": wall, "cpu": cpu, "task_cpu": sum(stages.values())}


def datatrove_child(corpus: str, work: str, workers: int) -> None:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.filters import C4QualityFilter, FineWebQualityFilter, GopherQualityFilter, GopherRepetitionFilter
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter

    tasks = len(list(Path(corpus).glob("*.jsonl.zst")))
    pipeline = [JsonlReader(corpus, glob_pattern="*.jsonl.zst"), GopherRepetitionFilter(), GopherQualityFilter(),
                C4QualityFilter(filter_no_terminal_punct=False), FineWebQualityFilter(),
                JsonlWriter(f"{work}/out", compression="zstd", output_filename="${rank}.jsonl.zst")]
    LocalPipelineExecutor(pipeline, tasks=tasks, workers=workers, logging_dir=f"{work}/logs").run()


def datatrove(corpus: Path, work: Path, workers: int) -> dict:
    shutil.rmtree(work, ignore_errors=True)
    wall, cpu, _ = timed([sys.executable, "-m", "bench.whole", "--datatrove-child", str(corpus), str(work), str(workers)], "dt")
    return {"wall": wall, "cpu": cpu}


def main(argv=None) -> None:
    from bench import steps, textkinds

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", default="8109,100000")
    ap.add_argument("--kinds", default="wiki pages")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--skip-datatrove-above", type=int, default=20000)
    ap.add_argument("--datatrove-child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.datatrove_child:
        datatrove_child(a.datatrove_child[0], a.datatrove_child[1], int(a.datatrove_child[2]))
        return
    make = {"wiki pages": textkinds.wiki_pages, "technical docs": textkinds.technical_docs, "code": textkinds.code,
            "non-English prose": textkinds.non_english, "short texts and spam": textkinds.short_and_spam}
    print("| kind | docs | datatrove wall s (CPU s) | Curate wall s (CPU s) | wall ratio | Curate task CPU s | "
          "bound 1.5 x task CPU / W + 1 s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for kind in a.kinds.split(","):
        rate = None  # datatrove's seconds per document at the largest size it ran
        for n in (int(x) for x in a.docs.split(",")):
            base = WORK / kind.replace(" ", "_") / str(n)
            shutil.rmtree(base, ignore_errors=True)
            steps.write_corpus(make[kind](n), base / "in", "d")
            cu = curate(base / "in", base / "curate", a.workers)
            if n <= a.skip_datatrove_above:
                dt = datatrove(base / "in", base / "dt", a.workers)
                rate = dt["wall"] / n
                dts = f"{dt['wall']:.1f} ({dt['cpu']:.1f})"
                ratio = dt["wall"] / cu["wall"]
            else:
                dts = f"~{rate * n:.0f} (its rate at the smaller size)" if rate else "not run"
                ratio = rate * n / cu["wall"] if rate else float("nan")
            bound = 1.5 * cu["task_cpu"] / a.workers + 1
            print(f"| {kind} | {n:,} | {dts} | {cu['wall']:.1f} ({cu['cpu']:.1f}) | **{ratio:.1f}x** | {cu['task_cpu']:.1f} | "
                  f"{bound:.1f} ({'met' if cu['wall'] <= bound else 'not met'}) |", flush=True)
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
