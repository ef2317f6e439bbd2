"""What a stage is: a name, its plan, and optionally what it publishes into the run
directory and what it tells the dry run. Each stage module declares one `STAGE`;
pipeline/run/graph.py lists them in order (docs/extending.md).

The callables take the planning context (plan/context.py); this module does not import it,
so a worker that imports a stage's task module does not load the config models.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Stage:
    name: str  # ingest, filter, dedup ...: what `ctx.stage_of` and the dry run call it
    plan: Callable[[Any], list]  # (ctx) -> its steps, reading only the planning context
    publish: Callable[[Any, dict], dict] | None = None  # (ctx, stats) -> its keys of manifest.json
    expected: Callable[[Any], list[str]] | None = None  # (ctx) -> lines for `curate plan`
    # the run directory's folders its publish writes (each whole, by atomic.link_tree): one a run of
    # this mixture does not write (its section removed) is removed, never left from an earlier run
    outputs: tuple[str, ...] = ()
