"""Semantic dedup (`dedup.semantic`): documents whose embeddings are within a cosine
threshold of an earlier document's, looked for inside k-means clusters (SemDeDup's idea).

sample and centroids are pipeline/shards/kmeans.py's (embedding clusters as topics use them too):
sample (per document shard): the documents that reach the stage whose seeded hash of
    (source, id) falls below `sample / documents`, with their embedding (embed-<source>)
    and the hash: a sample that does not depend on sharding.
centroids (one task): spherical k-means on the sample, in hash order, seeded: `clusters`
    centroids (fewer when the sample is smaller), written as centroids.npy.
fine-sample, fine (past what the sample fits: two levels): a second sample by coarse
    cluster, and each coarse cluster's own k-means, so that k grows with the corpus
    (`wanted_clusters`: one per `cluster_rows` documents, at most MAX_CLUSTERS).
map (per document shard): each document's nearest centroid; rows (cluster, priority key,
    gid, id, embedding) partitioned by a mixed hash of the cluster, so a cluster is one
    reducer's and the clusters spread evenly over the reducers.
reduce (per partition): each cluster's members in priority order (source priority, then
    120 bits of id hashes, as fuzzy dedup orders them: pipeline/steps/dedup/fuzzy.py
    `okey`; with `dedup.order: place`, then its place, the gid); a member whose cosine with an earlier member is at or above `threshold` is
    removed, `semantic_duplicate_of:<that member's id> (cosine=0.981)` naming the closest;
    with `min_overlap` (default 0.55) an earlier member counts only when the two also share
    that share of their words (Jaccard of word sets, from 128 MinHash values the map computes
    from the texts): WordLlama's static vectors put unrelated pages of one language (French,
    Spanish) above any useful cosine, and their words tell them apart;
    `clusters/part-XXXXX.parquet` lists every removed member by cluster, for `curate explain`.
    The similarities are computed a block of BLOCK members at a time against the members
    before them, so a task holds its partition's vectors and one block's row of
    similarities, never a cluster's square.

Every choice (sample, order, centroids, clusters, survivors) is a function of the
documents and the seed, not of shards or workers.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

import numpy as np
import pyarrow as pa

from pipeline.engine.step import task
from pipeline.io import atomic, fs
from pipeline.shards import shuffle
from pipeline.shards import text as text_hash
from pipeline.shards.documents import DocShard
from pipeline.shards.kmeans import kept, nearest, read_centroids, vectors
from pipeline.steps.dedup.fuzzy import okey

VERSION = "3"  # 3: partitioned by a mixed hash of the cluster, fine clusters (two levels); 2: word sketches for min_overlap
COLUMNS = {"reason": "string", "duplicate_of": "string", "duplicate_of_source": "string", "cosine": "float64",
           "cluster": "int64", "cluster_size": "int64"}
BLOCK = 1024  # members whose similarities to the earlier members are computed at once
BISECT_ITERS = 8  # 2-means iterations a split of a large cluster takes
SKETCH, SKETCH_SEED = 128, 0x5E  # MinHash values of a document's words, for `min_overlap`


class SemanticMapSpec(TypedDict):
    """A `dedup-semantic-map` shard (steps/dedup/plan.py `semantic_steps`): one document shard's embeddings to their clusters."""

    doc: DocShard
    embedding: str  # the embed-<source> attribute file
    centroids: str  # the centroids step's centroids.npy
    dim: int
    sketch: bool  # with min_overlap: the documents' word sketches too
    partitions: int
    fine: NotRequired[str]  # the fine step's folder: each coarse cluster's own centroids (two levels)
    fine_parts: NotRequired[int]  # its files
    describe: str


