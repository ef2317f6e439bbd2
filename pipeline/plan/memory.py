"""The memory a task of each step kind declares to Ray, so a node runs no more text-heavy
tasks at once than its memory holds (Ray packs by CPU only, unless told).

A task that carries documents holds about one document shard of text, a few times over
(Arrow columns, the decoded batch, the written batch): a worker's base (~300 MB measured
with its imports) plus `TEXT_COPIES` x the largest shard's text, bounded by the sources'
`max_shard_bytes`. Tasks that carry only ids, keys and hashes declare nothing. The executor
caps a declaration at 80% of the largest node's memory, so a task always has a node.
Measured on the demo (peak RSS per task, markers' `peak_rss_mb`): 240-740 MB.
"""

from __future__ import annotations

from pipeline.config import Mixture

BASE_MB = 512
TEXT_COPIES = 6
TEXT_KINDS = frozenset({
    "ingest", "filter", "decontaminate", "validation", "dedup-fuzzy-signatures", "dedup-fuzzy-fetch",
    "dedup-fuzzy-verify", "dedup-paragraph-map", "dedup-paragraph", "classify-examples", "classify-train",
    "classify-score", "topic", "mix-route", "mix", "samples-pick", "samples", "tokenize", "tokens", "embed",
})


def estimate_mb(kind: str, mixture: Mixture) -> int | None:
    """The memory (MB) a task of `kind` declares, or None for tasks that carry no text."""
    if kind not in TEXT_KINDS:
        return None
    shard_mb = max((s.max_shard_bytes for s in mixture.sources.values()), default=64 << 20) / 2**20
    return int(BASE_MB + TEXT_COPIES * shard_mb)
