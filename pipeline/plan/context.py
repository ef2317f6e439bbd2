"""The planning context: the one typed thing a stage's `plan(ctx)` reads.

A run's graph is a list of stages (pipeline/run/graph.py) and a loop: each stage's
`plan(ctx)` returns its steps and records, in the typed fields below, what later stages
need of it (its ingest step per source, the attribute layers it adds, its topic labels,
the mix steps). A stage never reads another stage's module, only this context, so a new
stage is its own module plus one line of the stage list.

Document shards: one ingest shard of one source with its layers (the attribute files of
its filters, the global layers so far, its source's steps after dedup). Every step that
works per document shard lists them in the same global order (`doc_shards`), so shard
index k is the same (source, shard) in every step; dedup's decisions come back to a
document shard's `slot` (slot_offsets), which a file added to one source does not move for
the others.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.config import LoadedMixture, Mixture
from pipeline.config.engine import EngineSpec
from pipeline.engine.step import Step, shard_name
from pipeline.errors import UsageError
from pipeline.io import fs
from pipeline.io.discover import InputFile
from pipeline.plan import memory
from pipeline.plan.stage import Stage
from pipeline.shards.apply import attribute_path
from pipeline.shards.documents import DocShard


@dataclass
class MixSteps:
    """The mix stage's steps, which the ledger and the later stages read."""

    priority: Step
    select: Step
    route: Step
    write: Step
    phases: list[dict]  # each phase's name, cells, weights or rates, target and seed (mix stage)
    docs: Callable[[dict], Iterator[dict]]  # stats -> the mixed sources' document shards, with every layer it reads
    budget: Step | None = None  # mix-budget: each source's cells, with their epochs, as cells/<source>.json

    def cells_file(self, store, source: str) -> str:
        """Where a source's cells are (mix-budget's cells/<source>.json): what a per-shard spec names, not the cells."""
        return str(self.budget.dir(store) / "cells" / f"{source}.json")


