"""A Levanter cache reader written from Levanter's source (levanter/store/jagged_array.py,
tree_store.py, cache.py at stanford-crfm/levanter 9263f81), with tensorstore: the oracle of
Curate's Levanter writer, since Levanter itself (marin-levanter) needs Python >= 3.12 and
cannot be installed here.

What it does as Levanter does, and so checks:
- `CacheLedger.load`: `<cache>/shard_ledger.json` must exist and say `is_finished`
  (`TreeCache.load` refuses an unfinished cache); its `total_num_rows` is the row count;
- `JaggedArrayStore.open(path, mode="r")`: each array opened with `ts.open(spec,
  open=True)` where the spec carries Levanter's metadata (`_get_spec`: zarr3, chunk grid
  134,217,728, sharding_indexed 262,144, blosc clevel 5) as a constraint: any other
  chunking or codec fails to open, as it would in the trainer;
- `num_rows` is `offsets[0]`; `_bounds_for_rows(i, i + 1)` reads `offsets[i:i + 2]`,
  with row 0 starting at 0 (`offsets[0]` is the count, not a start); `data_size` is
  `offsets[num_rows]`; a row is `data[start:stop]`;
- `TokenSeqDataset`: the sequences a trainer draws are `data[k * seq_len:(k + 1) * seq_len]`
  for k below `data_size // seq_len` (`sequences`).

    python -m bench.levanter_reader tokenized/levanter/web__q5/train   # rows, tokens, first row
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

CHUNK, INNER = 256 * 1024 * 512, 256 * 1024  # levanter.store.jagged_array DEFAULT_WRITE_CHUNK_SIZE, DEFAULT_CHUNK_SIZE


def _spec(path: str) -> dict:
    return {"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.abspath(path)}, "metadata": {
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [CHUNK]}},
        "codecs": [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": [INNER], "codecs": [{"name": "blosc", "configuration": {"clevel": 5}}]}}]}}


class Cache:
    """One finished cache folder (`<cache_dir>/train`), its `input_ids` field."""

    def __init__(self, path: str):
        import tensorstore as ts

        with open(os.path.join(path, "shard_ledger.json")) as f:
            self.ledger = json.load(f)
        if not self.ledger.get("is_finished"):
            raise FileNotFoundError(f"Cache at {path} is not finished")
        self.offsets = ts.open(_spec(os.path.join(path, "input_ids", "offsets")), open=True).result()
        self.data = ts.open(_spec(os.path.join(path, "input_ids", "data")), open=True).result()
        self.num_rows = int(self.offsets[0].read().result())
        self.data_size = int(self.offsets[self.num_rows].read().result()) if self.num_rows else 0

    def ends(self) -> np.ndarray:
        """Every row's end (offsets[1:num_rows + 1])."""
        return self.offsets[1:self.num_rows + 1].read().result().astype(np.int64)

    def row(self, i: int) -> np.ndarray:
        if i >= self.num_rows or i < 0:
            raise IndexError("Index out of bounds")
        o = self.offsets[i:i + 2].read().result()
        start = 0 if i == 0 else int(o[0])
        return self.data[start:int(o[-1])].read().result()

    def rows(self, start: int = 0, stop: int | None = None, batch: int = 4096):
        """(index, ids) of rows [start, stop), reading the data a batch of rows at a time."""
        stop = self.num_rows if stop is None else stop
        ends = self.ends()
        for a in range(start, stop, batch):
            b = min(stop, a + batch)
            lo = 0 if a == 0 else int(ends[a - 1])
            block = self.data[lo:int(ends[b - 1])].read().result() if b > a else np.zeros(0)
            for i in range(a, b):
                s = (0 if i == 0 else int(ends[i - 1])) - lo
                yield i, block[s:int(ends[i]) - lo]

    def sequences(self, seq_len: int) -> int:
        return self.data_size // seq_len


if __name__ == "__main__":
    c = Cache(sys.argv[1])
    print(f"{sys.argv[1]}: {c.num_rows:,} rows, {c.data_size:,} tokens ({c.data.dtype}), ledger rows "
          f"{c.ledger['total_num_rows']:,}; row 0: {c.row(0)[:16].tolist() if c.num_rows else None}")
