"""Partitioned connected components against a plain union-find, on hard graphs: a long
chain (the worst case for label propagation), stars, and random sparse edges."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.steps.dedup import components
from pipeline.shards import shuffle


def _graph(seed: int):
    rng = random.Random(seed)
    nodes = [int(shuffle.gid(rng.randrange(2), rng.randrange(5), np.array([r]))[0]) for r in range(3000)]
    nodes = list(dict.fromkeys(nodes))
    edges = [(nodes[i], nodes[i + 1]) for i in range(300)]  # a chain of 301 nodes
    edges += [(nodes[400], nodes[j]) for j in range(401, 450)]  # a star
    edges += [(rng.choice(nodes[500:]), rng.choice(nodes[500:])) for _ in range(1200)]  # random, with repeats
    edges = [(a, b) if a < b else (b, a) for a, b in edges if a != b]
    ids = {n: f"id{rng.randrange(10**9):09d}" for n in nodes}
    return edges, ids


def _write_edges(edges, ids, path) -> None:
    """`edges` as a verify step leaves them (every pair a verified edge at Jaccard 0.9)."""
    pq.write_table(pa.table({"lo": pa.array([a for a, _ in edges], pa.int64()), "hi": pa.array([b for _, b in edges], pa.int64()),
                             "lo_id": [ids[a] for a, _ in edges], "hi_id": [ids[b] for _, b in edges],
                             "jaccard": pa.array([0.9] * len(edges)), "edge": pa.array([True] * len(edges))}), path)


def _files(root):
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())


def _union_find(edges, ids, src_rank):
    parent = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in edges:
        parent[find(a)] = find(b)
    comps = {}
    for n in parent:
        comps.setdefault(find(n), []).append(n)
    key = lambda n: (src_rank[int(shuffle.split_gid(np.array([n]))[0][0])], ids[n])  # noqa: E731
    return {min(c, key=key): sorted(c) for c in comps.values()}


@pytest.mark.parametrize("nparts,local_edges", [(1, 0), (3, 0), (3, components.LOCAL_EDGES)])
def test_components_match_union_find(tmp_path, nparts, local_edges, ray_local):
    edges, ids = _graph(nparts)
    src_rank = [1, 0]  # source 1 has priority
    files = []
    for k in range(4):  # as the verify step leaves them: one file per document shard
        files.append(str(tmp_path / f"part-{k:05d}.parquet"))
        _write_edges(edges[k::4], ids, files[-1])
    offsets, ndocs = [0, 5], 10  # two sources of five document shards each
    res = components.run(files, tmp_path / "work", tmp_path / "out", nparts, ["s0", "s1"], src_rank, offsets, ndocs,
                         local_edges=local_edges)
    want = _union_find(edges, ids, src_rank)
    clusters = pq.read_table(tmp_path / "out" / "clusters").to_pylist()
    names = ["s0", "s1"]

    def tag(n):
        return f"{names[int(shuffle.split_gid(np.array([n]))[0][0])]}:{ids[n]}"

    got = {c["cluster"]: sorted(c["members"]) for c in clusters}
    assert got == {tag(s): sorted(tag(n) for n in members) for s, members in want.items()}
    assert all(c["members"][0] == c["cluster"] for c in clusters)  # survivor first
    assert res["removed"] == sum(len(m) - 1 for m in want.values())
    assert (res["rounds"] >= 2 and not res["labelled_locally"]) if not local_edges else \
        (res["rounds"] == 0 and res["labelled_locally"])
    # every removed node got a decision file row naming its survivor
    rows = 0
    for k in range(ndocs):
        dec = shuffle.decisions(tmp_path / "out", k, nparts)
        t = [] if dec is None else dec.to_pylist()
        rows += len(t)
        for r in t:
            assert r["cluster"].split(":", 1)[1] == r["duplicate_of"]
    assert rows == res["removed"]


def test_a_hub_and_a_giant_component_are_spread_over_every_partition(tmp_path, ray_local):
    """One node joined to 4,000 others (a bucket of near-copies paired with its first member),
    plus a chain through them: one component of 4,001 members. With 4 partitions, every
    round's edges and every survivor task's rows are spread, not on the hub's partition."""
    nodes = [int(g) for g in shuffle.gid(0, 0, np.arange(4001))]
    hub = nodes[0]
    edges = [(hub, n) for n in nodes[1:]] + [(nodes[i], nodes[i + 1]) for i in range(1, 4000, 7)]
    ids = {n: f"id{i:05d}" for i, n in enumerate(nodes)}
    _write_edges(edges, ids, tmp_path / "part-00000.parquet")
    nparts = 4
    res = components.run([str(tmp_path / "part-00000.parquet")], tmp_path / "work", tmp_path / "out", nparts, ["s0"], [0],
                         [0], 1, local_edges=0)
    assert res["clusters"] == 1 and res["largest"] == 4001 and res["removed"] == 4000
    for step in sorted((tmp_path / "work").glob("r*-*")):
        d = step if step.name.endswith("seed") else step / "edges"
        rows = [0 if (x := shuffle.read_partition(d, nparts, p)) is None else x.num_rows for p in range(nparts)]
        assert max(rows) <= 0.4 * sum(rows), (step.name, rows)  # ~1/4 each; the hub's partition would hold half or more
    best = [shuffle.read_partition(tmp_path / "work" / "best" / "best", nparts, p) for p in range(nparts)]
    assert sum(b.num_rows for b in best if b is not None) <= nparts * components.MAX_MEMBERS
    row = pq.read_table(tmp_path / "out" / "clusters").to_pylist()[0]
    assert row["size"] == 4001 and len(row["members"]) == components.MAX_MEMBERS and row["members"][0] == "s0:id00000"
    assert sum(0 if (d := shuffle.decisions(tmp_path / "out", 0, nparts)) is None else d.num_rows for _ in [0]) == 4000


