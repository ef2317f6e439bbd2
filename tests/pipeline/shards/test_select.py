"""The exact select merged from per-shard key files (pipeline/shards/select.py) against a sort of
every key: any shard layout, empty shards, zero weights, ties, every target."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.shards import select


def _reference(keys: np.ndarray, weights: np.ndarray, want: int) -> tuple[int, int, int]:
    order = np.argsort(keys, kind="stable")
    k, w = keys[order], np.cumsum(weights[order])
    i = int(np.searchsorted(w, want)) if w[-1] >= want else len(k) - 1
    c = int(k[i])
    last = int(np.searchsorted(k, np.uint64(c), side="right"))
    return c, last, int(w[last - 1])


@pytest.mark.parametrize("layout", ["random", "clustered", "ties"])
def test_cutoff_equals_a_sort_of_every_key(tmp_path, layout):
    rng = np.random.default_rng({"random": 1, "clustered": 2, "ties": 3}[layout])
    files, all_k, all_w = [], [], []
    for j in range(6):
        n = [0, 1, 3000, 700, 0, 2500][j]
        if layout == "random":
            k = rng.integers(0, 2**64, n, dtype=np.uint64)
        elif layout == "clustered":  # every key in one histogram bin: the merge reads that bin from every file
            k = (np.uint64(77) << np.uint64(52)) | rng.integers(0, 2**40, n, dtype=np.uint64)
        else:  # many equal keys
            k = rng.integers(0, 50, n, dtype=np.uint64) << np.uint64(58)
        w = rng.integers(0, 900, n).astype(np.int64) * (rng.random(n) > 0.2)  # a fifth weigh nothing
        files.append(str(tmp_path / f"s{j}.parquet"))
        assert select.write_keys(files[-1], k, w) == n
        all_k.append(k)
        all_w.append(w)
    keys, weights = np.concatenate(all_k), np.concatenate(all_w)
    total = int(weights.sum())
    assert select.totals(files) == (len(keys), total)
    wants = sorted({1, 2, 999, total // 7, total // 2, total - 1, total, total + 5})
    for want in wants:
        assert select.cutoff(files, want) == _reference(keys, weights, want), want
    # past `group` files the reads go to tasks of `group` files each (the tree): the same answers
    from pipeline.steps.rounds import fan_out

    calls = []

    def mapper(fn, batch):
        calls.append((fn.__name__, [len(c[0]) for c in batch]))
        return fan_out(fn, batch)

    tree = select.KeySet(files, mapper, group=2)
    assert select.totals(tree) == (len(keys), total)
    assert select.cutoffs(tree, wants) == [_reference(keys, weights, w) for w in wants]
    assert calls[0] == ("group_histogram", [2, 2, 2]) and all(c == ("group_bin", [2, 2, 2]) for c in calls[1:]), calls
    assert tree.tasks == 3 * len(calls)
    before = len(calls)
    flat = select.KeySet(files, mapper, group=6)  # at most `group` files: read here, no task
    assert select.totals(flat) == (len(keys), total) and len(calls) == before and flat.tasks == 0


def test_a_key_set_reads_each_footer_once_and_a_rewritten_file_is_read_afresh(tmp_path, monkeypatch):
    """A task asks one set of key files several questions (totals, quantile edges, a
    cutoff): as a KeySet its footers are read once. The set lives only as long as the
    task's object: the same paths given again as a list are read afresh (no process-wide
    cache that a rewritten file could contradict)."""
    rng = np.random.default_rng(4)
    files = [str(tmp_path / f"k{j}.parquet") for j in range(3)]
    for f in files:
        select.write_keys(f, rng.integers(0, 2**64, 500, dtype=np.uint64), np.ones(500, np.int64))
    reads = []
    orig = select._histogram
    monkeypatch.setattr(select, "_histogram", lambda p, cell=None: reads.append(p) or orig(p, cell))
    ks = select.KeySet(files)
    assert select.totals(ks) == (1500, 1500)
    edges = select.cutoffs(ks, [300, 750, 1200])
    assert select.cutoff(ks, 750) == edges[1]
    assert len(reads) == 3
    select.write_keys(files[0], np.arange(10, dtype=np.uint64), np.ones(10, np.int64))  # rewritten
    assert select.totals(files) == (1010, 1010) and len(reads) == 6


def test_key_files_name_a_folder_and_a_range_and_read_as_the_paths_would(tmp_path):
    """A selection's spec names each cell's key files as a folder and a shard range
    (key_files), not a path a shard: the same totals and cutoffs as the listed paths."""
    rng = np.random.default_rng(5)
    for j in range(2, 6):
        select.write_keys(str(tmp_path / f"part-{j:05d}.parquet"), rng.integers(0, 2**64, 300, dtype=np.uint64),
                          rng.integers(1, 9, 300).astype(np.int64))
    spec = select.key_files(str(tmp_path), 2, 6)
    assert spec == {"folder": str(tmp_path), "first": 2, "stop": 6}
    listed = [str(tmp_path / f"part-{j:05d}.parquet") for j in range(2, 6)]
    assert select.KeySet(spec).paths == listed
    assert select.totals(spec) == select.totals(listed)
    assert select.cutoff(spec, 700) == select.cutoff(listed, 700)
    assert select.totals(select.key_files(str(tmp_path), 3, 3)) == (0, 0)  # a source with no shard


@pytest.mark.parametrize("layout", ["random", "clustered", "ties", "floats"])
def test_a_full_bin_is_refined_and_no_task_reads_more_than_max_bin_keys(tmp_path, layout):
    """A bin of more than `max_bin` keys is refined by the next 12 bits through the tree
    before any key is read (float scores put 6-40% of the keys in one top-12-bit bin;
    hashes at 10^10 documents 2.4 million): the answers are a sort's, and no read gathers
    more than `max_bin` keys. With max_bin 50, every answer but the random layout's takes a
    refinement (ties: the answer is one key value, found by its 64 bits)."""
    from pipeline.steps.rounds import fan_out

    rng = np.random.default_rng({"random": 11, "clustered": 12, "ties": 13, "floats": 14}[layout])
    files, all_k, all_w = [], [], []
    for j in range(5):
        n = [2000, 0, 1500, 1, 2500][j]
        if layout == "random":
            k = rng.integers(0, 2**64, n, dtype=np.uint64)
        elif layout == "clustered":
            k = (np.uint64(77) << np.uint64(52)) | rng.integers(0, 2**30, n, dtype=np.uint64)
        elif layout == "ties":
            k = (np.uint64(5) << np.uint64(52)) | (rng.integers(0, 40, n, dtype=np.uint64) << np.uint64(20))
        else:  # complemented float32 scores in (0.9, 1), as a quality threshold's keys
            k = ~(rng.uniform(0.9, 1.0, n).astype(np.float32).view(np.uint32).astype(np.uint64) << np.uint64(32))
        w = rng.integers(1, 900, n).astype(np.int64) * (rng.random(n) > 0.1)
        files.append(str(tmp_path / f"s{j}.parquet"))
        select.write_keys(files[-1], k, w)
        all_k.append(k)
        all_w.append(w)
    keys, weights = np.concatenate(all_k), np.concatenate(all_w)
    total = int(weights.sum())
    wants = sorted({1, 777, total // 3, total // 2, total - 1, total, total + 9})
    for ks in (select.KeySet(files), select.KeySet(files, lambda fn, batch: fan_out(fn, batch), group=2)):
        assert select.cutoffs(ks, wants, max_bin=50) == [_reference(keys, weights, w) for w in wants]
        assert ks.largest_read <= 50, ks.largest_read
        assert (ks.refinements >= len(wants) - 1) == (layout != "random"), ks.refinements


def test_cells_in_one_file_a_shard_select_as_files_a_cell_would_and_read_each_footer_once(tmp_path, monkeypatch):
    """mix-priority writes one key file a shard with the cell as a column (not a file a cell and
    shard: 2.4x10^8 objects at 475 cells and 5x10^5 shards): each cell's cutoffs are the ones of
    its own files, directly and through a tree of 2-file tasks, and the histograms of every
    cell come from one read of each footer (select.prefetch)."""
    from pipeline.steps.rounds import fan_out

    rng = np.random.default_rng(70)
    cells = [0, 3, 7]
    own: dict[int, list[str]] = {c: [] for c in cells}
    shared = []
    for j in range(5):
        by_cell = {}
        for c in cells:
            n = int(rng.integers(0, 400)) if j != 2 else (0 if c == 3 else 50)
            k = rng.integers(0, 2**64, n, dtype=np.uint64)
            if c == 7:  # a cell whose keys all share one top bin: refined
                k = (np.uint64(9) << np.uint64(52)) | (k >> np.uint64(20))
            w = rng.integers(1, 900, n).astype(np.int64)
            by_cell[c] = (k, w)
            own[c].append(str(tmp_path / f"c{c}-{j}.parquet"))
            select.write_keys(own[c][-1], k, w)
        (tmp_path / "keys").mkdir(exist_ok=True)
        shared.append(str(tmp_path / "keys" / f"part-{j:05d}.parquet"))
        select.write_cell_keys(shared[-1], by_cell)
    for mapper, group in ((None, select.GROUP), (lambda fn, batch: fan_out(fn, batch), 2)):
        reads = []
        orig = select._histograms
        monkeypatch.setattr(select, "_histograms", lambda p, cs: reads.append(p) or orig(p, cs))
        sets = {c: select.KeySet(select.key_files(str(tmp_path / "keys"), 0, 5, cell=c), mapper, group) for c in cells}
        select.prefetch(list(sets.values()))
        if mapper is None:  # every cell's histograms: one read of each footer, here
            assert sorted(reads) == sorted(shared)
        else:  # ... by ceil(5 / 2) tree tasks (Ray's, when this process has joined one: not counted here)
            assert sum(ks.tasks for ks in sets.values()) == 3
        for c in cells:
            total = select.totals(own[c])[1]
            wants = sorted({1, total // 3, total // 2, total - 1, total, total + 5})
            assert select.totals(sets[c]) == select.totals(own[c])
            assert select.cutoffs(sets[c], wants, max_bin=60) == select.cutoffs(own[c], wants, max_bin=60), c
        assert all(ks._hist is not None for ks in sets.values())
        monkeypatch.undo()
