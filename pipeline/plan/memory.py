"""The memory a task of each step kind declares to Ray, so a node runs no more text-heavy
tasks at once than its memory holds (Ray packs by CPU only, unless told).

Which kinds carry text is each stage's declaration (`Stage.tasks`, plan/stage.py), not a
list here: a task that carries documents holds about one document shard of text, a few
times over (Arrow columns, the decoded batch, the written batch): a worker's base (~300 MB
measured with its imports) plus `text_copies` x the largest shard's text, bounded by the
sources' `max_shard_bytes`. Tasks that carry only ids, keys and hashes declare nothing. The
executor caps a declaration at 80% of the largest node's memory, so a task always has a node.
Measured on the demo (peak RSS per task, markers' `peak_rss_mb`): 240-740 MB.
"""

from __future__ import annotations

from pipeline.config import Mixture
from pipeline.plan.stage import TaskKind

BASE_MB = 512


def estimate_mb(task: TaskKind | None, mixture: Mixture) -> int | None:
    """The memory (MB) a task of this kind declares, or None for tasks that carry no text."""
    if task is None or task.text_copies is None:
        return None
    shard_mb = max((s.max_shard_bytes for s in mixture.sources.values()), default=64 << 20) / 2**20
    return int(BASE_MB + task.text_copies * shard_mb)
