"""The run's graph: the stage list and the loop that plans it.

A stage is a module under pipeline/steps/ with

    plan(ctx: Context) -> list[Step]     its steps, reading only the planning context
                                         (and recording there what later stages need)
    publish(ctx, stats) -> dict          optional: what it puts in the run directory
                                         (links into its steps), and manifest.json keys
    expected(ctx) -> list[str]           optional: lines for the dry run

Its task bodies are module-level functions beside it, each versioned where it is
written (`@task(version=...)`, engine/step.py). The order of STAGES is the order of
planning and of publication: a stage may read what the stages before it recorded.
Adding a stage is its module and one line here (docs/extending.md).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from pipeline.config import LoadedMixture
from pipeline.plan import sources
from pipeline.plan.context import Context
from pipeline.plan.tokens import identity
from pipeline.steps import decontam, validation
from pipeline.steps import filter as filter_stage
from pipeline.steps.classify import plan as classify
from pipeline.steps.dedup import plan as dedup
from pipeline.steps.ingest import plan as ingest
from pipeline.steps.mix import plan as mix
from pipeline.steps.samples import plan as samples

STAGES: list[ModuleType] = [
    ingest,      # inputs -> document shards, quarantine/
    filter_stage,  # each source's filter chain -> keep/stage/reason attributes
    dedup,       # exact, fuzzy, paragraph -> global layers
    decontam,    # eval items -> a global layer
    validation,  # held-out documents -> a global layer, validation/
    classify,    # quality and topic classifiers -> per-source steps after dedup
    mix,         # weights, epochs, phases -> mixture/, manifest.json
    samples,     # kept and removed samples -> samples/
]


def stage_name(stage: ModuleType) -> str:
    """`ingest`, `mix` ...: the module's name, or its package's for a package's plan module."""
    parts = stage.__name__.split(".")
    return parts[-2] if parts[-1] == "plan" else parts[-1]


def build(lm: LoadedMixture, run_dir: Path, store: Path | None = None, stages: list[ModuleType] | None = None) -> Context:
    """Plan every stage, in order, into one context: `ctx.steps` is the run's graph. No Ray,
    no task: what planning reads is the YAML, the inputs' fingerprints and the files the
    steps hash (filter word lists, classifier models, eval sets)."""
    files, tokenizer = sources.check(lm)
    ctx = Context(lm, run_dir, store if store is not None else run_dir, files, tokenizer, identity(tokenizer))
    for stage in STAGES if stages is None else stages:
        ctx.add(stage_name(stage), stage.plan(ctx))
    return ctx


def publish(ctx: Context, stats: dict, stages: list[ModuleType] | None = None) -> dict:
    """Each stage's publication into the run directory; returns the manifest's keys."""
    manifest: dict = {}
    for stage in STAGES if stages is None else stages:
        if hasattr(stage, "publish"):
            manifest.update(stage.publish(ctx, stats))
    return manifest


def expected(ctx: Context, stages: list[ModuleType] | None = None) -> list[str]:
    """What the stages expect of the current outputs, for the dry run."""
    lines: list[str] = []
    for stage in STAGES if stages is None else stages:
        if hasattr(stage, "expected"):
            lines += stage.expected(ctx)
    return lines
