"""Connected components of the verified near-duplicate edges, partitioned, with no task
holding a hub: a node with a million neighbours, or a component of a billion members,
is spread over every partition like any other.

Edges live in files hash-partitioned by the *edge* (both directions stored), so a node's
neighbours are spread over the partitions. Rounds of the large-star / small-star
algorithm (Kiveris et al., "Connected Components in MapReduce and Beyond", 2014) rewrite
them until a round changes nothing; then every node of a component has a single edge to
the component's smallest node. Rounds are O(log n) in practice.

    large-star, per node u with neighbours N(u): m = min(N(u) + u); (v, m) for v in N(u), v > u
    small-star, per node u: S = {v in N(u): v < u} + u; m = min(S); (v, m) for v in S, v != m

A star is three waves of tasks, because N(u) is spread: `min` (per edge partition: each
node's smallest neighbour there, sent to the node's partition), `resolve` (per node
partition: m(u), sent back to the edge partitions that asked), `emit` (per edge
partition: the new edges). Whether the edge set is unchanged is decided from per-task
fingerprints (edge count and a 64-bit sum of edge hashes).

Few edges (at most `engine.fuzzy_local_edges`, both directions counted: ~100 MB) skip the
rounds: the coordinator reads the seeded edges and labels every node with its component's
smallest node in one process (`local_labels`: hooking and pointer jumping over numpy arrays,
the labels the rounds converge to), which the later waves cannot tell apart. At 80,000
documents (9,261 edges, 4 partitions) the rounds were 72 tasks and 0.6 CPU-s of overhead.

Labels are node gids, which depend on sharding; the survivor of a component is chosen
afterwards as its smallest (source priority, id), or (source priority, node) with
`dedup.order: place` (a node gid sorts by file, then row), also combined: each node partition
sends, per label, its own best members and count to the label's partition (`best`), which
picks the survivor, writes the cluster row (size, and its first MAX_MEMBERS members,
survivor first) and sends the survivor back (`decide`). So the result does not depend on
sharding, and memory per task is about 50 bytes per edge of its partition plus its nodes.
The coordinator (the clusters step's task) holds only counts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.config.engine import DEFAULTS
from pipeline.io import atomic, fs
from pipeline.shards import shuffle
from pipeline.shards.text import fmix64
from pipeline.steps.rounds import Runner, Source
from pipeline.steps.merge import FANIN, GROUP

MAX_ROUNDS = 64
MAX_MEMBERS = 1000  # members listed in a cluster row (its size is exact)
LOCAL_EDGES = DEFAULTS["fuzzy_local_edges"]  # (engine.fuzzy_local_edges) edges labelled in the coordinator, not in rounds
_E = np.int64


def _part(nodes: np.ndarray, nparts: int) -> np.ndarray:
    return shuffle.partition_of(fmix64(nodes.astype(np.uint64)), nparts)


def _edge_hash(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return fmix64((a.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ b.astype(np.uint64))


def _write_edges(u: np.ndarray, v: np.ndarray, out_dir: Path, index: int, nparts: int) -> tuple[int, int]:
    """Both directions of the undirected edges (u, v), partitioned by the directed edge;
    returns (count, fingerprint) of what was written."""
    a = np.concatenate([u, v])
    b = np.concatenate([v, u])
    if len(a):
        pairs = np.unique(np.stack([a, b], axis=1), axis=0)
        a, b = pairs[:, 0], pairs[:, 1]
    h = _edge_hash(a, b)
    shuffle.write_partitions(pa.table({"u": a, "v": b}), shuffle.partition_of(h, nparts), nparts,
                             shuffle.map_file(out_dir, index))
    return len(a), int(h.sum(dtype=np.uint64)) if len(a) else 0


def _read_edges(src: Source, part: int) -> tuple[np.ndarray, np.ndarray]:
    """The partition's edges, deduplicated, sorted by (u, v)."""
    t = shuffle.read_partition(fs.path(src[0]), src[1], part)
    if t is None or t.num_rows == 0:
        return np.zeros(0, _E), np.zeros(0, _E)
    pairs = np.unique(np.stack([t.column("u").to_numpy(), t.column("v").to_numpy()], axis=1), axis=0)
    return pairs[:, 0], pairs[:, 1]


def _read(src: Source, part: int, cols: list[str]) -> dict[str, np.ndarray]:
    t = shuffle.read_partition(fs.path(src[0]), src[1], part)
    if t is None or t.num_rows == 0:
        return {c: np.zeros(0, _E) for c in cols}
    return {c: t.column(c).to_numpy() for c in cols}


