"""What a stage is: a name, its plan, the kinds of task its steps run with what each asks of
a node, and optionally what it publishes into the run directory and what it tells the dry
run. Each stage module declares one `STAGE`; pipeline/run/graph.py lists them in order
(docs/extending.md).

What the rest of the run needs of a stage is derived from this record, never listed
elsewhere: the memory its tasks declare to Ray (plan/memory.py, from `tasks`), the stage
progress and `curate plan` show its steps under (`label`), its section of the report and its
values in `curate explain` (`report`, `explain`).

The callables take the planning context (plan/context.py); this module does not import it,
so a worker that imports a stage's task module does not load the config models.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TaskKind:
    """A kind of task a stage's steps run (`Step.kind`) and what each task asks of its node.

    A task that carries documents holds about one document shard of text a few times over:
    it declares a worker's base plus `text_copies` x the largest shard's text (the sources'
    `max_shard_bytes`; plan/memory.py). A kind a stage does not declare, or declares with
    `text_copies=None`, carries ids, keys and hashes and declares no memory."""

    kind: str
    text_copies: int | None = None
    gpus: float = 0  # GPUs a task takes (passed to Ray as num_gpus; no built-in stage uses one yet)


def texts(*kinds: str, copies: int = 6) -> tuple[TaskKind, ...]:
    """TaskKinds for `kinds`, each carrying a shard of text `copies` times (measured on the
    demo: 240-740 MB per task, markers' `peak_rss_mb`)."""
    return tuple(TaskKind(k, text_copies=copies) for k in kinds)


@dataclass(frozen=True)
class Stage:
    name: str  # ingest, filter, dedup ...: what `ctx.stage_of` and the dry run call it
    plan: Callable[[Any], list]  # (ctx) -> its steps, reading only the planning context
    publish: Callable[[Any, dict], dict] | None = None  # (ctx, stats) -> its keys of manifest.json
    expected: Callable[[Any], list[str]] | None = None  # (ctx) -> lines for `curate plan`
    # the run directory's folders its publish writes (each whole, by atomic.link_tree): one a run of
    # this mixture does not write (its section removed) is removed, never left from an earlier run
    outputs: tuple[str, ...] = ()
    tasks: tuple[TaskKind, ...] = ()  # the kinds of task its steps run that ask more than one CPU's default
    label: str = ""  # the stage its steps show under in progress and `curate plan` (default: `name`)
    # a stage from outside Curate (a module the YAML's `plugins:` names): the pydantic model of its
    # settings under `stages.<name>` (None: it has none), and the stage it is planned after
    config: type | None = None
    after: str = "classify"
    # what the views show of it, from what its steps wrote (the views call these; none reads a config):
    # `report`: (views' decisions.Run, source) -> its figures for the source (report.json's
    # sources.<source>.stages.<name>, a table in report.html), or None; `explain`: (its layer's row for
    # one document) -> the values `curate explain` prints beside the stage (a class, a score)
    report: Callable[[Any, str], dict | None] | None = None
    explain: Callable[[dict], dict] | None = None

    @property
    def shown_as(self) -> str:
        return self.label or self.name

    def task(self, kind: str) -> TaskKind | None:
        return next((t for t in self.tasks if t.kind == kind), None)
