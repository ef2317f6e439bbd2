"""Connected components of the verified near-duplicate edges, partitioned.

No task holds the whole edge set: edges live in files hash-partitioned by their first
node (both directions stored), and rounds of the large-star / small-star algorithm
(Kiveris et al., "Connected Components in MapReduce and Beyond", 2014) rewrite them, one
task per partition, until a round changes nothing. Then every node of a component has
a single edge to the component's smallest node. Rounds are O(log n) in practice.

    large-star, per node u with neighbours N(u): m = min(N(u) + u); (v, m) for v in N(u), v > u
    small-star, per node u: S = {v in N(u): v < u} + u; m = min(S); (v, m) for v in S, v != m

A round is a set of Ray tasks when there is more than one partition (the coordinator is
the clusters step's task, which holds only counts), or plain calls with one partition.
Whether the edge set is unchanged is decided from per-task fingerprints (edge count and
a 64-bit sum of edge hashes).

Labels are node gids, which depend on sharding; the survivor of a component is chosen
afterwards, per label partition, as its smallest (source priority, id), so the result
does not depend on sharding. Memory per task: about 50 bytes per edge of its partition,
plus the ids of the nodes of its partition.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.dedup import shuffle
from pipeline.dedup.text import fmix64
from pipeline.io import fs

MAX_ROUNDS = 64


def _part(nodes: np.ndarray, nparts: int) -> np.ndarray:
    return shuffle.partition_of(fmix64(nodes.astype(np.uint64)), nparts)


def _write_edges(u: np.ndarray, v: np.ndarray, out_dir: Path, index: int, nparts: int) -> tuple[int, int]:
    """Both directions of the undirected edges (u, v), partitioned by first node; returns
    (count, fingerprint) of what was written."""
    a = np.concatenate([u, v])
    b = np.concatenate([v, u])
    if len(a):
        pairs = np.unique(np.stack([a, b], axis=1), axis=0)
        a, b = pairs[:, 0], pairs[:, 1]
    shuffle.write_partitions(pa.table({"u": a, "v": b}), _part(a, nparts), nparts, shuffle.map_file(out_dir, index))
    fp = fmix64((a.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ b.astype(np.uint64))
    return len(a), int(fp.sum(dtype=np.uint64)) if len(a) else 0


def _read_edges(directory: Path, nparts: int, part: int) -> tuple[np.ndarray, np.ndarray]:
    t = shuffle.read_partition(directory, nparts, part)
    if t is None:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    u, v = t.column("u").to_numpy(), t.column("v").to_numpy()
    order = np.lexsort((v, u))
    return u[order], v[order]


def star_task(kind: str, in_dir: str, out_dir: str, part: int, nparts: int) -> tuple[int, int]:
    """One large-star or small-star pass over partition `part`."""
    u, v = _read_edges(fs.path(in_dir), nparts, part)
    if len(u) == 0:
        return _write_edges(u, v, fs.path(out_dir), part, nparts)
    starts = np.flatnonzero(np.r_[True, u[1:] != u[:-1]])
    group = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(u)]))
    first_v = v[starts]  # smallest neighbour of each node (sorted by v within u)
    m = np.minimum(u[starts], first_v)[group]
    if kind == "large":
        sel = v > u
        nu, nv = v[sel], m[sel]
    else:
        sel = (v < u) & (v != m)
        head_u = u[starts]
        m_head = np.minimum(head_u, first_v)
        own = head_u != m_head  # u itself joins m when a smaller neighbour exists
        nu = np.concatenate([v[sel], head_u[own]])
        nv = np.concatenate([m[sel], m_head[own]])
    return _write_edges(nu, nv, fs.path(out_dir), part, nparts)


def seed_task(edge_files: list[str], out_dir: str, node_dir: str, index: int, nparts: int) -> tuple[int, int]:
    """Verified edges of some verify outputs -> partitioned edge files, and node rows
    (gid, id, best Jaccard) partitioned the same way."""
    tables = [fs.read_table(f) for f in edge_files]
    t = pa.concat_tables(tables) if tables else None
    if t is None or t.num_rows == 0:
        shuffle.write_empty(nparts, shuffle.map_file(fs.path(node_dir), index))
        return _write_edges(np.zeros(0, np.int64), np.zeros(0, np.int64), fs.path(out_dir), index, nparts)
    t = t.filter(t.column("edge"))
    lo, hi = t.column("lo").to_numpy(), t.column("hi").to_numpy()
    jac = t.column("jaccard").to_numpy(zero_copy_only=False)
    nodes = pa.table({
        "node": np.concatenate([lo, hi]),
        "id": pa.concat_arrays([t.column("lo_id").combine_chunks(), t.column("hi_id").combine_chunks()]),
        "jaccard": pa.array(np.concatenate([jac, jac]), pa.float64()),
    })
    shuffle.write_partitions(nodes, _part(nodes.column("node").to_numpy(), nparts), nparts,
                             shuffle.map_file(fs.path(node_dir), index))
    return _write_edges(lo, hi, fs.path(out_dir), index, nparts)


def label_task(edge_dir: str, node_dir: str, out_dir: str, part: int, nparts: int) -> int:
    """Converged stars -> (node, label, id, best Jaccard), partitioned by label."""
    u, v = _read_edges(fs.path(edge_dir), nparts, part)
    nt = shuffle.read_partition(fs.path(node_dir), nparts, part)
    if nt is None:
        shuffle.write_empty(nparts, shuffle.map_file(fs.path(out_dir), part))
        return 0
    nt = nt.sort_by([("node", "ascending"), ("jaccard", "descending")])
    node = nt.column("node").to_numpy()
    first = np.r_[True, node[1:] != node[:-1]]
    nt = nt.filter(pa.array(first))  # one row per node, with its best Jaccard
    node = nt.column("node").to_numpy()
    label = node.copy()
    smaller = v < u  # a non-root's only edge points to its root
    idx = np.searchsorted(node, u[smaller])
    label[idx] = v[smaller]
    out = nt.append_column("label", pa.array(label))
    shuffle.write_partitions(out, _part(label, nparts), nparts, shuffle.map_file(fs.path(out_dir), part))
    return out.num_rows


def survivor_task(in_dir: str, out_dir: str, part: int, nparts: int, sources: list[str], src_rank: list[int],
                  offsets: list[int], ndocs: int) -> dict:
    """Per component: the survivor is the smallest (source priority, id); the others are
    removed. Writes decisions to their document shards and the partition's cluster rows."""
    t = shuffle.read_partition(fs.path(in_dir), nparts, part)
    target = shuffle.map_file(fs.path(out_dir) / "to", part)
    if t is None:
        shuffle.write_empty(ndocs, target)
        return {"clusters": 0, "removed": 0, "largest": 0}
    node = t.column("node").to_numpy()
    src = shuffle.split_gid(node)[0]
    rank = np.array(src_rank)[src]
    t = t.append_column("rank", pa.array(rank)).append_column("src", pa.array(src))
    t = t.sort_by([("label", "ascending"), ("rank", "ascending"), ("id", "ascending")])
    label = t.column("label").to_numpy()
    sorted_node = t.column("node").to_numpy()
    head = np.flatnonzero(np.r_[True, label[1:] != label[:-1]])
    size = np.diff(np.r_[head, len(label)])
    head_of = np.repeat(head, size)
    ids = t.column("id").to_pylist()
    srcs = t.column("src").to_numpy()
    best = t.column("jaccard").to_numpy(zero_copy_only=False)
    removed = np.flatnonzero(np.arange(len(label)) != head_of)
    names = sources
    sid = [ids[head_of[i]] for i in removed]
    reasons = [f"near_duplicate_of:{s}" + (f" (jaccard={b:.2f})" if not np.isnan(b) else " (unverified)")
               for s, b in zip(sid, best[removed], strict=True)]
    cluster = [f"{names[srcs[head_of[i]]]}:{ids[head_of[i]]}" for i in removed]
    dec = pa.table({
        "reason": pa.array(reasons, pa.string()), "duplicate_of": pa.array(sid, pa.string()),
        "duplicate_of_source": pa.array([names[srcs[head_of[i]]] for i in removed], pa.string()),
        "jaccard": pa.array(best[removed], mask=np.isnan(best[removed])),
        "cluster": pa.array(cluster, pa.string()), "cluster_size": pa.array(np.repeat(size, size)[removed]),
        "duplicate_of_gid": pa.array(sorted_node[head_of[removed]], pa.int64()),
    })
    shuffle.write_to_shards(dec, sorted_node[removed], offsets, ndocs, target)
    members = [[f"{names[srcs[j]]}:{ids[j]}" for j in range(h, h + s)] for h, s in zip(head, size, strict=True)]
    ctab = pa.table({"cluster": [m[0] for m in members], "size": pa.array(size, pa.int64()),
                     "members": pa.array(members, pa.list_(pa.string()))})
    final = fs.path(out_dir) / "clusters" / f"p-{part:05d}.parquet"
    fs.makedirs(final.parent)
    fs.write_table(ctab, final, compression="zstd")
    return {"clusters": len(head), "removed": len(removed), "largest": int(size.max())}


