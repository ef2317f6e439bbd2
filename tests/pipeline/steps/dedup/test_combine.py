"""Map-side combining (pipeline/shards/combine.py) against a reduce over every holder.

Shards of random keys with heavy ones (a key held by 40% of the documents, keys repeated
inside one shard) go through the real path: `local_top` per shard, the shuffle files, the
exact and paragraph reducers, `write_to_shards`, and `resolve` with each shard's rest file.
The decisions must be those of one global sort; a heavy key must cost its reducer at most
m rows per shard.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

from pipeline.shards import combine, shuffle
from pipeline.steps.dedup import exact, paragraph

SHARDS_PER_SOURCE = 4


def _corpus(seed: int, with_order: bool):
    rng = random.Random(seed)
    shards = []
    for src in range(2):
        for part in range(SHARDS_PER_SOURCE):
            rows = []
            for r in range(rng.randint(0, 60)):
                u = rng.random()
                key = 0 if u < 0.4 else (rng.randint(1, 4) if u < 0.7 else rng.randint(5, 400))
                rows.append({"key": key, "id": f"d{rng.randint(0, 10**9):010d}", "row": r,
                             "order": rng.randint(-3, 3) if with_order else 0})
            shards.append({"src": src, "part": part, "rank": 1 - src, "rows": rows})  # source 1 ranks first
    return shards


def _table(sh: dict, with_order: bool) -> pa.Table:
    rows = sh["rows"]
    keys = np.array([r["key"] * 0x9E3779B97F4A7C15 % (1 << 64) for r in rows], dtype=np.uint64)
    t = pa.table({"h1": keys, "h2": keys ^ np.uint64(12345), "rank": np.full(len(rows), sh["rank"], np.int32),
                  "id": pa.array([r["id"] for r in rows], pa.string()),
                  "gid": shuffle.gid(sh["src"], sh["part"], np.array([r["row"] for r in rows], np.int64))})
    if with_order:
        t = t.append_column("order", pa.array([r["order"] for r in rows], pa.int64()))
    return t


def _expected(shards, m: int, with_order: bool) -> dict:
    """(src, part, row) -> the id of the key's first holder, for every holder past the first m."""
    by_key: dict = {}
    for sh in shards:
        for r in sh["rows"]:
            by_key.setdefault(r["key"], []).append((r["order"], sh["rank"], r["id"], (sh["src"], sh["part"], r["row"])))
    out = {}
    for holders in by_key.values():
        holders.sort()
        for h in holders[m:]:
            out[h[3]] = holders[0][2]
    return out


@pytest.mark.parametrize("kind,m,with_order,seed", [("exact", 1, False, 1), ("exact", 1, True, 2),
                                                    ("paragraph", 1, False, 3), ("paragraph", 3, False, 4),
                                                    ("paragraph", 5, False, 5)])
def test_combined_decisions_equal_a_reduce_over_every_holder(tmp_path, kind, m, with_order, seed):
    shards = _corpus(seed, with_order)
    nparts = 3
    offsets = [0, SHARDS_PER_SOURCE]
    rests = {}
    for k, sh in enumerate(shards):
        top, rest = combine.local_top(_table(sh, with_order), ["order"] if with_order else [], m)
        shuffle.write_partitions(top, shuffle.partition_of(top.column("h1").to_numpy(), nparts), nparts,
                                 shuffle.map_file(tmp_path / "map" / "buckets", k))
        rests[k] = combine.write_rest(rest, tmp_path / "map" / "rest", k)
    spec = {"inputs": str(tmp_path / "map" / "buckets"), "maps": len(shards), "offsets": offsets,
            "ndocs": len(shards), "rank_source": ["b", "a"], "params": {"max_occurrences": m}}
    reduce = exact.reduce_shard if kind == "exact" else paragraph.reduce_shard
    received = 0
    for p in range(nparts):
        st = reduce({**spec, "partition": p}, SimpleNamespace(dir=str(tmp_path / "red"), index=p))
        received += st["rows"]
    heavy = sum(1 for sh in shards for r in sh["rows"] if r["key"] == 0)
    assert received <= sum(min(m, len({r["row"] for r in sh["rows"] if r["key"] == k}))
                           for sh in shards for k in {r["key"] for r in sh["rows"]})
    got = {}
    cols = list(exact.COLUMNS) if kind == "exact" else ["kept_in", "kept_in_source"]
    for k, sh in enumerate(shards):
        dec = shuffle.decisions(tmp_path / "red", k, nparts)
        rest = str(combine.rest_path(tmp_path / "map" / "rest", k)) if rests[k] else None
        t = combine.resolve(dec, rest, cols)
        if t is None:
            continue
        assert t.column("row").to_pylist() == sorted(t.column("row").to_pylist())
        for r in t.to_pylist():
            survivor = r["duplicate_of"] if kind == "exact" else r["kept_in"]
            got[(sh["src"], sh["part"], r["row"])] = survivor
            if kind == "exact":
                assert r["reason"] == f"exact_duplicate_of:{survivor}"
    want = _expected(shards, m, with_order)
    assert got == want
    print(f"\n{kind} m={m}: {sum(len(s['rows']) for s in shards)} holders, heavy key {heavy}, "
          f"reducers received {received} rows, {len(want)} decisions")


