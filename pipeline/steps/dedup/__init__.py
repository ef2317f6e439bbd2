"""Deduplication across every source: exact, near-duplicate (MinHash LSH, verified), paragraph.

Each kind is a short chain of steps joined by hash-partitioned shuffles through files,
so no task holds more than one partition or one document shard (see docs/dedup.md):

    exact      map (per document shard: 128-bit hash of normalised text)
               -> reduce (per hash partition: groups, survivor) -> apply (attributes)
    fuzzy      signatures (per shard: MinHash, LSH band buckets)
               -> buckets (per bucket partition: candidate pairs)
               -> verify (per shard: true Jaccard of shingle sets)
               -> clusters (connected components, survivor) -> apply
    paragraph  map (per shard: paragraph hashes) -> reduce (per partition: counts, cuts)
               -> apply (rewritten text, attributes)

Survivors are chosen by (source priority, id), never by shard or arrival order, so the
removed set is the same for any number of workers or shards.
"""
