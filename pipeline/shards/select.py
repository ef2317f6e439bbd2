"""Exact selections over a whole source without a task that reads the whole source.

Two steps of the run need a cutoff over every kept document of a source: the mixture's
partial epoch (the smallest priority whose documents' tokens reach a target) and a
quality `keep_fraction` (the k-th largest score). Both are a *weighted cutoff*: the
smallest key c with sum(weight of keys <= c) >= want (k-th largest: keys complemented,
weight 1).

Each document shard's task writes its keys sorted (`write_keys`: a small Parquet file of
`key, weight`, row groups of 1,024 rows) with a histogram of the keys' top 12 bits,
counts and weights, in the file's metadata. The merge (`cutoff`) reads each file's
footer, sums the histograms, finds the one bin that holds the answer, and reads from
each file only the row groups whose keys fall in that bin (about 1/4096 of the keys
when they are hashes); the answer is exact, the same as one pass over every key.

The mixture's cells share their files: one file a shard with the cell as a column, sorted by
cell then key, each cell's histogram in the footer (`write_cell_keys`); a cell's set is
`key_files(folder, first, stop, cell)`, its reads filtered to the cell (row-group
statistics skip the others), and `prefetch` sums every cell's histograms in one pass over
the files (a tree past `group` files), not a pass a cell.

Cost: the map is part of a per-shard task that reads its shard anyway; the merge reads
one footer (~70 KB at most) and about one row group per shard: O(shards), not
O(documents). The bin that holds an answer is read only when it holds at most `max_bin`
keys (2^20). A bin of more (scores: a float's top 12 bits put 6-40% of the keys in one
bin; hashes at 10^10 documents: 2.4 million a bin) is refined first, through the same
tree: each file's keys in the bin are counted by their next 12 bits (a histogram, never
the keys, leaves a task), the sub-bin holding the answer is found, and so on until it
holds at most `max_bin` keys or is one key value. No task holds more than `max_bin` keys
of a bin, at any size; the answer is the same. Past `group` files (1,024: `engine.select_group`) a selecting task given a
`mapper` (the steps' rounds of tasks) reads none itself: tasks of `group` files each sum
their footers' histograms, then read the answer's bin from their files, and the selecting
task adds up their results. At 2.5x10^10 documents (333,334 shards of scores) one task
would otherwise read 333,334 footers and as many row groups, serially.
"""

from __future__ import annotations


import base64
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.io import atomic, fs

BITS = 12
SHIFT = np.uint64(64 - BITS)
ROWS = 1024
MAX_BIN = 1 << 20  # keys of the answer's bin read into one task at most; a fuller bin is refined first
META = b"curate.histogram"
SCHEMA = pa.schema([("key", pa.uint64()), ("weight", pa.int64())])


def _pack(a: np.ndarray) -> str:
    return base64.b64encode(zlib.compress(a.astype("<i8").tobytes(), 6)).decode()


def _unpack(s: str) -> np.ndarray:
    return np.frombuffer(zlib.decompress(base64.b64decode(s)), "<i8")


def write_keys(path, keys: np.ndarray, weights: np.ndarray) -> int:
    """One shard's keys (uint64) and weights (int64), sorted, with their histogram."""
    keys = np.asarray(keys, np.uint64)
    weights = np.asarray(weights, np.int64)
    order = np.argsort(keys, kind="stable")
    keys, weights = keys[order], weights[order]
    top = (keys >> SHIFT).astype(np.int64)
    counts = np.bincount(top, minlength=1 << BITS)
    sums = np.bincount(top, weights=weights, minlength=1 << BITS).astype(np.int64)
    meta = f'{{"counts": "{_pack(counts)}", "weights": "{_pack(sums)}"}}'.encode()
    table = pa.table({"key": keys, "weight": weights}, schema=SCHEMA.with_metadata({META: meta}))
    atomic.write_table(table, path, row_group_size=ROWS, compression="zstd")
    return len(keys)


CELL_META = b"curate.cells"
CELL_SCHEMA = pa.schema([("cell", pa.int32()), ("key", pa.uint64()), ("weight", pa.int64())])


