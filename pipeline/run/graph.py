"""The run's graph: the stage list and the loop that plans it.

A stage is a module under pipeline/steps/ that declares its `STAGE` (plan/stage.py):

    plan(ctx: Context) -> list[Step]     its steps, reading only the planning context
                                         (and recording there what later stages need)
    publish(ctx, stats) -> dict          optional: what it puts in the run directory
                                         (links into its steps), and manifest.json keys
    expected(ctx) -> list[str]           optional: lines for the dry run
    outputs                              the run directory's folders its publish writes: one
                                         this run does not write is removed (a section dropped)

Its task bodies are module-level functions beside it, each versioned where it is
written (`@task(version=...)`, engine/step.py). The order of STAGES is the order of
planning and of publication: a stage may read what the stages before it recorded.
Adding a stage is its module and one line here (docs/extending.md).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.config import LoadedMixture
from pipeline.errors import UsageError
from pipeline.io import atomic, fs
from pipeline.plan import sources
from pipeline.plan.context import Context
from pipeline.plan.stage import Stage
from pipeline.plan.tokens import identity
from pipeline.steps import decontam, embed, validation
from pipeline.steps import filter as filter_stage
from pipeline.steps.classify import plan as classify
from pipeline.steps.dedup import plan as dedup
from pipeline.steps.ingest import plan as ingest
from pipeline.steps.mix import plan as mix
from pipeline.steps.samples import plan as samples
from pipeline.steps.tokenize import plan as tokenize
from pipeline.steps.tokenize import write as tokens

STAGES: list[Stage] = [
    ingest.STAGE,        # inputs -> document shards, quarantine/
    filter_stage.STAGE,  # each source's filter chain -> keep/stage/reason attributes
    embed.STAGE,         # embed-<source>: documents' embeddings (nothing without dedup.semantic)
    dedup.STAGE,         # exact, fuzzy, paragraph, semantic -> global layers
    decontam.STAGE,      # eval items -> a global layer
    validation.STAGE,    # held-out documents -> a global layer, validation/
    classify.STAGE,      # quality and topic classifiers -> per-source steps after dedup
    tokenize.STAGE,      # tokenize: each kept document's token ids, once (nothing without `tokenize:`)
    mix.STAGE,           # weights, epochs, phases -> mixture/, manifest.json
    tokens.STAGE,        # tokenize: the mixture as token files -> tokenized/<format>/
    samples.STAGE,       # kept and removed samples -> samples/
]


def build(lm: LoadedMixture, run_dir: Path, store: Path | None = None, stages: list[Stage] | None = None) -> Context:
    """Plan every stage, in order, into one context: `ctx.steps` is the run's graph. No Ray,
    no task: what planning reads is the YAML, the inputs' fingerprints and the files the
    steps hash (filter word lists, classifier models, eval sets). `stages`: another list
    than STAGES (a stage being written: tests/pipeline/run/test_stages.py)."""
    files, tokenizer = sources.check(lm)
    ctx = Context(lm, run_dir, store if store is not None else run_dir, files, tokenizer, identity(tokenizer),
                  stages=with_plugins(list(STAGES if stages is None else stages), lm))
    for stage in ctx.stages:
        ctx.add(stage.name, stage.plan(ctx))
    return ctx


def run_stages(run_dir) -> list[Stage]:
    """The stages of a finished run: Curate's, and those its mixture's `plugins:` (run.json's
    config) or an installed package's entry point add, for the views' hooks (report, explain)."""
    from pipeline.config.load import plugin_stages

    names = {s.name for s in STAGES}
    cfg = atomic.read_json(fs.path(run_dir) / "run.json").get("config") or {}
    return list(STAGES) + [s for s in plugin_stages(cfg.get("plugins") or []) if s.name not in names]


def with_plugins(stages: list[Stage], lm: LoadedMixture) -> list[Stage]:
    """`stages` with each stage the YAML's `plugins:` declares, after the stage it names (`after`)."""
    for p in lm.plugin_stages:
        names = [s.name for s in stages]
        if p.name in names:
            raise UsageError(f"{lm.path}: plugins: stage {p.name!r} is already a stage of the run; rename it")
        if p.after not in names:
            raise UsageError(f"{lm.path}: plugins: stage {p.name!r} is planned after {p.after!r}, which is not a stage "
                             f"(stages: {', '.join(names)})")
        stages.insert(names.index(p.after) + 1, p)
    return stages


def publish(ctx: Context, stats: dict) -> dict:
    """Each stage's publication into the run directory, in stage order; returns the
    manifest, whose keys each stage owns (two stages may not write the same key)."""
    from pipeline.steps.rounds import fan_out

    manifest: dict = {}
    with atomic.linked_trees() as written, atomic.copying(fan_out):  # an object store's copies in tasks
        for stage in ctx.stages:
            if stage.publish is not None:
                keys = stage.publish(ctx, stats)
                if clash := set(keys) & set(manifest):
                    raise ValueError(f"stage {stage.name} publishes manifest keys another stage wrote: {sorted(clash)}")
                manifest.update(keys)
    for folder in (f for stage in ctx.stages for f in stage.outputs):  # a section removed: its folder with it
        if str(ctx.run_dir / folder) not in written:
            fs.rmtree(ctx.run_dir / folder)
    return manifest


def expected(ctx: Context) -> list[str]:
    """What the stages expect of the current outputs, for the dry run."""
    return [line for stage in ctx.stages if stage.expected is not None for line in stage.expected(ctx)]