@dataclass
class Context:
    lm: LoadedMixture
    run_dir: Path  # the run directory: mixture/, samples/, ledger ...
    store: Path  # the step store: where every step's directory is
    files: dict[str, list[InputFile]]  # per source, its input files
    tokenizer: str | None  # what tasks count tokens with (plan/tokens.py)
    tokenizer_id: str | None  # what identifies the counts in step hashes
    stages: list[Stage] = field(default_factory=list)  # the stages being planned, in order (run/graph.py)
    engine: EngineSpec | None = None  # the `engine:` settings with their environment overrides, read once (post_init)
    engine_env: dict[str, str] = field(default_factory=dict)  # setting -> "VAR=value" of those the environment set
    steps: list[Step] = field(default_factory=list)  # every step planned so far, in order
    stage_of: dict[str, str] = field(default_factory=dict)  # step name -> the stage that planned it
    # ingest stage
    ingest: dict[str, Step] = field(default_factory=dict)  # source -> ingest-<source>
    extracts: dict[str, bool] = field(default_factory=dict)  # source -> whether its records are web pages to extract
    # filter stage
    filter: dict[str, Step] = field(default_factory=dict)  # source -> filter-<source> (sources with a chain)
    chains: dict[str, list[str]] = field(default_factory=dict)  # source -> its filter step's stages, in order
    # global attribute layers, in order (dedup kinds, decontaminate, validation): one file per document
    # shard; `add_layer` appends one with its ledger stage (layer_stage)
    layers: list[Step] = field(default_factory=list)
    layer_stage: dict[str, str] = field(default_factory=dict)  # layer step name -> its ledger stage
    # per-source layers after dedup (a classifier's quality or topic, any stage's), in the order they
    # were added: (source, ledger stage, step); `add_source_layer`. And the topic labels cells name
    source_layers: list[tuple[str, str, Step]] = field(default_factory=list)
    topic_labels: dict[str, list[str]] = field(default_factory=dict)
    # mix stage
    mix: MixSteps | None = None
    fate: list[Step] = field(default_factory=list)  # what a document's fate depends on: every step up to the selection
    # what a stage's steps provide to later stages, by what it is, never by the stage (`provide`):
    # ("embeddings", source) -> embed-<source>, ("token_ids", source) -> tokenize-<source>, ...
    provided: dict[tuple[str, str | None], Step] = field(default_factory=dict)
    declared: dict[tuple[str, str | None], str] = field(default_factory=dict)  # (role, source) -> step name (declare)
    # per source, the mixture axes its stages declare beyond `lang` (weight keys `source/<axis>=<value>`): the
    # layer that gives one has a column named after it (declare_axis)
    axes: dict[str, set[str]] = field(default_factory=dict)

    def __post_init__(self):
        if self.engine is None:
            self.engine, self.engine_env = self.lm.engine()

    @property
    def mixture(self) -> Mixture:
        return self.lm.mixture

    def add(self, stage: str, steps: list[Step]) -> None:
        """The loop's part: record a stage's steps (names must be unique in a run), each with
        what its stage declares of its kind of task (memory, GPUs) and the stage it shows under."""
        record = next((st for st in self.stages if st.name == stage), None)
        for s in steps:
            if s.name in self.stage_of:
                raise UsageError(f"{self.lm.path}: two steps would be named {s.name} (stages {self.stage_of[s.name]} and "
                                 f"{stage}): a source or classifier name makes another's step name; rename one of them")
            self.stage_of[s.name] = stage
            s.stage = record.shown_as if record is not None else stage
            kind = record.task(s.kind) if record is not None else None
            if s.memory_mb is None:
                s.memory_mb = memory.estimate_mb(kind, self.mixture)
            if kind is not None and kind.gpus and not s.gpus:
                s.gpus = kind.gpus
            self.steps.append(s)

    def declare(self, role: str, step: Step, source: str | None = None) -> Step:
        """A step's role beyond the typed fields (a source's `id_index`, `quality_threshold`;
        the run's `selection`, `decontaminate_index`), for what reads a finished run."""
        self.declared[(role, source)] = step.name
        return step

    def provide(self, what: str, step: Step, source: str | None = None) -> Step:
        """`step` provides `what` (of `source`) to the stages planned after it: embeddings, token
        ids ... A later stage asks for it by what it is (`provider`), not by the stage that made it."""
        self.provided[(what, source)] = step
        return step

    def provider(self, what: str, source: str | None = None) -> Step | None:
        """The step that provides `what` (of `source`), or None."""
        return self.provided.get((what, source))

    def providers(self, what: str) -> dict[str | None, Step]:
        """Per source, in the order provided, the step that provides `what`."""
        return {src: st for (w, src), st in self.provided.items() if w == what}

    def declare_axis(self, axis: str, source: str) -> None:
        """A mixture axis of `source`: a layer this stage adds (ctx.add_layer, or a source's
        quality/topic step) has a column named `axis`, one value a document; the mixture
        may then weight `source/<axis>=<value>` (pipeline/mixing/cells.py)."""
        self.axes.setdefault(source, set()).add(axis)

    def roles(self) -> dict:
        """run.json's `roles`: per source and for the run, role -> step name, as the stages
        declared them (`declare`). explain, the report, diff and the samples find a finished
        run's steps by role, never by a step name of their own (pipeline/shards/decisions.py
        `role_of`)."""
        out: dict = {"sources": {s: {} for s in self.mixture.sources}, "run": {}}
        for (role, source), name in self.declared.items():
            (out["sources"].setdefault(source, {}) if source else out["run"])[role] = name
        return out

    def add_layer(self, step: Step, stage: str) -> None:
        """A global attribute layer (a file per document shard, same rows as the documents,
        `id, keep, reason`; markers per document shard with `source`, `docs_out`,
        `tokens_out`) and the ledger stage it removes documents under."""
        self.layers.append(step)
        self.layer_stage[step.name] = stage

    def add_source_layer(self, source: str, stage: str, step: Step, role: str | None = None) -> None:
        """A per-source attribute layer after dedup (a file per document shard of `source`,
        `<step>/<source>/part-...`, same rows as the documents), the ledger stage it removes
        documents under, and the role run.json gives it (`declare`)."""
        self.source_layers.append((source, stage, step))
        if role is not None:
            self.declare(role, step, source)

    def base(self) -> list[Step]:
        """Per source (YAML order), the step its document shards come from: its filter step, else its ingest."""
        return [self.filter.get(s) or self.ingest[s] for s in self.mixture.sources]

    def after(self) -> dict[str, list[Step]]:
        """Per source, its layers after dedup (quality, then topic, then any other), in the order added."""
        return {s: [st for src, _, st in self.source_layers if src == s] for s in self.mixture.sources}

    def layer_stages(self) -> dict[str, list[list[str]]]:
        """Per source, its attribute layers in the order they decide: [ledger stage, step
        name], its filter step first (one file per ingest shard, `<step>/part-XXXXX.parquet`),
        then the global layers and its quality and topic steps (`<step>/<source>/part-...`).
        run.json records it, so whatever reads a finished run (explain, the samples, diff)
        follows the layers the run had without a list of step names of its own."""
        out = {}
        for s in self.mixture.sources:
            rows = [["filter", self.filter[s].name]] if s in self.filter else []
            rows += [[self.layer_stage[st.name], st.name] for st in self.layers]
            rows += [[stage, st.name] for src, stage, st in self.source_layers if src == s]
            out[s] = rows
        return out

    def ranks(self) -> dict[str, int]:
        """Source priority for survivors: eval and reference sources before every train source
        (a train copy of an eval item goes, never the item), then `dedup.priority`, then YAML order."""
        m = self.mixture
        prio = list((m.dedup.priority if m.dedup else None) or [])
        order = prio + [s for s in m.sources if s not in prio]
        order = [s for s in order if m.sources[s].role != "train"] + [s for s in order if m.sources[s].role == "train"]
        return {s: i for i, s in enumerate(order)}

    def doc_shards(self, stats: dict, layers: list[Step], after: dict[str, list[Step]] | None = None
                   ) -> Iterator[DocShard]:
        """Every document shard, with the attribute files of its filters, of the global `layers`
        and of its source's steps in `after` (per-source steps after dedup: quality, topic).
        A generator: a plan that yields its specs from it holds one shard's dict at a time,
        not a list of every shard (the executor spills specs as they come: engine/markers.py)."""
        m = self.mixture
        rk = self.ranks()
        slots, _ = self.slot_offsets(stats)
        k = 0
        for si, sname in enumerate(m.sources):
            ing = self.ingest[sname]
            flt = self.filter.get(sname)
            lasts = (after or {}).get(sname) or []
            # folders once per source, names joined as strings: pathlib per shard was most of a plan's CPU
            ing_dir = str(ing.dir(self.store))
            flt_dir = str(flt.dir(self.store)) if flt else None
            layer_dirs = [(st, str(attribute_path(st.dir(self.store), sname, 0).parent)) for st in layers]
            last_dirs = [(st, str(attribute_path(st.dir(self.store), sname, 0).parent)) for st in lasts]
            for j, i in enumerate(sorted(stats[ing.name])):
                name = f"{shard_name(i)}.parquet"
                mk = stats[ing.name][i]
                paths, kept, tokens = [], mk["docs_out"], mk["tokens"]
                if flt:
                    paths.append(f"{flt_dir}/{name}")
                    mk = stats[flt.name][i]
                    kept = mk["docs_out"]
                    tokens = mk["stages"][list(mk["stages"])[-1]]["tokens_out"] if mk["stages"] else tokens
                for st, d in layer_dirs:
                    paths.append(f"{d}/{name}")
                    mk = stats[st.name][k]
                    kept, tokens = mk["docs_out"], mk["tokens_out"]
                shard: DocShard = {"source": sname, "src": si, "rank": rk[sname], "part": i, "index": j, "k": k,
                                   "slot": slots[si] + i, "documents": f"{ing_dir}/{name}", "layers": paths,
                                   "kept": kept, "tokens": tokens}
                for last, d in last_dirs:
                    paths.append(f"{d}/{name}")
                    mk = stats[last.name][j]
                    shard["kept"], shard["tokens"] = mk["docs_out"], mk["tokens_out"]
                    if "bucket_docs" in mk:  # kept documents and tokens per quality bucket
                        shard["bucket_docs"], shard["bucket_tokens"] = mk["bucket_docs"], mk["bucket_tokens"]
                    if "groups" in mk:  # ... per (topic, bucket)
                        shard["groups"] = mk["groups"]
                yield shard
                k += 1

    def all_doc_shards(self) -> Callable[[dict], Iterator[DocShard]]:
        """stats -> every document shard with every layer planned so far (filters, the
        global layers, quality and topic): the layers are taken now, when a stage plans, so
        a layer a later stage adds never changes this stage's shards behind its hash."""
        layers, after = list(self.layers), self.after()
        return lambda stats: self.doc_shards(stats, layers, after)

    def shard_offsets(self, stats: dict) -> tuple[list[int], int]:
        """Per source (YAML order), the global number of its first document shard; and the
        number of document shards. Decisions are shuffled back to shard k = offset + shard."""
        offsets, total = [], 0
        for sname in self.mixture.sources:
            offsets.append(total)
            total += len(stats[self.ingest[sname].name])
        return offsets, total

    def slot_offsets(self, stats: dict) -> tuple[list[int], int]:
        """Per source (YAML order), the first decision slot of its document shards, and the
        number of slots: decisions come back to document shard `slot = offset + shard`
        (shuffle.write_to_shards). Each source's block is its shard count rounded up to a power
        of two, so a source that grows by a file leaves the later sources' slots, and so the
        content keys of their shards (engine/reuse.py), as they were until it doubles."""
        offsets, total = [], 0
        for sname in self.mixture.sources:
            offsets.append(total)
            n = len(stats[self.ingest[sname].name])
            total += 1 << (n - 1).bit_length() if n else 0
        return offsets, total

    def source_spans(self, stats: dict, sources) -> dict[str, tuple[int, int]]:
        """[first, stop) of each of `sources`' document shards in the numbering of a step over
        theirs alone (doc_shards' order, the other sources left out): from the shard counts,
        no marker read."""
        out, at = {}, 0
        for sname in self.mixture.sources:
            if sname in sources:
                n = len(stats[self.ingest[sname].name])
                out[sname] = (at, at + n)
                at += n
        return out

    def step_ref(self, step: Step) -> str:
        """How the run directory names a store step: `steps/<name>-<hash>` where the run
        directory links its store steps (local disks), else the store step's path or URL."""
        d = step.dir(self.store)
        return f"steps/{d.name}" if fs.is_local(self.run_dir) and fs.is_local(d) else str(d)

    def step(self, name: str) -> Step | None:
        return next((s for s in self.steps if s.name == name), None)

    def step_of(self, role: str, source: str | None = None) -> Step | None:
        """The step an earlier stage declared in `role` (declare), None when none did."""
        name = self.declared.get((role, source))
        return self.step(name) if name is not None else None