def write_cell_keys(path, by_cell: dict[int, tuple[np.ndarray, np.ndarray]]) -> int:
    """One shard's keys of several cells in one file (not a file a cell and shard: at 475 cells
    and 5x10^5 shards that is 2.4x10^8 objects): rows sorted by (cell, key), so a row group's
    statistics skip the other cells, and each cell's histogram in the metadata."""
    cols, hists = [], {}
    for cell in sorted(by_cell):
        keys = np.asarray(by_cell[cell][0], np.uint64)
        weights = np.asarray(by_cell[cell][1], np.int64)
        order = np.argsort(keys, kind="stable")
        keys, weights = keys[order], weights[order]
        top = (keys >> SHIFT).astype(np.int64)
        hists[str(cell)] = {"counts": _pack(np.bincount(top, minlength=1 << BITS)),
                            "weights": _pack(np.bincount(top, weights=weights, minlength=1 << BITS).astype(np.int64))}
        cols.append((np.full(len(keys), cell, np.int32), keys, weights))
    import orjson

    cat = [np.concatenate([c[i] for c in cols]) if cols else np.zeros(0, d) for i, d in enumerate((np.int32, np.uint64, np.int64))]
    table = pa.table({"cell": cat[0], "key": cat[1], "weight": cat[2]},
                     schema=CELL_SCHEMA.with_metadata({CELL_META: orjson.dumps(hists)}))
    atomic.write_table(table, path, row_group_size=ROWS, compression="zstd")
    return len(cat[1])