@task(version=VERSION)
def map_shard(spec: SemanticMapSpec, out) -> dict:
    doc = spec["doc"]
    rows, ids, emb, extra = kept(doc, spec["embedding"], from_text=sketches if spec.get("sketch") else None)
    base = shuffle.map_file(fs.path(out.dir) / "buckets", out.index)
    nparts = spec["partitions"]
    if not len(rows):
        return {"rows": 0, "partitions": nparts, "segments": shuffle.write_empty(nparts, base)}
    c = read_centroids(spec["centroids"], spec["dim"])
    v = vectors(emb)
    cluster = nearest(v, c)
    if spec.get("fine"):  # the second level: a coarse cluster's documents among its own centroids
        cluster = fine_clusters(v, cluster, read_fine(spec["fine"], spec["fine_parts"], spec["dim"]), len(c))
    ok, ok2 = okey(doc["rank"], ids)
    cols = {"cluster": cluster, "okey": ok, "okey2": ok2, "gid": shuffle.gid(doc["src"], doc["part"], rows),
            "id": pa.array(ids, pa.string()), "embedding": emb}
    if spec.get("sketch"):  # the kept rows' word sketches, read in the same pass as their ids
        cols["sketch"] = pa.FixedSizeListArray.from_arrays(pa.array(extra["from_text"].ravel(), pa.uint32()), SKETCH)
    table = pa.table(cols)
    segments = shuffle.write_partitions(table, partition(cluster, nparts), nparts, base)
    return {"rows": len(rows), "partitions": nparts, "segments": segments}


def partition(cluster: np.ndarray, nparts: int) -> np.ndarray:
    """A cluster's reduce partition: a mixed hash of its number. Cluster numbers are small
    integers, and partition_of takes a key's top 32 bits: unmixed, every cluster below 2^32
    went to partition 0 (8 partitions: 6,148 rows in one reducer, none in the seven others)."""
    return shuffle.partition_of(text_hash.fmix64(np.asarray(cluster, np.int64).astype(np.uint64)), nparts)


# ---- two levels: k grows with the corpus --------------------------------------------------------
# The coarse centroids come from the sample (at most one per 20 sampled: 5,000 for the default 100,000);
# past that, a cluster of 10^9 / 5,000 = 200,000 documents (5 M at 2.5 x 10^10) would be one reducer's
# and few clusters a partition would balance nothing. So each coarse cluster is split by a k-means of
# its own members: a second sample (`fine_sample_shard`: FINE_SAMPLE a wanted cluster, in every coarse
# cluster as it is large), shuffled by coarse cluster to `fine_shard`, which fits each one's centroids;
# a document is then assigned its coarse cluster's nearest fine centroid (`fine_clusters`). Cluster
# numbers: a coarse cluster left whole keeps its number, a fine one is numbered after all the coarse.
FINE_SAMPLE = 20  # sampled documents a fine centroid
MAX_CLUSTERS = 100_000  # clusters at most (a map task holds every fine centroid: 100 MB at 256 dimensions)
FINE_ROWS = 200_000  # sampled rows a fine task fits at most


