"""Near-duplicate dedup: MinHash LSH candidates, verified by true Jaccard, then clusters.

signatures (per document shard): each kept document's word n-gram shingles, MinHash
    signature and LSH band buckets (pipeline/shards/text.py); one row per (document, band),
    hash-partitioned by bucket.
buckets (per bucket partition): documents sharing a bucket are candidate pairs. In a
    bucket of up to ALL_PAIRS members every pair is a candidate; in a larger one each
    member is paired with the first and with the one before it (members ordered by
    source priority and id hash), which keeps templated pages from exploding into k^2
    pairs while every member still meets the cluster. Each pair is sent to both members'
    document shards. A heavy bucket (pipeline/steps/dedup/salt.py) comes cut into blocks,
    each on a partition of its own, its first two members also paired with the bucket's anchor.
fetch (per document shard): the shard's documents in pairs are read (only their row
    groups, from the shard itself) and sent, id and text, to the verify partitions of
    their pairs, once per partition; each pair goes once, from its later member. A hub
    in a million pairs is copied at most once per verify partition.
verify (per pair partition, sized from the pair count and the average text): the
    pairs, deduplicated, with both texts at hand; with `verify: true`, the true Jaccard
    similarity of the two documents' shingle sets, recomputed from their current text,
    and only pairs at or above `threshold` are edges. No task reads another shard's
    files, so the work per task does not grow with the number of shards.
clusters: connected components of the edges, partitioned by edge, so no task holds a hub
    or a giant component (pipeline/steps/dedup/components.py);
    the survivor of a component is its smallest (source priority, id); every other
    member is removed with `near_duplicate_of:<survivor id> (jaccard=0.87)`, the Jaccard
    being that of the member's closest verified neighbour.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

import numpy as np
import pyarrow as pa
import xxhash

from pipeline.engine.cutoff import Prior, same_as_before
from pipeline.shards import readkey, text
from pipeline.steps.dedup import components
from pipeline.steps.merge import FANIN, GROUP
from pipeline.shards import shuffle
from pipeline.engine.step import task
from pipeline.io import atomic, fs
from pipeline.shards import view
from pipeline.shards.documents import DocShard

ALL_PAIRS = 32
EDGES_PER_PARTITION = 5_000_000
COLUMNS = {"reason": "string", "duplicate_of": "string", "duplicate_of_source": "string", "jaccard": "float64",
           "cluster": "string", "cluster_size": "int64", "duplicate_of_gid": "int64"}
BATCH = 1024
CHUNK_BYTES = 1 << 20  # text per numpy pass: the pass holds about 40 bytes per byte of text


def chunks(lengths, limit: int):
    """[lo, hi) ranges of consecutive documents of at most `limit` bytes (at least one document)."""
    lo, acc = 0, 0
    for i, n in enumerate(lengths.tolist()):
        if acc and acc + n > limit:
            yield lo, i
            lo, acc = i, 0
        acc += n
    if lo < len(lengths):
        yield lo, len(lengths)


def okey(rank: int, ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """An order key that does not depend on sharding: source priority, then 120 bits of
    hashes of the id (56 + an independent 64), so that two documents tie with a chance of
    about 1e-16 among 25 billion; only then does the gid (a shard position) decide."""
    h = np.array([xxhash.xxh3_64_intdigest(i) for i in ids], dtype=np.uint64) >> np.uint64(8)
    return (np.uint64(rank) << np.uint64(56)) | h, okey2(ids)


def okey2(ids: list[str]) -> np.ndarray:
    """The order key's second hash alone (heavy buckets sample documents by it: salt.py)."""
    return np.array([xxhash.xxh3_64_intdigest(i, seed=0x5EED) for i in ids], dtype=np.uint64)


