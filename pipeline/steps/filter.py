"""Filter: a source's filters, in order, over one document shard; decisions as attributes.

Writes `part-XXXXX.parquet` with the same rows in the same order as the document shard:

    id, keep, stage, reason, <filter>.<score>...

A document's first failing filter is its removal stage (the filter's name in the YAML)
and reason; later filters do not see it, so their scores are null for it. The marker
carries per-stage counts (docs, chars, tokens in and out; removals by reason) for the
ledger. Changing a filter's parameters changes this step's hash, not ingest's.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from filters import base as filter_base
from pipeline.io import atomic

BATCH_ROWS = 1024  # filters/words.py caches one batch of word lists


def run_shard(spec: dict, out) -> dict:
    filters = [(name, filter_base.build(filter_base.parse_params(p))) for name, p in spec["filters"]]
    pf = pq.ParquetFile(spec["documents"])
    stages = {name: {"docs_in": 0, "docs_out": 0, "chars_in": 0, "chars_out": 0, "tokens_in": 0, "tokens_out": 0, "removed": {}}
              for name, _ in filters}
    tables = []
    for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=["id", "text", "metadata", "n_chars", "n_tokens"]):
        tables.append(_filter_batch(batch, filters, stages))
    table = pa.concat_tables(tables, promote_options="default") if tables else pa.table(
        {"id": pa.array([], pa.string()), "keep": pa.array([], pa.bool_()), "stage": pa.array([], pa.string()), "reason": pa.array([], pa.string())}
    )
    final = out.path(".parquet")
    tmp = atomic.tmp_path(final)
    pq.write_table(table, tmp, compression="zstd")
    atomic.commit(tmp, final)
    kept = int(pa.compute.sum(table.column("keep")).as_py() or 0)
    return {"rows": table.num_rows, "docs_in": table.num_rows, "docs_out": kept, "stages": stages}


def _filter_batch(batch: pa.RecordBatch, filters, stages) -> pa.Table:
    n = batch.num_rows
    keep = np.ones(n, dtype=bool)
    stage = [None] * n
    reason = [None] * n
    chars = batch.column("n_chars").to_numpy(zero_copy_only=False)
    toks = batch.column("n_tokens").fill_null(0).to_numpy(zero_copy_only=False)
    scores: dict[str, pa.ChunkedArray | pa.Array] = {}
    for name, flt in filters:
        idx = np.flatnonzero(keep)
        st = stages[name]
        st["docs_in"] += len(idx)
        st["chars_in"] += int(chars[idx].sum())
        st["tokens_in"] += int(toks[idx].sum())
        if len(idx):
            sub = batch.take(pa.array(idx))
            res = flt.apply(sub)
            dropped = idx[~res.keep]
            for local in np.flatnonzero(~res.keep):
                i = idx[local]
                r = res.reasons[local] or "removed"
                stage[i] = name
                reason[i] = r
                st["removed"][r] = st["removed"].get(r, 0) + 1
            keep[dropped] = False
            for key, arr in res.scores.items():
                full = pa.nulls(n, arr.type).to_pylist()
                vals = arr.to_pylist()
                for local, i in enumerate(idx):
                    full[i] = vals[local]
                scores[f"{name}.{key}"] = pa.array(full, arr.type)
        kept_idx = np.flatnonzero(keep)
        st["docs_out"] += len(kept_idx)
        st["chars_out"] += int(chars[kept_idx].sum())
        st["tokens_out"] += int(toks[kept_idx].sum())
    cols = {
        "id": batch.column("id"),
        "keep": pa.array(keep, pa.bool_()),
        "stage": pa.array(stage, pa.string()),
        "reason": pa.array(reason, pa.string()),
    }
    cols.update(scores)
    return pa.table(cols)