def _histogram(path, cell: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    import orjson

    md = fs.parquet_schema(path).metadata or {}
    if cell is not None:  # a file of several cells' keys (write_cell_keys): this cell's
        h = orjson.loads(md[CELL_META]).get(str(cell))
        if h is None:
            return np.zeros(1 << BITS, np.int64), np.zeros(1 << BITS, np.int64)
    else:
        h = orjson.loads(md[META])
    return _unpack(h["counts"]), _unpack(h["weights"])


def _histograms(path, cells: list[int]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Several cells' histograms from one footer read (cells the file has no key of left out)."""
    import orjson

    got = orjson.loads((fs.parquet_schema(path).metadata or {})[CELL_META])
    return {c: (_unpack(got[str(c)]["counts"]), _unpack(got[str(c)]["weights"])) for c in cells if str(c) in got}


def key_files(folder: str, first: int, stop: int, cell: int | None = None) -> dict:
    """The key files `folder`/part-<first> .. part-<stop - 1>.parquet as a spec names them: a
    folder and a range, not a path a shard (a selection over 10^6 shards is one task, and its
    plan should not list them in the driver); with `cell`, that cell's keys in files of
    several cells' (write_cell_keys)."""
    return {"folder": str(folder), "first": first, "stop": stop, **({"cell": cell} if cell is not None else {})}


def _paths(keys) -> list[str]:
    if isinstance(keys, dict):
        return [f"{keys['folder']}/part-{j:05d}.parquet" for j in range(keys["first"], keys["stop"])]
    return [str(p) for p in keys]


GROUP = 1024  # key files one task of the tree reads (engine.select_group)


def select_entry(group: int) -> dict:
    """A selecting task's spec entry for `engine.select_group`: none at the default, so the
    steps keep their hashes."""
    return {"select_group": group} if group != GROUP else {}


def grouped(fn, paths: list, mapper, group: int, *args) -> tuple[list, int]:
    """([fn(paths, *args)], 0) here, or past `group` paths with a `mapper` one fn(chunk, *args)
    per chunk of `group` paths, run as tasks: (their results, their count). A selection's
    tree (KeySet) and the samples' merge of picks (steps/samples/tasks.py)."""
    if mapper is None or len(paths) <= group:
        return [fn(paths, *args)], 0
    calls = [(paths[i:i + group], *args) for i in range(0, len(paths), group)]
    return mapper(fn, calls), len(calls)


class KeySet:
    """A set of key files as one task uses it: the footers' histograms are summed at the
    first question and kept for the next ones (totals then a cutoff; a cell's pool, its
    partial epoch, the next phase's cut), for the task's lifetime only. The functions
    below take a KeySet or a list of paths (read afresh). `mapper(fn, calls)`: runs
    fn(*call) for each call as tasks (pipeline/steps/rounds.py Runner.map); past
    `group` files the reads go to tasks of `group` files each."""

    def __init__(self, paths, mapper=None, group: int = GROUP):
        self.paths = _paths(paths)  # a list of paths, or key_files(folder, first, stop[, cell])
        self.cell = paths.get("cell") if isinstance(paths, dict) else None
        self.mapper, self.group = mapper, max(2, group)
        self._hist: tuple[np.ndarray, np.ndarray] | None = None
        self.tasks = 0  # tree tasks run
        self.largest_read = 0  # keys of a bin read into this task at once, at most
        self.refinements = 0  # sub-histograms taken (bins past max_bin)

    def _map(self, fn, *args) -> list:
        got, tasks = grouped(fn, self.paths, self.mapper, self.group, *args, self.cell)
        self.tasks += tasks
        return got

    def histogram(self) -> tuple[np.ndarray, np.ndarray]:
        if self._hist is None:
            counts = np.zeros(1 << BITS, np.int64)
            weights = np.zeros(1 << BITS, np.int64)
            for c, w in self._map(group_histogram):
                counts += c
                weights += w
            self._hist = counts, weights
        return self._hist

    def bin(self, d: int, bits: int = BITS) -> pa.Table:
        """Every key whose top `bits` bits are `d` (with its weight), from every file, unsorted."""
        parts = [t for t in self._map(group_bin, d, bits) if t.num_rows]
        self.largest_read = max(self.largest_read, sum(t.num_rows for t in parts))
        return pa.concat_tables(parts) if parts else SCHEMA.empty_table()

    def sub_histogram(self, d: int, bits: int, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(counts, weights) of the keys whose top `bits` bits are `d`, by their next `step` bits."""
        counts = np.zeros(1 << step, np.int64)
        weights = np.zeros(1 << step, np.int64)
        self.refinements += 1
        for c, w in self._map(group_sub_histogram, d, bits, step):
            counts += c
            weights += w
        return counts, weights


def group_histogram(paths: list[str], cell: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The summed histograms (counts, weights) of some key files' footers: a tree task."""
    counts = np.zeros(1 << BITS, np.int64)
    weights = np.zeros(1 << BITS, np.int64)
    for c, w in fs.read_many(lambda p: _histogram(p, cell), paths):
        counts += c
        weights += w
    return counts, weights


def group_histograms(paths: list[str], cells: list[int]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Every cell's summed histograms over some files of several cells' keys, each footer read
    once: a tree task (the selection of every cell in one pass)."""
    return _sum_by_cell(fs.read_many(lambda p: _histograms(p, cells), paths))


def _sum_by_cell(parts) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """cell -> (counts, weights) summed over some {cell: (counts, weights)} (a cell missing from a part adds nothing)."""
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for part in parts:
        for c, (n, w) in part.items():
            if c in out:
                out[c][0][...] += n
                out[c][1][...] += w
            else:
                out[c] = (n.copy(), w.copy())
    return out


def prefetch(sets: list["KeySet"]) -> None:
    """The histograms of key sets that are cells of the same files (write_cell_keys), read in one
    pass over the files (a tree past `group` files) instead of one pass a cell."""
    by_files: dict[tuple, list[KeySet]] = {}
    for ks in sets:
        if ks.cell is not None and ks._hist is None:
            by_files.setdefault((tuple(ks.paths[:1]), len(ks.paths), ks.paths[-1] if ks.paths else ""), []).append(ks)
    for group in by_files.values():
        first = group[0]
        cells = sorted({ks.cell for ks in group if ks.cell is not None})  # each is (the group's condition)
        got, tasks = grouped(group_histograms, first.paths, first.mapper, first.group, cells)
        first.tasks += tasks
        total = _sum_by_cell(got)
        zero = (np.zeros(1 << BITS, np.int64), np.zeros(1 << BITS, np.int64))
        for ks in group:
            ks._hist = total.get(ks.cell, zero)


def _in_bin(d: int, bits: int, cell: int | None = None):
    """The filter of the keys whose top `bits` bits are `d` (and of `cell`)."""
    shift = 64 - bits
    lo = d << shift
    cond = pc.field("key") >= pa.scalar(np.uint64(lo), pa.uint64())
    if (d + 1) << shift < 1 << 64:
        cond = cond & (pc.field("key") < pa.scalar(np.uint64((d + 1) << shift), pa.uint64()))
    if cell is not None:
        cond = (pc.field("cell") == pa.scalar(cell, pa.int32())) & cond
    return cond


def group_bin(paths: list[str], d: int, bits: int = BITS, cell: int | None = None) -> pa.Table:
    """The keys of bin `d` (top `bits` bits) in some key files (row-group statistics skip the rest): a tree task."""
    cond = _in_bin(d, bits, cell)
    parts = [t for t in fs.read_many(lambda p: _read(p, cond), paths) if t.num_rows]
    return pa.concat_tables(parts) if parts else SCHEMA.empty_table()


def group_sub_histogram(paths: list[str], d: int, bits: int, step: int,
                        cell: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The keys of bin `d` (top `bits` bits) in some key files, counted by their next `step`
    bits (counts, weights): a tree task that returns a histogram, never the keys; it holds
    one file's keys of the bin at a time."""
    cond = _in_bin(d, bits, cell)
    counts = np.zeros(1 << step, np.int64)
    weights = np.zeros(1 << step, np.int64)
    shift, mask = np.uint64(64 - bits - step), np.uint64((1 << step) - 1)
    for t in fs.read_many(lambda p: _read(p, cond), paths):
        if t.num_rows:
            sub = ((t.column("key").to_numpy() >> shift) & mask).astype(np.int64)
            counts += np.bincount(sub, minlength=1 << step)
            weights += np.bincount(sub, weights=t.column("weight").to_numpy(), minlength=1 << step).astype(np.int64)
    return counts, weights


def _keyset(keys) -> KeySet:
    return keys if isinstance(keys, KeySet) else KeySet(keys)


def totals(keys) -> tuple[int, int]:
    """(keys, weight) over all files, from their footers."""
    counts, weights = _keyset(keys).histogram()
    return int(counts.sum()), int(weights.sum())


def cutoff(keys, want: int) -> tuple[int, int, int]:
    """(c, keys <= c, weight of keys <= c) for the smallest key c whose running weight
    reaches `want`. With too little weight in all: the largest key."""
    return cutoffs(keys, [want])[0]


def cutoffs(keys, wants: list[int], max_bin: int = MAX_BIN) -> list[tuple[int, int, int]]:
    """`cutoff` for several wants at once (quantile edges): the footers are read once,
    and each histogram bin that holds an answer is read once (refined first when it holds
    more than `max_bin` keys: `_refined`)."""
    ks = _keyset(keys)
    counts, weights = ks.histogram()
    cum = np.cumsum(weights)
    short = cum.size == 0 or counts.sum() == 0
    where = []  # per want: (bin, weight still needed inside it, or None for "the largest key")
    for want in wants:
        if short or cum[-1] < want:
            where.append((int(np.flatnonzero(counts)[-1]) if counts.any() else 0, None))
        else:
            d = int(np.searchsorted(cum, want))  # the first bin where the running weight reaches want
            where.append((d, want - (int(cum[d - 1]) if d else 0)))
    out: list = [None] * len(wants)
    for d in sorted({d for d, _ in where}):  # one bin in memory at a time
        js = [j for j, (dj, _) in enumerate(where) if dj == d]
        if counts[d] > max_bin:  # too many keys for one task: refined through the tree, an answer at a time
            for j in js:
                out[j] = _refined(ks, d, where[j][1], int(counts[:d].sum()), int(weights[:d].sum()), max_bin)
            continue
        found = _in_keys(ks.bin(d), [where[j][1] for j in js])
        for j, (c, n, w) in zip(js, found):
            out[j] = (c, int(counts[:d].sum()) + n, int(weights[:d].sum()) + w)
    return out


def _in_keys(t: pa.Table, needs: list[int | None]) -> list[tuple[int, int, int]]:
    """For each weight still needed (None: the largest key), among these keys: (the cutoff
    key, keys <= it, their weight)."""
    t = t.sort_by([("key", "ascending")])  # the order of equal keys changes no answer
    keys, w = t.column("key").to_numpy(), np.cumsum(t.column("weight").to_numpy())
    out = []
    for need in needs:
        i = len(keys) - 1 if need is None else int(np.searchsorted(w, need))
        c = int(keys[i])
        last = int(np.searchsorted(keys, np.uint64(c), side="right"))  # equal keys: all of them are <= c
        out.append((c, last, int(w[last - 1])))
    return out


def _refined(ks: KeySet, d: int, need: int | None, before_n: int, before_w: int, max_bin: int) -> tuple[int, int, int]:
    """The cutoff inside bin `d` (top BITS bits) of more than `max_bin` keys: the bin's keys
    counted by their next BITS bits through the tree, the sub-bin holding the answer kept,
    until it holds at most `max_bin` keys (then read) or is one key value (64 bits known)."""
    bits = BITS
    while True:
        step = min(BITS, 64 - bits)
        c, w = ks.sub_histogram(d, bits, step)
        if need is None:  # the largest key: the last sub-bin that holds one
            s = int(np.flatnonzero(c)[-1])
        else:
            cum = np.cumsum(w)
            s = min(int(np.searchsorted(cum, need)), len(cum) - 1)
            need -= int(cum[s - 1]) if s else 0
        before_n += int(c[:s].sum())
        before_w += int(w[:s].sum())
        d, bits = (d << step) | s, bits + step
        if bits == 64:  # one key value: every key of the sub-bin is it
            return d, before_n + int(c[s]), before_w + int(w[s])
        if c[s] <= max_bin:
            key, n, wt = _in_keys(ks.bin(d, bits), [need])[0]
            return key, before_n + n, before_w + wt


def _read(path, cond) -> pa.Table:
    """The rows of one key file that satisfy `cond` (row-group statistics skip the rest)."""
    return fs.read_table(path, filters=cond, columns=["key", "weight"])