def seed_task(edge_files: list[str], out_dir: str, node_dir: str, index: int, nparts: int) -> tuple[int, int]:
    """Verified edges of some verify outputs -> partitioned edge files, and node rows
    (gid, id, best Jaccard: one per node of these files) partitioned by node."""
    tables = [fs.read_table(f, columns=["lo", "hi", "lo_id", "hi_id", "jaccard", "edge"]) for f in edge_files]
    t = pa.concat_tables(tables) if tables else None
    if t is None or t.num_rows == 0:
        shuffle.write_empty(nparts, shuffle.map_file(fs.path(node_dir), index))
        return _write_edges(np.zeros(0, _E), np.zeros(0, _E), fs.path(out_dir), index, nparts)
    t = t.filter(t.column("edge"))
    lo, hi = t.column("lo").to_numpy(), t.column("hi").to_numpy()
    jac = t.column("jaccard").to_numpy(zero_copy_only=False)
    nodes = pa.table({
        "node": np.concatenate([lo, hi]),
        "id": pa.concat_arrays([t.column("lo_id").combine_chunks(), t.column("hi_id").combine_chunks()]),
        "jaccard": pa.array(np.concatenate([jac, jac]), pa.float64()),
    })
    nodes = _best_per_node(nodes)  # a hub's rows: one per seed task, not one per edge
    shuffle.write_partitions(nodes, _part(nodes.column("node").to_numpy(), nparts), nparts,
                             shuffle.map_file(fs.path(node_dir), index))
    return _write_edges(lo, hi, fs.path(out_dir), index, nparts)


def _best_per_node(nt: pa.Table) -> pa.Table:
    """One row per node: its best Jaccard (NaN, unverified, sorts last)."""
    nt = nt.sort_by([("node", "ascending"), ("jaccard", "descending")])
    node = nt.column("node").to_numpy()
    return nt.filter(pa.array(np.r_[True, node[1:] != node[:-1]] if len(node) else np.zeros(0, bool)))


def _groups(u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Starts of the runs of equal values of sorted u, and each row's run number."""
    starts = np.flatnonzero(np.r_[True, u[1:] != u[:-1]]) if len(u) else np.zeros(0, _E)
    return starts, np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(u)]))


def min_task(kind: str, edges: Source, out_dir: str, part: int, nparts: int) -> int:
    """Per node of this edge partition: its smallest neighbour here (small-star: its
    smallest smaller neighbour, where it has one), to the node's partition."""
    u, v = _read_edges(edges, part)
    if kind == "small":
        sel = v < u
        u, v = u[sel], v[sel]
    starts, _ = _groups(u)
    nu, nv = u[starts], v[starts]  # sorted by v within u: the first is the smallest
    shuffle.write_partitions(pa.table({"u": nu, "m": nv, "from": np.full(len(nu), part, _E)}), _part(nu, nparts), nparts,
                             shuffle.map_file(fs.path(out_dir), part))
    return len(nu)


def resolve_task(mins: Source, out_dir: str, part: int, nparts: int) -> int:
    """m(u) = min(u, its smallest neighbours from every edge partition), sent back to each."""
    r = _read(mins, part, ["u", "m", "from"])
    order = np.lexsort((r["m"], r["u"]))
    u, m, src = r["u"][order], r["m"][order], r["from"][order]
    starts, group = _groups(u)
    best = np.minimum(u[starts], m[starts])[group]
    shuffle.write_partitions(pa.table({"u": u, "m": best}), src, nparts, shuffle.map_file(fs.path(out_dir), part))
    return len(starts)


def emit_task(kind: str, edges: Source, back: Source, out_dir: str, part: int, nparts: int) -> tuple[int, int]:
    """The star's new edges from this edge partition, with each node's m(u)."""
    u, v = _read_edges(edges, part)
    b = _read(back, part, ["u", "m"])
    bu, bm = b["u"], b["m"]
    order = np.argsort(bu, kind="stable")
    bu, bm = bu[order], bm[order]
    if kind == "large":
        sel = v > u
    else:
        sel = v < u
    u, v = u[sel], v[sel]
    i = np.searchsorted(bu, u)
    if len(u) and (np.any(i >= len(bu)) or np.any(bu[np.minimum(i, len(bu) - 1)] != u)):
        raise RuntimeError(f"components: edge partition {part} lacks m(u) for some of its nodes")
    m = bm[i] if len(u) else np.zeros(0, _E)
    if kind == "large":
        nu, nv = v, m
    else:  # (v, m) for smaller neighbours v != m, and the edge (u, m) itself
        keep = v != m
        own = v == m
        nu = np.concatenate([v[keep], u[own]])
        nv = np.concatenate([m[keep], m[own]])
    return _write_edges(nu, nv, fs.path(out_dir), part, nparts)


