"""A seeded sample of document embeddings, spherical k-means on it, and the nearest
centroid of each document: what semantic dedup (pipeline/steps/dedup/semantic.py) and
embedding clusters as topics (pipeline/steps/classify/clusters.py) share.

The sample is the documents whose seeded hash of (source, id) falls below a rate, and
k-means reads it in hash order from a seeded start: the centroids depend on the documents
and the seed, never on shards or workers.
"""

from __future__ import annotations

from typing import TypedDict

import numpy as np
import pyarrow as pa
import xxhash

from pipeline.engine.step import task
from pipeline.io import atomic, fs
from pipeline.shards import view
from pipeline.shards.documents import DocShard

VERSION = "1"
CHUNK = 8192  # rows per distance pass
ITERATIONS = 10  # Lloyd iterations of the spherical k-means (fixed: the same centroids on every run)


def sample_keys(seed: int, source: str, ids: list[str]) -> np.ndarray:
    return np.array([xxhash.xxh3_64_intdigest(f"semantic:{seed}:{source}:{i}") for i in ids], np.uint64)


def unit(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.float32)
    n = np.linalg.norm(v, axis=1, keepdims=True)
    np.divide(v, n, out=v, where=n > 0)
    return v


def vectors(col: pa.Array) -> np.ndarray:
    """A fixed-size list column of float16 -> (n, dim) float32 unit rows."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    dim = col.type.list_size
    x = col.flatten().to_numpy(zero_copy_only=False).reshape(-1, dim)
    if len(x) and not np.isfinite(x).all():  # the embed step refuses them: a file written otherwise
        raise ValueError(f"{int((~np.isfinite(x).all(axis=1)).sum())} non-finite embedding(s) (NaN or inf): "
                         "k-means would put every document in one cluster; embed the shard again")
    return unit(x)


def read_vectors(path: str, float16: bool = False) -> tuple[pa.Array, np.ndarray]:
    """(the `embedding` column, its rows as the heads were trained on them: float16 as
    stored, or int8 times its row's scale in float32) of an `embed-<source>` file; with
    `float16`, an int8 column comes back as float16 too, as the k-means steps carry it."""
    pf = fs.parquet_file(path)
    t = pf.read(columns=[c for c in ("embedding", "embedding_scale") if c in pf.schema_arrow.names])  # not the ids
    col = t.column("embedding").combine_chunks()
    dim = col.type.list_size
    raw = np.asarray(col.values.to_numpy(zero_copy_only=False)).reshape(-1, dim)
    if "embedding_scale" not in t.column_names:
        return col, raw
    from filters import embeddings

    s = t.column("embedding_scale").combine_chunks().fill_null(0).to_numpy(zero_copy_only=False).astype(np.float32)
    x = embeddings.dequantize(raw, s)
    if float16:
        col = pa.FixedSizeListArray.from_arrays(pa.array(x.astype(np.float16).reshape(-1)), dim, mask=col.is_null())
    return col, x


def kept(doc: dict, embedding: str, columns: tuple[str, ...] = (), from_text=None) -> tuple[np.ndarray, list[str], pa.Array, dict]:
    """Rows that reach the stage, their ids, their embeddings, and their current values of
    `columns` (as the layers left them: a paragraph cut rewrites n_chars), in one pass; with
    `from_text` (a function of a batch's texts to an array a row), its rows too, as
    extra["from_text"] (semantic dedup's word sketches, read in the same pass)."""
    rows, ids, more, derived = [], [], {c: [] for c in columns}, []
    for r, b in view.kept_batches(doc["documents"], doc["layers"], ["id", *columns, *(["text"] if from_text else [])]):
        rows.append(r)
        ids += b.column("id").to_pylist()
        for c in columns:
            more[c].append(b.column(c).fill_null(0).to_numpy(zero_copy_only=False))
        if from_text:
            derived.append(from_text(b.column("text").to_pylist()))
    rows = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    extra = {c: np.concatenate(v).astype(np.int64) if v else np.zeros(0, np.int64) for c, v in more.items()}
    if from_text:
        extra["from_text"] = np.concatenate(derived) if derived else None
    emb = read_vectors(embedding, float16=True)[0].take(pa.array(rows))
    if emb.null_count:
        raise ValueError(f"{embedding}: rows kept by the stages before semantic dedup have no embedding")
    flat = emb.flatten().to_numpy(zero_copy_only=False)
    if len(flat) and not np.isfinite(flat).all():
        bad = int(np.flatnonzero(~np.isfinite(flat.reshape(len(emb), -1)).all(axis=1))[0])
        raise ValueError(f"{embedding}: document {ids[bad]!r} has a non-finite embedding (NaN or inf): semantic "
                         "dedup would keep its copies; embed it again with a float32 model")
    return rows, ids, emb, extra


class KMeansSampleSpec(TypedDict):
    """A k-means sample shard (steps/dedup/plan.py `semantic_steps`, steps/classify/clusters.py): one document shard's embeddings."""

    doc: DocShard
    embedding: str  # the embed-<source> attribute file
    seed: int
    rate: float  # the share of the kept documents sampled
    describe: str


@task(version=VERSION)
def sample_shard(spec: KMeansSampleSpec, out) -> dict:
    doc = spec["doc"]
    rows, ids, emb, _ = kept(doc, spec["embedding"])
    keys = sample_keys(spec["seed"], doc["source"], ids)
    bound = int(spec["rate"] * 2**64)  # keys below it: a share `rate` of the documents
    take = np.arange(len(keys)) if bound >= 2**64 else np.flatnonzero(keys < np.uint64(bound))
    atomic.write_table(pa.table({"key": keys[take], "embedding": emb.take(pa.array(take))}), out.path(".parquet"))
    return {"rows": len(rows), "sampled": len(take)}


def kmeans(x: np.ndarray, k: int, seed: int, iterations: int = ITERATIONS) -> np.ndarray:
    """Spherical k-means: centroids are unit means of their members; started from k sample
    rows picked by the seed; an emptied cluster keeps its centroid."""
    rng = np.random.default_rng(seed)
    c = x[np.sort(rng.choice(len(x), size=k, replace=False))].copy()
    for _ in range(iterations):
        assign = nearest(x, c)
        sums = np.zeros_like(c)
        np.add.at(sums, assign, x)
        counts = np.bincount(assign, minlength=k)
        full = counts > 0
        c[full] = unit(sums[full])
    return c


def nearest(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Each row's most similar centroid (the lowest index on a tie), CHUNK rows at a time, in
    float64: a row's products must not depend on which other rows share its chunk (a shard's
    rows do), and float64 keeps a matrix kernel's rounding (~1e-16) far below any real tie."""
    out = np.empty(len(x), np.int64)
    c64 = c.astype(np.float64)
    for lo in range(0, len(x), CHUNK):
        out[lo : lo + CHUNK] = np.argmax(x[lo : lo + CHUNK].astype(np.float64) @ c64.T, axis=1)
    return out


class CentroidsSpec(TypedDict):
    """The k-means step's one shard (steps/dedup/plan.py `centroid_shards`, steps/classify/clusters.py)."""

    samples: str  # the sample step's folder
    shards: int  # its part files
    clusters: int  # k (at most the sampled rows)
    seed: int
    dim: int  # the embeddings' dimension
    describe: str


@task(version=VERSION)
def centroids_shard(spec: CentroidsSpec, out) -> dict:
    paths = [fs.path(spec["samples"]) / f"part-{i:05d}.parquet" for i in range(spec["shards"])]  # not listed in the spec
    tables = list(fs.read_many(fs.read_table, paths)) if paths else []
    t = pa.concat_tables(tables) if tables else None
    final = fs.path(out.dir) / "centroids.npy"
    if t is None or t.num_rows == 0:
        atomic.write_bytes(final, np.zeros((0, spec["dim"]), np.float32).tobytes())
        return {"rows": 0, "clusters": 0, "centroids": str(final), "dim": spec["dim"]}
    t = t.take(pa.compute.sort_indices(t, [("key", "ascending")]))  # hash order: the same for any sharding
    x = vectors(t.column("embedding"))
    k = max(1, min(spec["clusters"], len(x)))
    c = kmeans(x, k, spec["seed"])
    atomic.write_bytes(final, np.ascontiguousarray(c, np.float32).tobytes())
    return {"rows": len(x), "clusters": k, "planned_clusters": spec["clusters"], "centroids": str(final),
            "dim": int(c.shape[1])}


def read_centroids(path: str, dim: int) -> np.ndarray:
    return np.frombuffer(fs.path(path).read_bytes(), np.float32).reshape(-1, dim)