def test_a_rest_file_that_does_not_match_its_decisions_is_an_error(tmp_path):
    t = pa.table({"h1": np.array([7, 7, 7], np.uint64), "h2": np.array([1, 1, 1], np.uint64),
                  "rank": np.zeros(3, np.int32), "id": ["a", "b", "c"], "gid": shuffle.gid(0, 0, np.arange(3))})
    top, rest = combine.local_top(t, [], 1)
    assert top.column("extra").to_pylist() == [2] and rest.column("row").to_pylist() == [1, 2]
    dec = pa.table({"h1": np.array([7], np.uint64), "h2": np.array([1], np.uint64), "cut": [False], "extra": [3],
                    "kept_in": ["a"], "kept_in_source": ["s"], "row": [0]})
    combine.write_rest(rest, tmp_path, 0)
    with pytest.raises(ValueError, match="does not hold the extra holders"):
        combine.resolve(dec, str(combine.rest_path(tmp_path, 0)), ["kept_in", "kept_in_source"])


def test_merged_shuffle_files_give_every_partition_the_same_rows_in_the_same_order(tmp_path):
    """shuffle.merge joins writers' files (the merge tier): empty writers, empty partitions,
    groups of one and of several; a reader over the merged files gets exactly what it gets
    over the writers'."""
    rng = np.random.default_rng(3)
    nparts, nmaps = 9, 7
    for i in range(nmaps):
        n = 0 if i in (2, 5) else int(rng.integers(1, 60))
        parts = rng.choice([0, 3, 4, 8], n)  # partitions 1, 2, 5, 6, 7 stay empty everywhere
        t = pa.table({"k": rng.integers(0, 1 << 40, n, dtype=np.int64), "map": np.full(n, i), "s": [f"x{j}" for j in range(n)]})
        if n:
            shuffle.write_partitions(t, parts, nparts, shuffle.map_file(tmp_path / "maps", i))
        else:
            shuffle.write_empty(nparts, shuffle.map_file(tmp_path / "maps", i))
    groups = [(0, 3), (3, 4), (4, 7)]
    for j, (a, b) in enumerate(groups):
        res = shuffle.merge(tmp_path / "maps", a, b, shuffle.map_file(tmp_path / "merged", j))
        assert res["maps"] == b - a and res["partitions"] == nparts
    schema = pa.schema([("k", pa.int64()), ("map", pa.int64()), ("s", pa.string())])
    for p in range(nparts):
        want = shuffle.read_partition(tmp_path / "maps", nmaps, p, schema)
        got = shuffle.read_partition(tmp_path / "merged", len(groups), p, schema)
        assert got.to_pylist() == want.to_pylist(), p
        assert (want.num_rows > 0) == (p in (0, 3, 4, 8))
    # a merged file of merged files (a second tier) is still one reader's view
    shuffle.merge(tmp_path / "merged", 0, len(groups), shuffle.map_file(tmp_path / "twice", 0))
    for p in range(nparts):
        assert shuffle.read_partition(tmp_path / "twice", 1, p, schema).to_pylist() == \
            shuffle.read_partition(tmp_path / "maps", nmaps, p, schema).to_pylist()
    # split by partition ranges: file r x groups + j holds range r of group j; a reader of p reads its range's files
    for ranges in (2, 4, 9, 12):
        out = tmp_path / f"ranges-{ranges}"
        for r in range(ranges):
            for j, (a, b) in enumerate(groups):
                shuffle.merge(tmp_path / "maps", a, b, shuffle.map_file(out, r * len(groups) + j), span=(r, ranges))
        layout = [len(groups), ranges, nparts]
        for p in range(nparts):
            files = shuffle.files_of(layout, p)
            assert len(files) == len(groups)
            got = shuffle.read_partition(out, layout, p, schema)
            assert got.to_pylist() == shuffle.read_partition(tmp_path / "maps", nmaps, p, schema).to_pylist(), (ranges, p)
        copied = sum(shuffle._with(shuffle.map_file(out, i), ".data").stat().st_size for i in range(ranges * len(groups)))
        assert copied == sum(shuffle._with(shuffle.map_file(tmp_path / "merged", j), ".data").stat().st_size
                             for j in range(len(groups)))  # every byte copied once over the ranges