def band_rows(doc: dict, p: dict, a: np.ndarray, b: np.ndarray, rows: np.ndarray, ids: pa.Array, texts: list[str]):
    """(bucket keys, okey, okey2, gid, documents) of some documents of a shard: a row per
    (document, band); None when none of them has a shingle."""
    h, d = text.shingles(texts, p["ngram"], p["normalize"])
    sig, which = text.minhash(h, d, len(texts), a, b)
    if not len(which):
        return None
    bands = p["bands"]
    ok, ok2 = okey(doc["rank"], ids.take(pa.array(which)).to_pylist())
    g = shuffle.gid(doc["src"], doc["part"], rows[which])
    return (text.band_buckets(sig, bands, p["rows"]).ravel(), np.repeat(ok, bands), np.repeat(ok2, bands),
            np.repeat(g, bands), len(which))


def read_heavy(path: str | None) -> dict | None:
    """The heavy buckets' table (pipeline/steps/dedup/salt.py), sorted by bucket, or None."""
    if not path:
        return None
    t = fs.read_table(path)
    return {c: t.column(c).to_numpy() for c in t.column_names}


def _heavy_pos(heavy: dict | None, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each key's row in the heavy table, and whether it is there."""
    if heavy is None or not len(heavy["bucket"]) or not len(keys):
        return np.zeros(len(keys), np.int64), np.zeros(len(keys), bool)
    pos = np.minimum(np.searchsorted(heavy["bucket"], keys), len(heavy["bucket"]) - 1)
    return pos, heavy["bucket"][pos] == keys


def partitions_of(keys: np.ndarray, okeys: np.ndarray, nparts: int, heavy: dict | None) -> np.ndarray:
    """Each row's bucket partition: its bucket's, or, for a heavy bucket, the virtual
    partition (past `nparts`) of its member's block, a range of the id hash."""
    part = shuffle.partition_of(keys, nparts)
    pos, hit = _heavy_pos(heavy, keys)
    if hit.any():
        h32 = (okeys[hit] & np.uint64((1 << 56) - 1)) >> np.uint64(24)  # 32 bits of the id hash
        block = ((h32 * heavy["blocks"][pos[hit]].astype(np.uint64)) >> np.uint64(32)).astype(np.int64)
        part[hit] = nparts + heavy["first"][pos[hit]] + block
    return part


class SigSpec(TypedDict):
    """A `dedup-fuzzy-signatures` shard (steps/dedup/plan.py `per_doc`): one document shard's LSH band rows."""

    doc: DocShard
    params: dict  # the dedup.fuzzy section with `rows`, without `threshold` (verify's alone)
    partitions: int  # the ordinary bucket partitions
    virtual: NotRequired[int]  # heavy buckets' blocks past them (steps/dedup/salt.py), when a bucket is cut
    heavy: NotRequired[str]  # then the heavy-bucket table
    describe: str
    prior: NotRequired[Prior]  # from the executor: the earlier shard of the same partial key


@task(version=shuffle.VERSION)
def sig_shard(spec: SigSpec, out) -> dict:
    doc, p = spec["doc"], spec["params"]
    rk, state = readkey.shard(doc)  # an earlier shard that read the same is linked
    if (st := same_as_before(spec, out, rk)) is not None:
        return st
    a, b = text.permutations(p["num_perm"], p["seed"])
    keys, okeys, okeys2, gids = [], [], [], []
    nbytes = ndocs = 0
    for rows, batch in view.kept_batches(doc["documents"], doc["layers"], ["id", "text"], batch_rows=BATCH, state=state):
        lengths = pa.compute.binary_length(batch.column("text")).to_numpy(zero_copy_only=False)
        nbytes += int(lengths.sum())
        for lo, hi in chunks(lengths, CHUNK_BYTES):
            got = band_rows(doc, p, a, b, rows[lo:hi], batch.column("id").slice(lo, hi - lo),
                            batch.column("text").slice(lo, hi - lo).to_pylist())
            if got is None:
                continue
            for acc, x in zip((keys, okeys, okeys2, gids), got):
                acc.append(x)
            ndocs += got[4]
    base = shuffle.map_file(fs.path(out.dir) / "buckets", out.index)
    nparts = spec["partitions"] + spec.get("virtual", 0)  # heavy buckets' blocks past the ordinary partitions
    if keys:
        k, ok = np.concatenate(keys), np.concatenate(okeys)
        table = pa.table({"bucket": k, "okey": ok, "okey2": np.concatenate(okeys2), "gid": np.concatenate(gids)})
        part = partitions_of(k, ok, spec["partitions"], read_heavy(spec.get("heavy")))
        segments = shuffle.write_partitions(table, part, nparts, base)
    else:
        segments = shuffle.write_empty(nparts, base)
    return {"rows": ndocs, "docs": ndocs, "text_bytes": nbytes, "partitions": nparts, "segments": segments, "read_key": rk}


def anchor_pairs(bucket, okey, okey2, g, starts, sizes, heavy: dict | None) -> tuple[np.ndarray, np.ndarray]:
    """A heavy bucket's block meets the rest of its bucket through the bucket's anchor: the
    block's first two members paired with it (two, so that one pair failing verification
    does not cut the block off). Pairs are (earlier, later) in the bucket order."""
    pos, hit = _heavy_pos(heavy, bucket[starts])
    if not hit.any():
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    s, h, k = starts[hit], pos[hit], sizes[hit]
    at = np.concatenate([s, s[k > 1] + 1])  # each block's first and second member
    h = np.concatenate([h, h[k > 1]])
    ag, ao, ao2 = heavy["anchor"][h], heavy["anchor_okey"][h], heavy["anchor_okey2"][h]
    fg, fo, fo2 = g[at], okey[at], okey2[at]
    keep = ag != fg
    ag, ao, ao2, fg, fo, fo2 = (x[keep] for x in (ag, ao, ao2, fg, fo, fo2))
    anchor_first = (ao < fo) | ((ao == fo) & ((ao2 < fo2) | ((ao2 == fo2) & (ag < fg))))
    return np.where(anchor_first, ag, fg), np.where(anchor_first, fg, ag)


class BucketsSpec(shuffle.ReduceSpec):
    """A `dedup-fuzzy-buckets` shard (steps/dedup/plan.py `reduce_specs`): one bucket partition."""

    heavy: NotRequired[str]  # when a bucket is cut: the heavy-bucket table (steps/dedup/salt.py) ...
    ordinary: NotRequired[int]  # ... and the ordinary partitions (the blocks' come after)
    describe: str


@task(version="4")  # 4: pairs partitioned by slot (Context.slot_offsets)
def buckets_shard(spec: BucketsSpec, out) -> dict:
    t = shuffle.read_partition(spec["inputs"], spec["maps"], spec["partition"])
    target = shuffle.map_file(fs.path(out.dir) / "to", out.index)
    if t is None or t.num_rows == 0:
        shuffle.write_empty(spec["ndocs"], target)
        return {"rows": 0, "pairs": 0, "buckets": 0, "largest": 0}
    bucket = t.column("bucket").to_numpy()
    okey = t.column("okey").to_numpy()
    okey2 = t.column("okey2").to_numpy()
    g = t.column("gid").to_numpy()
    order = np.lexsort((g, okey2, okey, bucket))
    bucket, g = bucket[order], g[order]
    cuts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1], True])
    size = np.diff(cuts)
    blocks = spec.get("heavy") and spec["partition"] >= spec["ordinary"]  # a heavy bucket's block: past the ordinary
    lo, hi = anchor_pairs(bucket, okey[order], okey2[order], g, cuts[:-1], size,
                          read_heavy(spec["heavy"]) if blocks else None)
    lo_parts, hi_parts = [lo], [hi]
    starts = cuts[:-1]
    for k in np.unique(size[(size > 1) & (size <= ALL_PAIRS)]):  # every pair, one array pass per bucket size
        s = starts[size == k][:, None]
        i, j = np.triu_indices(int(k), 1)
        lo_parts.append(g[s + i].ravel())
        hi_parts.append(g[s + j].ravel())
    big = 0
    for start, k in zip(starts[size > ALL_PAIRS], size[size > ALL_PAIRS]):
        members = g[start : start + k]  # each with the first and the one before it
        j = np.arange(1, k)
        i = np.concatenate([np.zeros(k - 1, np.int64), j[1:] - 1])
        j = np.concatenate([j, j[1:]])
        big += 1
        lo_parts.append(members[i])
        hi_parts.append(members[j])
    lo, hi = np.concatenate(lo_parts), np.concatenate(hi_parts)
    pairs = np.unique(np.stack([lo, hi], axis=1), axis=0) if len(lo) else np.zeros((0, 2), np.int64)
    npairs = len(pairs)
    lo, hi = pairs[:, 0], pairs[:, 1]
    shuffle.write_to_shards(pa.table({"lo": np.concatenate([lo, lo]), "hi": np.concatenate([hi, hi])}),
                            np.concatenate([lo, hi]), spec["offsets"], spec["ndocs"], target)  # to both members
    return {"rows": t.num_rows, "pairs": npairs, "buckets": int((size > 1).sum()), "largest": int(size.max()),
            "large_buckets": big}