def test_a_coordinator_stopped_between_phases_goes_on_from_its_checkpoints(tmp_path, monkeypatch):
    """The coordinator dies after its rounds (here: the labelling phase fails once); run again,
    it reads every finished phase back instead of redoing it, and writes the same bytes."""
    edges, ids = _graph(7)
    _write_edges(edges, ids, tmp_path / "part-00000.parquet")
    files = [str(tmp_path / "part-00000.parquet")]
    args = (["s0", "s1"], [0, 1], [0, 5], 10)
    clean = components.run(files, tmp_path / "work-a", tmp_path / "a", 1, *args, local_edges=0)

    real_label, real_seed, calls = components.label_task, components.seed_task, {"seed": 0}

    def dying_label(*a):
        raise RuntimeError("the coordinator's node went away")

    def counted_seed(*a):
        calls["seed"] += 1
        return real_seed(*a)

    monkeypatch.setattr(components, "seed_task", counted_seed)
    monkeypatch.setattr(components, "label_task", dying_label)
    with pytest.raises(RuntimeError):
        components.run(files, tmp_path / "work-b", tmp_path / "b", 1, *args, local_edges=0)
    assert calls["seed"] == 1 and (tmp_path / "work-b" / "_done" / "r000-seed.json").exists()
    monkeypatch.setattr(components, "label_task", real_label)
    again = components.run(files, tmp_path / "work-b", tmp_path / "b", 1, *args, local_edges=0)
    assert calls["seed"] == 1  # not seeded again
    assert again["resumed_phases"] == 1 + 6 * again["rounds"] and clean["resumed_phases"] == 0
    assert again["reusable"] is False and "reusable" not in clean  # a resumed coordinator's files are not all in its marker
    skip = ("resumed_phases", "round_task_longest", "round_task_peak_rss_mb", "reusable")
    assert {k: v for k, v in again.items() if k not in skip} == {k: v for k, v in clean.items() if k not in skip}
    for sub in ("clusters", "to"):
        a, b = ([sub / x for x in _files(tmp_path / side / sub)] for side in ("a", "b"))
        assert a == b and all((tmp_path / "a" / x).read_bytes() == (tmp_path / "b" / x).read_bytes() for x in a)


