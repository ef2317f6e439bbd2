"""Mix (first version): every kept document of every source, in a fixed order, as Parquet shards.

The order is the sources' YAML order, then document shard order, then row order; output
shard k holds kept rows [k * shard_rows, (k + 1) * shard_rows) of that sequence. The
driver plans the cut from per-shard kept counts in the markers, so each output shard is
one task that reads only the pieces it needs, and the bytes depend on nothing but the
inputs and `shard_rows`: not on workers, scheduling or retries.

The weighted mixture (token targets, epochs, a global shuffle) replaces this later.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.io import atomic
from pipeline.steps import view

MIX_SCHEMA = pa.schema(
    [("id", pa.string()), ("text", pa.string()), ("source", pa.string()), ("source_id", pa.string()), ("n_tokens", pa.int64())]
)
BATCH_ROWS = 4096


def plan(inputs: list[dict], shard_rows: int) -> list[dict]:
    """inputs: [{source, documents, layers, kept}] in order -> one spec per output shard."""
    specs, pieces, filled = [], [], 0
    for inp in inputs:
        start = 0
        while start < inp["kept"]:
            take = min(shard_rows - filled, inp["kept"] - start)
            pieces.append({"source": inp["source"], "documents": inp["documents"], "layers": inp["layers"],
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
    """Batches of the piece's kept rows [start, end), streamed from its document shard,
    with the latest rewritten text and token counts (pipeline/steps/view.py)."""
    seen = 0  # kept rows before this batch
    cols = ["id", "text", "source", "source_id", "n_tokens"]
    for _rows, batch in view.kept_batches(piece["documents"], piece["layers"], cols, batch_rows=BATCH_ROWS):
        n = batch.num_rows
        lo, hi = max(piece["start"] - seen, 0), min(piece["end"] - seen, n)
        seen += n
        if hi > lo:
            yield batch.slice(lo, hi - lo)
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