def label_task(edges: Source, out_dir: str, part: int, nparts: int) -> int:
    """Converged stars: each non-root's only smaller neighbour is its root: (node, label)
    to the node's partition."""
    u, v = _read_edges(edges, part)
    sel = v < u
    shuffle.write_partitions(pa.table({"node": u[sel], "label": v[sel]}), _part(u[sel], nparts), nparts,
                             shuffle.map_file(fs.path(out_dir), part))
    return int(sel.sum())


def min_labels(a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
    """Per node 0..n-1 of the undirected edges (a, b), the smallest node of its component.
    Each pass hooks every label onto the smallest label across its edges, then jumps
    pointers to their roots; a label only ever falls, so the passes end, and at the end
    every edge joins equal labels and the component's smallest node is its own label."""
    lab = np.arange(n, dtype=_E)
    while True:
        la, lb = lab[a], lab[b]
        lo = np.minimum(la, lb)
        new = lab.copy()
        np.minimum.at(new, la, lo)
        np.minimum.at(new, lb, lo)
        while True:
            jumped = new[new]
            if np.array_equal(jumped, new):
                break
            new = jumped
        if np.array_equal(new, lab):
            return lab
        lab = new


def local_labels(edges: Source, out_dir: str, nparts: int) -> int:
    """Every partition's edges in this process -> (node, label) of every non-root node, to
    the node's partition: what `label_task` writes after the rounds, as one writer's file."""
    got = [_read_edges(edges, p) for p in range(nparts)]
    u = np.concatenate([x[0] for x in got])
    v = np.concatenate([x[1] for x in got])
    nodes, inv = np.unique(np.concatenate([u, v]), return_inverse=True)
    label = nodes[min_labels(inv[: len(u)], inv[len(u):], len(nodes))]
    sel = label != nodes
    shuffle.write_partitions(pa.table({"node": nodes[sel], "label": label[sel]}), _part(nodes[sel], nparts), nparts,
                             shuffle.map_file(fs.path(out_dir), 0))
    return int(sel.sum())


def best_task(nodes: Source, labels: Source, out_dir: str, part: int, nparts: int, src_rank: list[int],
              tiebreak: str = "id") -> int:
    """Per node partition: each node's label (itself for a root) and best Jaccard; per
    label, the partition's first MAX_MEMBERS members by (source priority, id) and its
    member count, to the label's partition. Keeps (node, label, Jaccard) for `decide`."""
    nt = shuffle.read_partition(fs.path(nodes[0]), nodes[1], part)
    lab = _read(labels, part, ["node", "label"])
    base = shuffle.map_file(fs.path(out_dir) / "best", part)
    if nt is None or nt.num_rows == 0:
        shuffle.write_empty(nparts, base)
        atomic.write_table(pa.table({"node": pa.array([], pa.int64()), "label": pa.array([], pa.int64()),
                                 "jaccard": pa.array([], pa.float64())}), fs.path(out_dir) / "nodes" / f"part-{part:05d}.parquet")
        return 0
    nt = _best_per_node(nt)
    node = nt.column("node").to_numpy()
    label = node.copy()
    if len(lab["node"]):
        idx = np.searchsorted(node, lab["node"])
        label[idx] = lab["label"]
    src = shuffle.split_gid(node)[0]
    t = nt.append_column("label", pa.array(label)).append_column("rank", pa.array(np.array(src_rank, _E)[src]))
    t = t.append_column("src", pa.array(src))
    atomic.write_table(t.select(["node", "label", "jaccard"]), fs.path(out_dir) / "nodes" / f"part-{part:05d}.parquet")
    t = t.sort_by([("label", "ascending"), ("rank", "ascending"), (tiebreak, "ascending")])
    lb = t.column("label").to_numpy()
    starts, group = _groups(lb)
    sizes = np.diff(np.r_[starts, len(lb)])
    pos = np.arange(len(lb)) - starts[group]
    top = t.filter(pa.array(pos < MAX_MEMBERS)).select(["label", "node", "rank", "src", "id"])
    top = top.append_column("count", pa.array(sizes[group][pos < MAX_MEMBERS]))
    top = top.append_column("from", pa.array(np.full(top.num_rows, part, _E)))
    shuffle.write_partitions(top, _part(top.column("label").to_numpy(), nparts), nparts, base)
    return t.num_rows


def pick_task(best: Source, work_dir: str, out_dir: str, part: int, nparts: int, sources: list[str],
              tiebreak: str = "id") -> dict:
    """Per label partition: each component's survivor (its smallest source priority, id),
    size and cluster row; the survivor back to every node partition holding members."""
    t = shuffle.read_partition(fs.path(best[0]), best[1], part)
    base = shuffle.map_file(fs.path(work_dir) / "picked", part)
    final = fs.path(out_dir) / "clusters" / f"p-{part:05d}.parquet"
    fs.makedirs(final.parent)
    if t is None or t.num_rows == 0:
        shuffle.write_empty(nparts, base)
        atomic.write_table(pa.table({"cluster": pa.array([], pa.string()), "size": pa.array([], pa.int64()),
                                 "members": pa.array([], pa.list_(pa.string()))}), final, compression="zstd")
        return {"clusters": 0, "largest": 0}
    t = t.sort_by([("label", "ascending"), ("rank", "ascending"), (tiebreak, "ascending")])
    lb = t.column("label").to_numpy()
    starts, group = _groups(lb)
    # size: each node partition's count, once (every row of a (label, partition) carries it)
    frm, cnt = t.column("from").to_numpy(), t.column("count").to_numpy()
    key = np.unique(np.stack([group, frm, cnt], axis=1), axis=0)
    size = np.bincount(key[:, 0], weights=key[:, 2], minlength=len(starts)).astype(_E)
    ids = t.column("id").to_pylist()
    srcs = t.column("src").to_numpy()
    ends = np.r_[starts[1:], len(lb)]
    members = [[f"{sources[srcs[j]]}:{ids[j]}" for j in range(a, min(b, a + MAX_MEMBERS))] for a, b in zip(starts, ends)]
    atomic.write_table(pa.table({"cluster": [m[0] for m in members], "size": pa.array(size, pa.int64()),
                             "members": pa.array(members, pa.list_(pa.string()))}), final, compression="zstd")
    back = np.unique(np.stack([group, frm], axis=1), axis=0)  # (component, node partition) pairs
    g, to = back[:, 0], back[:, 1]
    head = starts[g]
    out = pa.table({"label": lb[head], "survivor": t.column("node").to_numpy()[head],
                    "survivor_id": t.column("id").take(pa.array(head)),
                    "survivor_src": pa.array(srcs[head]), "size": pa.array(size[g])})
    shuffle.write_partitions(out, to, nparts, base)
    return {"clusters": len(starts), "largest": int(size.max()) if len(size) else 0}


def decide_task(picked: Source, node_dir: str, out_dir: str, part: int, nparts: int, sources: list[str],
                offsets: list[int], ndocs: int) -> int:
    """Per node partition: every member but the survivor is removed, naming it, with the
    member's best Jaccard; decisions to the document shards."""
    target = shuffle.map_file(fs.path(out_dir) / "to", part)
    nt = fs.read_table(fs.path(node_dir) / f"part-{part:05d}.parquet")
    pk = shuffle.read_partition(fs.path(picked[0]), picked[1], part)
    if pk is None or nt.num_rows == 0:
        shuffle.write_empty(ndocs, target)
        return 0
    pk = pk.sort_by([("label", "ascending")])
    plab = pk.column("label").to_numpy()
    label = nt.column("label").to_numpy()
    i = np.searchsorted(plab, label)
    survivor = pk.column("survivor").to_numpy()[i]
    node = nt.column("node").to_numpy()
    removed = np.flatnonzero(node != survivor)
    at = pa.array(i[removed])
    sid = pk.column("survivor_id").take(at).to_pylist()
    ssrc = pk.column("survivor_src").to_numpy()[i[removed]]
    best = nt.column("jaccard").to_numpy(zero_copy_only=False)[removed]
    reasons = [f"near_duplicate_of:{s}" + (f" (jaccard={b:.2f})" if not np.isnan(b) else " (unverified)")
               for s, b in zip(sid, best, strict=True)]
    dec = pa.table({
        "reason": pa.array(reasons, pa.string()), "duplicate_of": pa.array(sid, pa.string()),
        "duplicate_of_source": pa.array([sources[x] for x in ssrc], pa.string()),
        "jaccard": pa.array(best, mask=np.isnan(best)),
        "cluster": pa.array([f"{sources[x]}:{s}" for x, s in zip(ssrc, sid, strict=True)], pa.string()),
        "cluster_size": pa.array(pk.column("size").to_numpy()[i[removed]]),
        "duplicate_of_gid": pa.array(survivor[removed], pa.int64()),
    })
    shuffle.write_to_shards(dec, node[removed], offsets, ndocs, target)
    return len(removed)


def run(edge_files: list[str], work: Path, out_dir: Path, nparts: int, sources: list[str], src_rank: list[int],
        offsets: list[int], ndocs: int, group: int = GROUP, fanin: int = FANIN, local_edges: int = LOCAL_EDGES,
        tiebreak: str = "id") -> dict:
    """Components and survivors of the verified edges in `edge_files`; decisions go to
    out_dir/to/part-XXXXX (one per partition, shuffled to document shards by `offsets`:
    pipeline/shards/shuffle.py), cluster rows to out_dir/clusters/. Each wave writes one
    shuffle file per partition, and the next reads them through the merge tier
    (pipeline/steps/rounds.py)."""
    runner = Runner(nparts > 1, work, group, fanin)
    groups = [edge_files[i::nparts] for i in range(nparts)]
    seeded = runner.phase("r000-seed", seed_task, [(g, str(work / "r000-seed"), str(work / "nodes"), i, nparts)
                                                   for i, g in enumerate(groups)])
    count, fp = _total(seeded)
    current, nodes = runner.merged("r000-seed", [work / "r000-seed", work / "nodes"], nparts)
    rounds = 0

    def star(kind: str, edges: Source, r: int) -> tuple[Source, list]:
        step = work / f"r{r:03d}-{kind}"
        runner.phase(f"{step.name}-min", min_task, [(kind, edges, str(step / "min"), p, nparts) for p in range(nparts)])
        [mins] = runner.merged(f"{step.name}-min", [step / "min"], nparts)
        runner.phase(f"{step.name}-resolve", resolve_task, [(mins, str(step / "m"), p, nparts) for p in range(nparts)])
        [back] = runner.merged(f"{step.name}-resolve", [step / "m"], nparts)
        res = runner.phase(f"{step.name}-emit", emit_task, [(kind, edges, back, str(step / "edges"), p, nparts)
                                                            for p in range(nparts)])
        [out] = runner.merged(f"{step.name}-emit", [step / "edges"], nparts)
        return out, res

    local = 0 < count <= local_edges
    if local:
        runner.phase("labels", local_labels, [(current, str(work / "labels"), nparts)])
        [labels] = runner.merged("labels", [work / "labels"], 1)
    while count and not local:
        rounds += 1
        if rounds > MAX_ROUNDS:
            raise RuntimeError(f"connected components did not converge in {MAX_ROUNDS} rounds")
        large, _ = star("large", current, rounds)
        current, res = star("small", large, rounds)
        c2, fp2 = _total(res)
        if (c2, fp2) == (count, fp):
            break
        count, fp = c2, fp2
    if not local:
        runner.phase("labels", label_task, [(current, str(work / "labels"), p, nparts) for p in range(nparts)])
        [labels] = runner.merged("labels", [work / "labels"], nparts)
    runner.phase("best", best_task, [(nodes, labels, str(work / "best"), p, nparts, src_rank, tiebreak)
                                            for p in range(nparts)])
    [best] = runner.merged("best", [work / "best" / "best"], nparts)
    picked = runner.phase("pick", pick_task, [(best, str(work), str(out_dir), p, nparts, sources, tiebreak)
                                              for p in range(nparts)])
    [chosen] = runner.merged("pick", [work / "picked"], nparts)
    removed = runner.phase("decide", decide_task, [(chosen, str(work / "best" / "nodes"), str(out_dir), p, nparts,
                                                    sources, offsets, ndocs) for p in range(nparts)])
    # a phase resumed from its checkpoint: its files were written by an earlier attempt, which
    # this marker cannot list, so this shard is never linked into another folder (engine/reuse.py)
    return {**({"reusable": False} if runner.resumed else {}), "rounds": rounds, "labelled_locally": local,
            "resumed_phases": runner.resumed, "clusters": sum(r["clusters"] for r in picked), "removed": sum(removed),
            "largest": max([r["largest"] for r in picked] or [0]), "partitions": nparts, "merge_tasks": runner.merges,
            "round_task_longest": round(runner.longest, 3), "round_task_peak_rss_mb": runner.peak_rss_mb}


def _total(results: list[tuple[int, int]]) -> tuple[int, int]:
    return sum(r[0] for r in results), sum(r[1] for r in results) % (1 << 64)