def pair_partition(lo: np.ndarray, hi: np.ndarray, nparts: int) -> np.ndarray:
    """The verify partition of each pair (lo, hi) of gids."""
    x = (lo.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ hi.astype(np.uint64)
    return shuffle.partition_of(text.fmix64(x), nparts)


class FetchSpec(TypedDict):
    """A `dedup-fuzzy-fetch` shard (steps/dedup/plan.py `fetch_shards`): one document shard's part in the pairs."""

    doc: DocShard
    slot: int  # the document shard's decision slot (plan/context.py `slot_offsets`)
    pairs: str  # the buckets step's folder, or its merge tier's (steps/merge.py read_from)
    pair_files: int | list[int]  # the files there (read_from)
    params: dict  # the dedup.fuzzy section with `rows`, without `threshold`
    partitions: int  # the verify partitions
    describe: str
    prior: NotRequired[Prior]  # from the executor: the earlier shard of the same partial key


def fetch_shard(spec: FetchSpec, out) -> dict:
    """A document shard's part in the candidate pairs -> the verify partitions: its
    documents' ids and texts, once per partition that needs them, and the pairs whose
    later member it holds. A shard whose pairs and layers read the same as before (a new
    file's pairs are elsewhere) links its earlier files."""
    doc, p, nparts = spec["doc"], spec["params"], spec["partitions"]
    t = shuffle.decisions(spec["pairs"], spec["slot"], spec["pair_files"])
    cols = ["id", "text"] if p["verify"] else ["id"]
    rk, state = readkey.shard(doc, cols, t)
    if (st := same_as_before(spec, out, rk)) is not None:
        return st
    texts_base = shuffle.map_file(fs.path(out.dir) / "texts", out.index)
    pairs_base = shuffle.map_file(fs.path(out.dir) / "pairs", out.index)
    b0 = shuffle.bytes_written()
    if t is None or t.num_rows == 0:
        shuffle.write_empty(nparts, texts_base)
        shuffle.write_empty(nparts, pairs_base)
        return {"rows": 0, "pairs": 0, "texts": 0, "partitions": nparts, "shuffle_bytes": shuffle.bytes_written() - b0,
                "read_key": rk}
    row = t.column("row").to_numpy()
    lo, hi = t.column("lo").to_numpy(), t.column("hi").to_numpy()
    me = shuffle.gid(doc["src"], doc["part"], row)
    v = pair_partition(lo, hi, nparts)
    own = np.unique(np.stack([lo[me == hi], hi[me == hi]], axis=1), axis=0)  # each pair once, from its later member
    shuffle.write_partitions(pa.table({"lo": own[:, 0], "hi": own[:, 1]}), pair_partition(own[:, 0], own[:, 1], nparts),
                             nparts, pairs_base)
    need = np.unique(np.stack([row, v], axis=1), axis=0)  # (row, partition): a text once per partition
    rows = np.unique(need[:, 0])
    docs = view.read_rows(doc["documents"], doc["layers"], rows, cols, state=state)
    at = pa.array(np.searchsorted(rows, need[:, 0]))
    table = pa.table({"gid": shuffle.gid(doc["src"], doc["part"], need[:, 0]), **{c: docs.column(c).take(at) for c in cols}})
    shuffle.write_partitions(table, need[:, 1], nparts, texts_base)
    return {"rows": len(rows), "pairs": len(own), "texts": len(need), "partitions": nparts,
            "shuffle_bytes": shuffle.bytes_written() - b0, "read_key": rk}


JACCARD_OF = ("ngram", "normalize", "verify")  # the parameters a pair's Jaccard depends on (with the code)


def verified_before(store, step, params: dict, nparts: int) -> list[str]:
    """Earlier verify folders (finished, the same code, shingles and partitions) whose pairs'
    Jaccard a verify task looks up by the pair's two texts' digests instead of computing
    it again: after a new file or a threshold edit only pairs with a new or changed member
    are shingled. They never change a task's bytes (the same texts give the same Jaccard),
    so they stay out of its content key (engine/reuse.HINTS)."""
    from pipeline.engine import reuse

    if not params["verify"]:
        return []
    want = {k: params[k] for k in JACCARD_OF}

    def same(sj: dict) -> bool:
        got = sj["config"]["params"]
        return sj["code_hash"] == step.code_hash and {k: got.get(k) for k in JACCARD_OF} == want

    return [str(d) for d, rec in reuse.priors(store, step, same) if rec.get("shards") == nparts]


def _known(files: list[str]) -> dict[bytes, float]:
    """(lo text digest + hi text digest) -> Jaccard of the pairs of earlier verify outputs."""
    known: dict[bytes, float] = {}
    for f in files:
        try:
            t = fs.read_table(f, columns=["lo_digest", "hi_digest", "jaccard"])
        except (FileNotFoundError, OSError, KeyError, pa.ArrowInvalid):  # gone since (gc), or unreadable: computed
            continue
        for a, b, j in zip(t.column("lo_digest").to_pylist(), t.column("hi_digest").to_pylist(),
                           t.column("jaccard").to_pylist()):
            if j is not None:
                known.setdefault(a + b, j)
    return known


class VerifySpec(TypedDict):
    """A `dedup-fuzzy-verify` shard (steps/dedup/plan.py `verify_shards`): one pair partition."""

    fetched: str  # the fetch step's folder, or its merge tier's (steps/merge.py read_from)
    maps: int | list[int]  # the files there (read_from)
    partition: int
    params: dict  # the dedup.fuzzy section with `rows`
    describe: str
    prior: list[str]  # earlier verify outputs of this partition (`verified_before`), not the executor's hint


@task(version="2")  # 2: the texts' digests with each pair, looked up in earlier outputs (`prior`)
def verify_shard(spec: VerifySpec, out) -> dict:
    """One verify partition: its pairs, each with both documents' texts at hand."""
    p = spec["params"]
    final = out.path(".parquet")
    schema = pa.schema([("lo", pa.int64()), ("hi", pa.int64()), ("lo_id", pa.string()), ("hi_id", pa.string()),
                        ("jaccard", pa.float64()), ("edge", pa.bool_()),
                        ("lo_digest", pa.binary(16)), ("hi_digest", pa.binary(16))])
    pt = shuffle.read_partition(fs.path(spec["fetched"]) / "pairs", spec["maps"], spec["partition"])
    if pt is None or pt.num_rows == 0:
        atomic.write_table(schema.empty_table(), final)
        return {"rows": 0, "candidates": 0, "edges": 0}
    pairs = np.unique(np.stack([pt.column("lo").to_numpy(), pt.column("hi").to_numpy()], axis=1), axis=0)
    lo, hi = pairs[:, 0].tolist(), pairs[:, 1].tolist()
    tt = shuffle.read_partition(fs.path(spec["fetched"]) / "texts", spec["maps"], spec["partition"])
    g = tt.column("gid").to_pylist()
    ids = dict(zip(g, tt.column("id").to_pylist()))
    looked = 0
    if p["verify"]:
        texts = dict(zip(g, tt.column("text").to_pylist()))
        dig = {x: xxhash.xxh3_128_digest(t.encode("utf-8", "surrogatepass")) for x, t in texts.items()}
        known = _known(spec.get("prior") or [])
        found = [known.get(dig[a] + dig[b]) for a, b in zip(lo, hi)]
        need = sorted({x for (a, b), j in zip(zip(lo, hi), found) if j is None for x in (a, b)})
        sets = dict(zip(need, text.shingle_sets([texts[x] for x in need], p["ngram"], p["normalize"])))
        jac = np.empty(len(lo))
        for i, (a, b) in enumerate(zip(lo, hi)):
            j = found[i]
            if j is None:
                j = text.jaccard(sets[a], sets[b])
            else:
                looked += 1
            jac[i] = j
        edge = jac >= p["threshold"]
        digests: dict[str, list] = {"lo_digest": [dig[x] for x in lo], "hi_digest": [dig[x] for x in hi]}
    else:
        jac = np.full(len(lo), np.nan)
        edge = np.ones(len(lo), bool)
        digests = {"lo_digest": [None] * len(lo), "hi_digest": [None] * len(lo)}
    table = pa.table({"lo": pairs[:, 0], "hi": pairs[:, 1], "lo_id": [ids[x] for x in lo], "hi_id": [ids[x] for x in hi],
                      "jaccard": pa.array(jac, mask=np.isnan(jac)), "edge": edge, **digests}, schema=schema)
    atomic.write_table(table, final, compression="zstd")
    return {"rows": len(lo), "candidates": len(lo), "texts": len(g), "edges": int(edge.sum()), "looked_up": looked}


class ClustersSpec(TypedDict):
    """The `dedup-fuzzy-clusters` coordinator's one shard (steps/dedup/plan.py)."""

    edges: str  # the verify step's folder
    sources: list[str]
    src_rank: list[int]  # per source (YAML order), its survivor rank
    partitions: int | None  # dedup.partitions (a floor)
    verified: int  # the verify shards (edge files)
    edge_count: int  # the edges, from their markers
    offsets: list[int]  # per source, its first decision slot (plan/context.py `slot_offsets`)
    ndocs: int  # the number of slots
    layout: NotRequired[dict]  # the engine's shuffle group and fan-in
    order: NotRequired[str]  # dedup.order when place: survivors by node (gid), not id
    describe: str


@task(version="2")  # 2: decisions partitioned by slot (Context.slot_offsets)
def clusters_shard(spec: ClustersSpec, out) -> dict:
    """Connected components of all verified edges (pipeline/steps/dedup/components.py). A
    coordinator: it holds counts and waits for its rounds' tasks (it takes no CPU slot)."""
    import time

    cpu0 = time.process_time()
    files = [str(fs.path(spec["edges"]) / f"part-{i:05d}.parquet") for i in range(spec["verified"])]
    edges = spec["edge_count"]  # from the verify markers: no task reads every edge file to count
    nparts = max(spec["partitions"] or 1, -(-edges // EDGES_PER_PARTITION))
    work = fs.path(out.dir) / "_work"  # kept until the end: a retried or resumed coordinator goes on from its checkpoints
    layout = spec.get("layout") or {}
    res = components.run(files, work, fs.path(out.dir), nparts, spec["sources"], spec["src_rank"],
                         spec["offsets"], spec["ndocs"], layout.get("group", GROUP), layout.get("fanin", FANIN),
                         layout.get("local_edges", components.LOCAL_EDGES),
                         "node" if spec.get("order") == "place" else "id")
    fs.rmtree(work)
    return {"rows": edges, "edges": edges, "outputs": nparts, "coordinator_cpu_seconds": round(time.process_time() - cpu0, 3),
            **res}