class _Runner:
    """Runs a batch of calls as Ray tasks (more than one partition) or in this process."""

    def __init__(self, parallel: bool):
        self.parallel = parallel
        if parallel:
            import ray

            self.ray = ray
            self.remote = {}

        self.longest = 0.0  # the longest round task and its peak RSS, for the clusters marker
        self.peak_rss_mb = 0.0

    def map(self, fn, calls: list[tuple]) -> list:
        if not self.parallel:
            out = [_timed(fn, *c) for c in calls]
        else:
            r = self.remote.get(fn)
            if r is None:
                r = self.remote[fn] = self.ray.remote(num_cpus=1, max_retries=3)(_timed)
            out = self.ray.get([r.remote(fn, *c) for c in calls])
        self.longest = max([self.longest] + [o[1] for o in out])
        self.peak_rss_mb = max([self.peak_rss_mb] + [o[2] for o in out])
        return [o[0] for o in out]


def _timed(fn, *args):
    """(fn(*args), seconds, peak RSS MB of the task)."""
    import time

    from pipeline.executor import _peak_rss_mb, _reset_peak_rss

    reset = _reset_peak_rss()
    t0 = time.time()
    res = fn(*args)
    return res, time.time() - t0, _peak_rss_mb(reset)


def run(edge_files: list[str], work: Path, out_dir: Path, nparts: int, sources: list[str], src_rank: list[int],
        offsets: list[int], ndocs: int) -> dict:
    """Components and survivors of the verified edges in `edge_files`; decisions go to
    out_dir/to/part-XXXXX (one per partition, shuffled to document shards by `offsets`:
    pipeline/dedup/shuffle.py), cluster rows to out_dir/clusters/."""
    runner = _Runner(nparts > 1)
    groups = [edge_files[i::nparts] for i in range(nparts)]
    seeded = runner.map(seed_task, [(g, str(work / "r000-seed"), str(work / "nodes"), i, nparts)
                                    for i, g in enumerate(groups)])
    count, fp = _total(seeded)
    current = work / "r000-seed"
    rounds = 0
    while count:
        rounds += 1
        if rounds > MAX_ROUNDS:
            raise RuntimeError(f"connected components did not converge in {MAX_ROUNDS} rounds")
        large = work / f"r{rounds:03d}-large"
        runner.map(star_task, [("large", str(current), str(large), p, nparts) for p in range(nparts)])
        small = work / f"r{rounds:03d}-small"
        c2, fp2 = _total(runner.map(star_task, [("small", str(large), str(small), p, nparts) for p in range(nparts)]))
        current = small
        if (c2, fp2) == (count, fp):
            break
        count, fp = c2, fp2
    runner.map(label_task, [(str(current), str(work / "nodes"), str(work / "labels"), p, nparts) for p in range(nparts)])
    res = runner.map(survivor_task, [(str(work / "labels"), str(out_dir), p, nparts, sources, src_rank, offsets, ndocs)
                                     for p in range(nparts)])
    return {"rounds": rounds, "clusters": sum(r["clusters"] for r in res), "removed": sum(r["removed"] for r in res),
            "largest": max([r["largest"] for r in res] or [0]), "partitions": nparts,
            "round_task_longest": round(runner.longest, 3), "round_task_peak_rss_mb": runner.peak_rss_mb}


def _total(results: list[tuple[int, int]]) -> tuple[int, int]:
    return sum(r[0] for r in results), sum(r[1] for r in results) % (1 << 64)