def test_the_merge_tier_between_waves_reads_fewer_files_and_changes_no_byte(tmp_path, monkeypatch, ray_local):
    """With groups of 2 and at most 2 files a reader, 5 partitions: every wave's 5 files are
    joined into 2 before the next wave reads them, and the clusters and decision files are
    byte for byte those of the run that reads every wave's 5 files."""
    edges, ids = _graph(11)
    _write_edges(edges, ids, tmp_path / "part-00000.parquet")
    files, args = [str(tmp_path / "part-00000.parquet")], (["s0", "s1"], [0, 1], [0, 5], 10)
    plain = components.run(files, tmp_path / "work-a", tmp_path / "a", 5, *args, local_edges=0)
    merged = components.run(files, tmp_path / "work-b", tmp_path / "b", 5, *args, group=2, fanin=2, local_edges=0)
    assert plain["merge_tasks"] == 0
    waves = 2 + 6 * merged["rounds"] + 3  # seed (edges and nodes), 3 a star, labels, best, pick
    assert merged["merge_tasks"] == 2 * waves  # groups of 3 files: 2 merged files a wave
    assert len(list((tmp_path / "work-b" / "labels" / "merged").glob("*.data"))) == 2
    assert {k: v for k, v in merged.items() if k not in ("merge_tasks", "round_task_longest", "round_task_peak_rss_mb")} == \
        {k: v for k, v in plain.items() if k not in ("merge_tasks", "round_task_longest", "round_task_peak_rss_mb")}
    out_a, out_b = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert out_a == out_b and len(out_a) == 5 + 2 * 5  # cluster rows, and decisions to the document shards
    for rel in out_a:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel


@pytest.mark.parametrize("shape", ["graph", "hub", "path"])
def test_few_edges_labelled_in_one_process_give_the_bytes_of_the_rounds(tmp_path, shape):
    """At most LOCAL_EDGES edges, the coordinator labels the components itself instead of
    running rounds of tasks; the cluster rows and the decisions are byte for byte the
    rounds' (the same labels: each component's smallest node), on a random graph with a
    chain and a star, a hub of 4,000 neighbours, and one path of 5,000 nodes (the longest
    a label travels)."""
    if shape == "graph":
        edges, ids = _graph(5)
    else:
        nodes = [int(g) for g in shuffle.gid(0, 0, np.arange(5000))]
        random.Random(3).shuffle(nodes)  # a path whose smallest node is anywhere along it
        edges = [(nodes[0], n) for n in nodes[1:4001]] if shape == "hub" else list(zip(nodes, nodes[1:]))
        edges = [(a, b) if a < b else (b, a) for a, b in edges]
        ids = {n: f"id{i:05d}" for i, n in enumerate(nodes)}
    _write_edges(edges, ids, tmp_path / "part-00000.parquet")
    files, args = [str(tmp_path / "part-00000.parquet")], (["s0", "s1"], [0, 1], [0, 5], 10)
    rounds = components.run(files, tmp_path / "work-a", tmp_path / "a", 3, *args, local_edges=0)
    local = components.run(files, tmp_path / "work-b", tmp_path / "b", 3, *args)
    assert local["labelled_locally"] and local["rounds"] == 0 and rounds["rounds"] >= 2
    assert (local["clusters"], local["removed"], local["largest"]) == (rounds["clusters"], rounds["removed"], rounds["largest"])
    out_a, out_b = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert out_a == out_b and out_a
    for rel in out_a:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel


def test_min_labels_is_each_components_smallest_node():
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 3000, 2000), rng.integers(0, 3000, 2000)
    got = components.min_labels(a, b, 3000)
    parent = list(range(3000))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for x, y in zip(a.tolist(), b.tolist()):
        rx, ry = find(x), find(y)
        parent[max(rx, ry)] = min(rx, ry)  # the root is the smaller: each component's smallest node
    assert got.tolist() == [find(x) for x in range(3000)]