def wanted_clusters(kept: int, coarse: int, cluster_rows: int) -> int:
    """The clusters two levels aim at (0: one level does): one per `cluster_rows` documents, at
    most MAX_CLUSTERS, when that is more than the sample's coarse centroids."""
    want = min(MAX_CLUSTERS, -(-kept // cluster_rows))
    return want if want > coarse else 0


class FineSampleSpec(TypedDict):
    """A `dedup-semantic-fine-sample` shard (steps/dedup/plan.py `semantic_steps`): one document shard's second sample."""

    doc: DocShard
    embedding: str
    centroids: str  # the coarse centroids
    dim: int
    seed: int
    rate: float  # the share of every coarse cluster's documents sampled (0: one level, nothing sampled)
    partitions: int
    describe: str


@task(version="1")
def fine_sample_shard(spec: FineSampleSpec, out) -> dict:
    """The second sample: each document whose seeded hash falls below `rate`, with its coarse
    cluster, its key and its embedding, to the fine task of its coarse cluster (a mixed hash)."""
    doc, nparts = spec["doc"], spec["partitions"]
    base = shuffle.map_file(fs.path(out.dir) / "buckets", out.index)
    if spec["rate"] <= 0:
        return {"rows": 0, "sampled": 0, "partitions": nparts, "segments": shuffle.write_empty(nparts, base)}
    from pipeline.shards.kmeans import sample_keys

    rows, ids, emb, _ = kept(doc, spec["embedding"])
    keys = sample_keys(spec["seed"] + 1, doc["source"], ids)  # independent of the first sample
    take = np.flatnonzero(keys < np.uint64(min(2**64 - 1, int(spec["rate"] * 2**64))))
    coarse = nearest(vectors(emb.take(pa.array(take))), read_centroids(spec["centroids"], spec["dim"])) if len(take) else \
        np.zeros(0, np.int64)
    t = pa.table({"coarse": pa.array(coarse, pa.int64()), "key": keys[take], "embedding": emb.take(pa.array(take))})
    segments = shuffle.write_partitions(t, partition(coarse, nparts), nparts, base)
    return {"rows": len(rows), "sampled": len(take), "partitions": nparts, "segments": segments}


class FineSpec(shuffle.ReduceSpec):
    """A `dedup-semantic-fine` shard: one partition of the second sample."""

    seed: int
    dim: int
    describe: str


@task(version="1")
def fine_shard(spec: FineSpec, out) -> dict:
    """Each coarse cluster of this partition split by a k-means of its sampled members (in key
    order, seeded by the cluster): FINE_SAMPLE members a centroid; one that would have one
    centroid stays whole. `fine/<part>.parquet`: coarse cluster, centroid."""
    from pipeline.shards.kmeans import kmeans

    t = shuffle.read_partition(spec["inputs"], spec["maps"], spec["partition"])
    coarse_col, cents = [], []
    if t is not None and t.num_rows:
        t = t.sort_by([("coarse", "ascending"), ("key", "ascending")])
        coarse = t.column("coarse").to_numpy()
        x = vectors(t.column("embedding"))
        cuts = np.flatnonzero(np.r_[True, coarse[1:] != coarse[:-1], True])
        for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
            k = (b - a) // FINE_SAMPLE
            if k < 2:
                continue
            c = kmeans(x[a:b], k, spec["seed"] * 1_000_003 + int(coarse[a]))
            coarse_col.append(np.full(k, coarse[a], np.int64))
            cents.append(c.astype(np.float32))
    dim = spec["dim"]
    flat = np.concatenate(cents).ravel() if cents else np.zeros(0, np.float32)
    atomic.write_table(pa.table({"coarse": np.concatenate(coarse_col) if coarse_col else np.zeros(0, np.int64),
                                 "centroid": pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), dim)}),
                       fs.path(out.dir) / "fine" / f"{out.name}.parquet")
    return {"rows": 0 if t is None else t.num_rows, "split": len(cents), "fine": sum(len(c) for c in cents)}


