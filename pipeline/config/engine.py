"""The `engine:` section: the tunables that change how a run's steps are laid out (how
many shuffle files a merge task joins, how many a reader reads, when a merge splits by
partition ranges, how many rows of one LSH bucket a reducer holds), never what the
mixture holds: every setting gives the same mixture bytes.

    engine:
      shuffle_group: 32          # writers a merge task joins at least
      shuffle_fanin: 64          # merged files a reader reads at most (past that, groups grow)
      merge_bytes: 2147483648    # a merge task copies at most about this much
      fuzzy_salt_rows: 2000000   # rows of one LSH bucket a fuzzy-dedup reducer holds
      fuzzy_local_edges: 2000000 # near-duplicate edges labelled in one process, not in rounds
      select_group: 1024         # key files one task reads when a selection fans out

They are read on the driver when the run is planned, never from a worker's environment:
the planned steps carry them. Each has an environment variable (`CURATE_SHUFFLE_GROUP`, ...)
that overrides the YAML, as benches and tests use them to show at tens of shards the regime
of tens of thousands; an override lands here, so run.json records it (`engine`,
`engine_from_env`) and `curate plan` shows it and names it as the reason a step runs again.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field

from pipeline.errors import UsageError

DEFAULTS = {"shuffle_group": 32, "shuffle_fanin": 64, "merge_bytes": 2 << 30, "fuzzy_salt_rows": 2_000_000,
            "fuzzy_local_edges": 2_000_000, "select_group": 1024}
ENV = {"shuffle_group": "CURATE_SHUFFLE_GROUP", "shuffle_fanin": "CURATE_SHUFFLE_FANIN",
       "merge_bytes": "CURATE_MERGE_BYTES", "fuzzy_salt_rows": "CURATE_FUZZY_SALT_ROWS",
       "fuzzy_local_edges": "CURATE_FUZZY_LOCAL_EDGES", "select_group": "CURATE_SELECT_GROUP"}
LEAST = {"shuffle_group": 2, "shuffle_fanin": 2, "merge_bytes": 1, "fuzzy_salt_rows": 2, "fuzzy_local_edges": 0,
         "select_group": 2}
WHAT = {"shuffle_group": "the number of shuffle files a merge task joins at least",
        "shuffle_fanin": "the number of merged files a shuffle's reader reads at most",
        "merge_bytes": "the bytes a merge task copies at most",
        "fuzzy_salt_rows": "the rows of one LSH bucket a reducer holds",
        "fuzzy_local_edges": "the near-duplicate edges the clusters step labels in one process (0: always rounds)",
        "select_group": "the key files one task of a selection's tree reads"}


class EngineSpec(BaseModel):
    """How steps are laid out; every value gives the same mixture bytes."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    shuffle_group: int = Field(DEFAULTS["shuffle_group"], ge=2, description=(
        "shuffle files a merge task joins at least; fewer writers than this are read unmerged "
        "(env CURATE_SHUFFLE_GROUP overrides)"))
    shuffle_fanin: int = Field(DEFAULTS["shuffle_fanin"], ge=2, description=(
        "merged files a shuffle's reader reads at most: past group x fanin writers the groups grow "
        "(env CURATE_SHUFFLE_FANIN overrides)"))
    merge_bytes: int = Field(DEFAULTS["merge_bytes"], ge=1, description=(
        "bytes a merge task copies at most: a larger group is merged by partition ranges "
        "(env CURATE_MERGE_BYTES overrides)"))
    fuzzy_salt_rows: int = Field(DEFAULTS["fuzzy_salt_rows"], ge=2, description=(
        "rows of one LSH bucket a fuzzy-dedup reducer holds; larger buckets are cut into blocks "
        "(env CURATE_FUZZY_SALT_ROWS overrides)"))
    fuzzy_local_edges: int = Field(DEFAULTS["fuzzy_local_edges"], ge=0, description=(
        "verified near-duplicate edges (both directions) that fuzzy dedup's clusters step labels in its own "
        "process (~100 bytes an edge); more run as rounds of tasks over partitions, 0: always "
        "(env CURATE_FUZZY_LOCAL_EDGES overrides)"))
    select_group: int = Field(DEFAULTS["select_group"], ge=2, description=(
        "key files (one a document shard) that a quality threshold or the mixture's selection reads "
        "itself; past that, tasks of this many files each read them and it adds up their results "
        "(env CURATE_SELECT_GROUP overrides)"))


def with_env(spec: EngineSpec, environ=None) -> tuple[EngineSpec, dict[str, str]]:
    """(the settings with the environment's overrides, {key: "VAR=value"} of those that
    came from it); a bad value is a UsageError naming the variable."""
    environ = os.environ if environ is None else environ
    update, came = {}, {}
    for key, var in ENV.items():
        v = environ.get(var, "").strip()
        if not v:
            continue
        if not v.isdigit() or int(v) < LEAST[key]:
            raise UsageError(f"{var}={v!r}: give {WHAT[key]} ({LEAST[key]} or more), or unset it for "
                             f"engine.{key} ({getattr(spec, key):,})")
        update[key], came[key] = int(v), f"{var}={v}"
    return (spec.model_copy(update=update) if update else spec), came


def describe(spec: EngineSpec, came: dict[str, str]) -> str | None:
    """One line for `curate plan` naming the settings that are not the defaults, or None."""
    parts = [f"{k}={getattr(spec, k):,}" + (f" ({came[k]})" if k in came else " (YAML)")
             for k in DEFAULTS if getattr(spec, k) != DEFAULTS[k]]
    return "engine:        " + ", ".join(parts) if parts else None
