"""Mix (first version): every kept document of every source, in a fixed order, as Parquet shards.

The order is the sources' YAML order, then document shard order, then row order; output
shard k holds kept rows [k * shard_rows, (k + 1) * shard_rows) of that sequence. The
driver plans the cut from per-shard kept counts in the markers, so each output shard is
one task that reads only the pieces it needs, and the bytes depend on nothing but the
inputs and `shard_rows`: not on workers, scheduling or retries.

The weighted mixture (token targets, epochs, a global shuffle) replaces this later.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.io import atomic

MIX_SCHEMA = pa.schema(
    [("id", pa.string()), ("text", pa.string()), ("source", pa.string()), ("source_id", pa.string()), ("n_tokens", pa.int64())]
)
BATCH_ROWS = 4096


def plan(inputs: list[dict], shard_rows: int) -> list[dict]:
    """inputs: [{source, documents, attributes|None, kept}] in order -> one spec per output shard."""
    specs, pieces, filled = [], [], 0
    for inp in inputs:
        start = 0
        while start < inp["kept"]:
            take = min(shard_rows - filled, inp["kept"] - start)
            pieces.append({"source": inp["source"], "documents": inp["documents"], "attributes": inp["attributes"],
                           "start": start, "end": start + take})
            start += take
            filled += take
            if filled == shard_rows:
                specs.append({"pieces": pieces})
                pieces, filled = [], 0
    if pieces:
        specs.append({"pieces": pieces})
    for i, s in enumerate(specs):
        s["describe"] = f"mixture shard {i}: " + ", ".join(f"{p['source']}[{p['start']}:{p['end']}]" for p in s["pieces"][:3])
    return specs


def _kept_slices(piece: dict):
    """Batches of the piece's kept rows [start, end), streamed from its document shard;
    text and token counts rewritten by a filter replace the document's own."""
    keep, override = None, None
    if piece["attributes"]:
        names = pq.ParquetFile(piece["attributes"]).schema_arrow.names
        cols = ["keep"] + (["text", "n_tokens"] if "text" in names else [])
        attrs = pq.read_table(piece["attributes"], columns=cols)
        keep = attrs.column("keep").to_numpy(zero_copy_only=False)
        override = attrs if "text" in names else None
    pf = pq.ParquetFile(piece["documents"])
    row = 0  # position in the document shard
    seen = 0  # kept rows before this batch
    for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=["id", "text", "source", "source_id", "n_tokens"]):
        n = batch.num_rows
        mask = keep[row : row + n] if keep is not None else np.ones(n, dtype=bool)
        if override is not None:
            for col in ("text", "n_tokens"):
                new = override.column(col).slice(row, n).combine_chunks().cast(batch.schema.field(col).type)
                batch = batch.set_column(batch.schema.get_field_index(col), col, pc.coalesce(new, batch.column(col)))
        row += n
        kept_here = int(mask.sum())
        lo, hi = max(piece["start"] - seen, 0), min(piece["end"] - seen, kept_here)
        seen += kept_here
        if hi > lo:
            yield batch.filter(pa.array(mask)).slice(lo, hi - lo)
        if seen >= piece["end"]:
            return


def run_shard(spec: dict, out) -> dict:
    final = out.path(".parquet")
    tmp = atomic.tmp_path(final)
    per_source: dict[str, dict] = {}
    rows = 0
    with pq.ParquetWriter(tmp, MIX_SCHEMA, compression="zstd") as w:
        for piece in spec["pieces"]:
            for b in _kept_slices(piece):
                w.write_table(pa.Table.from_batches([b]).cast(MIX_SCHEMA))
                s = per_source.setdefault(piece["source"], {"docs": 0, "tokens": 0})
                s["docs"] += b.num_rows
                s["tokens"] += int(pc.sum(b.column("n_tokens")).as_py() or 0)
                rows += b.num_rows
    atomic.commit(tmp, final)
    size, sha = atomic.file_digest(final)
    return {"rows": rows, "bytes": size, "sha256": sha, "file": final.name, "per_source": per_source}