def read_fine(folder: str, parts: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Every fine centroid, by coarse cluster (stable): (coarse cluster of each, centroids)."""
    tables = [t for t in fs.read_many(fs.read_table, [fs.path(folder) / "fine" / f"part-{i:05d}.parquet"
                                                     for i in range(parts)]) if t.num_rows]
    if not tables:
        return np.zeros(0, np.int64), np.zeros((0, dim), np.float32)
    t = pa.concat_tables(tables)
    order = np.argsort(t.column("coarse").to_numpy(), kind="stable")
    cent = t.column("centroid").combine_chunks().flatten().to_numpy().reshape(-1, dim)
    return t.column("coarse").to_numpy()[order], cent[order]


def fine_clusters(v: np.ndarray, coarse: np.ndarray, fine: tuple[np.ndarray, np.ndarray], ncoarse: int) -> np.ndarray:
    """Each document's cluster: its coarse cluster's number when that cluster stays whole, else
    `ncoarse` + the global index of the nearest of its coarse cluster's fine centroids."""
    owner, cents = fine
    out = coarse.astype(np.int64).copy()
    if not len(owner):
        return out
    starts = np.searchsorted(owner, np.arange(ncoarse), "left")
    ends = np.searchsorted(owner, np.arange(ncoarse), "right")
    for c in np.unique(coarse).tolist():
        a, b = int(starts[c]), int(ends[c])
        if b > a:
            mine = np.flatnonzero(coarse == c)
            out[mine] = ncoarse + a + nearest(v[mine], cents[a:b])
    return out


def sketches(texts: list[str]) -> np.ndarray:
    """(texts, SKETCH) MinHash values of each text's set of words (folded as fuzzy dedup
    folds them): the share of equal values estimates two texts' word-set Jaccard. A text
    without words gets all-ones (overlapping only another such text)."""
    out = np.full((len(texts), SKETCH), 0xFFFFFFFF, np.uint32)
    h, d = text_hash.shingles(texts, 1)
    sig, which = text_hash.minhash(h, d, len(texts), *text_hash.permutations(SKETCH, SKETCH_SEED))
    out[which] = sig
    return out


def split_cluster(v: np.ndarray, most: int | None) -> list[np.ndarray]:
    """A cluster's members (unit vectors `v`, in priority order) as groups of at most `most`,
    each in priority order, in the order of their first member: split in two by seeded
    2-means (the first member and the member farthest from it as the seeds, BISECT_ITERS
    iterations), recursively. The comparison runs inside each group, so a member is compared
    with at most `most` others however large its cluster grows (at 2.5 x 10^10 documents a
    cluster of the sample's k is ~5 M: all pairs would be quadratic); two near-duplicates
    fall on one side but for a pair straddling a cut, as at the top level."""
    if most is None or len(v) <= most:
        return [np.arange(len(v))]
    out, todo = [], [np.arange(len(v))]
    while todo:
        ix = todo.pop()
        if len(ix) <= most:
            out.append(ix)
            continue
        x = v[ix]
        a, b = x[0], x[int(np.argmin(x @ x[0]))]
        side = None
        for _ in range(BISECT_ITERS):
            d = x @ np.stack([a, b]).T
            new = d[:, 1] > d[:, 0]  # nearer b
            if side is not None and np.array_equal(new, side):
                break  # converged
            side = new
            if side.all() or not side.any():
                break
            a, b = x[~side].mean(axis=0), x[side].mean(axis=0)
            a, b = a / (np.linalg.norm(a) or 1.0), b / (np.linalg.norm(b) or 1.0)
        if side.all() or not side.any():  # copies of one vector: halve in priority order
            side = np.arange(len(ix)) >= len(ix) // 2
        todo += [ix[side], ix[~side]]
    return sorted(out, key=lambda g: int(g[0]))


def duplicates(v: np.ndarray, threshold: float, sk: np.ndarray | None = None, min_overlap: float | None = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For members in priority order: which are removed, the earlier member each is closest
    to, and that cosine (rows >= threshold with an earlier member are removed). With
    `min_overlap`, an earlier member counts only when the two sketches (`sk`) also share at
    least that share of their words (estimated): the closest such member is named."""
    m = len(v)
    best = np.full(m, -1, np.int64)
    cos = np.full(m, -np.inf, np.float32)
    for lo in range(1, m, BLOCK):
        hi = min(m, lo + BLOCK)
        s = v[lo:hi] @ v[:hi].T  # (block, members up to the block's end)
        s[np.arange(hi - lo)[:, None] + lo <= np.arange(hi)[None, :]] = -np.inf  # only earlier members
        hits = {}
        if min_overlap is not None:  # the closest candidate above the cosine whose words overlap enough, if any
            for r in np.flatnonzero((s >= threshold).any(axis=1)).tolist():
                hit = _closest_overlapping(s[r], threshold, sk, sk[lo + r], min_overlap)
                if hit is None:
                    s[r, s[r] >= threshold] = -np.inf  # no match: the closest member below the threshold is named
                else:
                    hits[r] = hit
        best[lo:hi] = np.argmax(s, axis=1)
        for r, hit in hits.items():
            best[lo + r] = hit
        cos[lo:hi] = s[np.arange(hi - lo), best[lo:hi]]
    return cos >= threshold, best, cos


def _closest_overlapping(row: np.ndarray, threshold: float, sk: np.ndarray, mine: np.ndarray, min_overlap: float,
                         chunk: int = 64) -> int | None:
    """The candidate argmax would pick among those at or above `threshold` whose sketches share
    `min_overlap` with `mine`: candidates by cosine (highest first, then earliest), tested a
    chunk at a time, stopping at the first that passes. In a templated cluster of k
    near-copies that is one chunk a member, not every earlier member (k^2 sketch comparisons)."""
    cand = np.flatnonzero(row >= threshold)
    order = cand[np.lexsort((cand, -row[cand]))]
    for c0 in range(0, len(order), chunk):
        ch = order[c0:c0 + chunk]
        ok = (sk[ch] == mine).mean(axis=1) >= min_overlap
        if ok.any():
            return int(ch[np.argmax(ok)])
    return None


class SemanticReduceSpec(shuffle.ReduceSpec):
    """A `dedup-semantic-reduce` shard (steps/dedup/plan.py `reduce_specs`): one cluster partition."""

    params: dict  # the dedup.semantic section (a model folder by its files)
    order: NotRequired[str]  # dedup.order when place: members by (source priority, gid)
    describe: str


@task(version="4")  # 3: decisions partitioned by slot (Context.slot_offsets); 4: clusters split past max_cluster_rows
def reduce_shard(spec: SemanticReduceSpec, out) -> dict:
    p = spec["params"]
    t = shuffle.read_partition(spec["inputs"], spec["maps"], spec["partition"])
    target = shuffle.map_file(fs.path(out.dir) / "to", out.index)
    if t is None or t.num_rows == 0:
        shuffle.write_empty(spec["ndocs"], target)
        atomic.write_table(pa.table({"cluster": pa.array([], pa.int64()), "id": pa.array([], pa.string()),
                                 "duplicate_of": pa.array([], pa.string()), "cosine": pa.array([], pa.float64())}),
                       fs.path(out.dir) / "clusters" / f"{out.name}.parquet")
        return {"rows": 0, "clusters": 0, "removed": 0, "largest": 0}
    cluster, g = t.column("cluster").to_numpy(), t.column("gid").to_numpy()
    ok = t.column("okey").to_numpy()
    order = np.lexsort((g, ok >> np.uint64(56), cluster) if spec.get("order") == "place"  # source priority, then place
                       else (g, t.column("okey2").to_numpy(), ok, cluster))
    t = t.take(pa.array(order))
    cluster, g = cluster[order], g[order]
    ids = t.column("id").to_pylist()
    vecs = vectors(t.column("embedding"))
    ov = p.get("min_overlap")
    sk = np.asarray(t.column("sketch").combine_chunks().flatten().to_numpy()).reshape(-1, SKETCH) if ov is not None else None
    src = shuffle.split_gid(g)[0]
    cuts = np.flatnonzero(np.r_[True, cluster[1:] != cluster[:-1], True])
    out_rows, of, cosine, size = [], [], [], []
    groups = 0
    for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
        for ix in split_cluster(vecs[a:b], p.get("max_cluster_rows")):  # the whole cluster, or its groups
            groups += 1
            gone, best, cos = duplicates(vecs[a:b][ix], p["threshold"], sk[a:b][ix] if sk is not None else None, ov)
            for i in np.flatnonzero(gone).tolist():
                out_rows.append(a + int(ix[i]))
                of.append(a + int(ix[int(best[i])]))
                cosine.append(float(cos[i]))
                size.append(b - a)
    r = np.array(out_rows, np.int64)
    o = np.array(of, np.int64)
    table = pa.table({
        "reason": [f"semantic_duplicate_of:{ids[j]} (cosine={c:.3f})" for j, c in zip(o.tolist(), cosine)],
        "duplicate_of": pa.array([ids[j] for j in o.tolist()], pa.string()),
        "duplicate_of_source": pa.array([spec["sources"][s] for s in src[o].tolist()], pa.string()),
        "cosine": pa.array(np.round(np.array(cosine, np.float64), 6), pa.float64()),
        "cluster": pa.array(cluster[r] if len(r) else np.zeros(0, np.int64), pa.int64()),
        "cluster_size": pa.array(np.array(size, np.int64), pa.int64())})
    atomic.write_table(pa.table({"cluster": table.column("cluster"), "id": pa.array([ids[j] for j in r.tolist()], pa.string()),
                             "duplicate_of": table.column("duplicate_of"), "cosine": table.column("cosine")}),
                   fs.path(out.dir) / "clusters" / f"{out.name}.parquet")  # for explain: who else a cluster removed
    shuffle.write_to_shards(table, g[r] if len(r) else np.zeros(0, np.int64), spec["offsets"], spec["ndocs"], target)
    sizes = np.diff(cuts)
    return {"rows": t.num_rows, "clusters": len(sizes), "removed": len(r), "largest": int(sizes.max()), "groups": groups}