def test_a_merge_reads_its_maps_offsets_a_window_at_a_time_with_the_same_bytes(tmp_path):
    """shuffle.merge holds at most `index_window` bytes of its maps' offsets (ranged reads of
    each map's index, a window of partitions at a time): windows of 1, 2 and 5 partitions
    over 4 maps, whole and split by ranges, write the bytes of one window over everything;
    a map with fewer or more partitions than the others is an error in any window."""
    rng = np.random.default_rng(5)
    nparts, nmaps = 11, 4
    for i in range(nmaps):
        n = int(rng.integers(0, 50))
        t = pa.table({"k": rng.integers(0, 1 << 40, n, dtype=np.int64), "s": [f"m{i}-{j}" for j in range(n)]})
        shuffle.write_partitions(t, rng.integers(0, nparts, n), nparts, shuffle.map_file(tmp_path / "maps", i))

    def merged(name: str, window: int, span=None) -> bytes:
        base = shuffle.map_file(tmp_path / name, 0)
        shuffle.merge(tmp_path / "maps", 0, nmaps, base, span=span, index_window=window)
        return shuffle._with(base, ".data").read_bytes() + shuffle._with(base, ".index").read_bytes()
    whole = merged("whole", 1 << 30)
    for per in (1, 2, 5):  # partitions a window: index_window = 8 bytes x maps x per
        assert merged(f"w{per}", 8 * nmaps * per) == whole, per
        for r in range(3):
            assert merged(f"w{per}-r{r}", 8 * nmaps * per, (r, 3)) == merged(f"all-r{r}", 1 << 30, (r, 3))
    for other in (nparts - 3, nparts + 2):  # a map of another shuffle
        shuffle.write_empty(other, shuffle.map_file(tmp_path / f"bad{other}", 0))
        for i in range(1, 3):
            shuffle.write_empty(nparts, shuffle.map_file(tmp_path / f"bad{other}", i))
        shuffle.merge(tmp_path / f"bad{other}", 1, 3, shuffle.map_file(tmp_path / "x", 0))  # the two alike: fine
        for window in (16, 1 << 30):
            with pytest.raises(ValueError, match="disagree on the number of partitions"):
                shuffle.merge(tmp_path / f"bad{other}", 0, 3, shuffle.map_file(tmp_path / "x", 0), index_window=window)


def test_merge_groups_grow_so_that_a_reader_reads_at_most_fanin_files():
    """The merge tier's groups: 32 writers at least; past 32 x 64 writers the groups grow so a
    reader never reads more than 64 files (its requests stay flat as writers grow), and a
    merge task's read-ahead shrinks so its memory stays flat (256 KB a file at the least)."""
    from pipeline.steps.merge import FANIN, GROUP, MEMORY, group_size, read_ahead

    for writers in (33, 1000, GROUP * FANIN, GROUP * FANIN + 1, 20_000, 500_000):
        g = group_size(writers, GROUP)
        assert g >= GROUP and -(-writers // g) <= FANIN, (writers, g)
        assert g * read_ahead(g) <= MEMORY or read_ahead(g) == 256 << 10
    assert group_size(20_000, GROUP) == 313 and read_ahead(313) < 1 << 20
    assert group_size(100, GROUP) == GROUP and read_ahead(GROUP) == 4 << 20
    # what a merge task declares holds its open files' read-ahead, at any group (7,813 files: 2 GB, where it
    # declared 832 MB whatever the group)
    from pipeline.shards.shuffle import INDEX_WINDOW
    from pipeline.steps.merge import task_mb

    for g in (GROUP, 313, 1024, 7813, 65_536):
        assert task_mb(g) * 2**20 >= g * read_ahead(g) + INDEX_WINDOW + (512 << 20), g
    assert task_mb(7813) >= 2450 and task_mb(GROUP) == 512 + 128 + 64  # 32 files of 4 MB
