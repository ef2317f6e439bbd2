"""Embedding clusters as topics (`sources.<name>.topics: {clusters: K}`): every kept
document of the source gets its nearest of K centroids as its topic, `c0` .. `c<K-1>`, so
weights can name `web/c17` and `web/c17/q5` as they name a classifier's topics.

Why here: a cluster is a topic without labels to train from; everything downstream (cells,
the mix, the report's topic table, explain) reads the same `topic`/`topic_score`
attributes and the same per-(topic, bucket) counts a topic classifier's step writes
(tasks.py `topic_shard`). The steps:

    topics-<source>-sample      per document shard: a seeded hash sample of the kept
                                documents' embeddings (pipeline/shards/kmeans.py)
    topics-<source>-centroids   one task: spherical k-means on it
    topic-<source>              per document shard: nearest centroid, its cosine as
                                topic_score, counts per (cluster, quality bucket), and
                                per cluster the titles (first line, 80 characters) of the
                                shard's three documents with the smallest id hashes, from
                                which the report picks each cluster's three overall

The documents are the source's kept ones after dedup, decontamination and the validation
split, so no held-out or eval document is a cluster's title, and the centroids depend on
the documents and the seed only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

import numpy as np
import pyarrow as pa
import xxhash

from pipeline.engine.step import Step, shard_name, task
from pipeline.io import fs
from pipeline.shards import kmeans, view
from pipeline.plan.code import portable
from pipeline.shards.apply import scatter, stage_stats, write_attributes
from pipeline.shards.documents import DocShard

if TYPE_CHECKING:
    from pipeline.plan.context import Context

VERSION = "1"
TITLES = 3  # per cluster, in the markers and the report
TITLE_CHARS = 80


def title(text: str) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1] + "…"


class ClusterTopicSpec(TypedDict):
    """A `topic-<source>` shard of clusters (this module's plan): a document shard's nearest centroid."""

    doc: DocShard
    embedding: str  # the shard's embed-<source> attribute file
    centroids: str  # the centroids file
    dim: int  # the embedding's dimensions
    describe: str


@task(version=VERSION)
def cluster_topic_shard(spec: ClusterTopicSpec, out) -> dict:
    doc = spec["doc"]
    rows, ids, emb, sizes = kmeans.kept(doc, spec["embedding"], ("n_chars", "n_tokens"))
    n = view.num_rows(doc["documents"])
    c = kmeans.read_centroids(spec["centroids"], spec["dim"])
    if len(rows) and len(c):
        x = kmeans.vectors(emb)
        near = kmeans.nearest(x, c)
        cos = np.einsum("ij,ij->i", x.astype(np.float64), c[near].astype(np.float64)).astype(np.float32)
    else:
        near, cos = np.zeros(len(rows), np.int64), np.zeros(len(rows), np.float32)
    labels = [f"c{k}" for k in near.tolist()]
    chars, toks = sizes["n_chars"], sizes["n_tokens"]
    seen = np.zeros(n, bool)
    seen[rows] = True
    all_ids = fs.read_table(doc["documents"], columns=["id"]).column("id")
    table = pa.table({"id": all_ids, "keep": pa.array(np.where(seen, True, False), pa.bool_(), mask=~seen),
                      "reason": pa.nulls(n, pa.string()),
                      "topic": scatter(n, rows, pa.array(labels, pa.string())),
                      "topic_score": scatter(n, rows, pa.array(np.clip(cos, -1, 1), pa.float32()))})
    write_attributes(out.dir, doc, table)
    buckets = view.shard_buckets(doc)
    bk = buckets[rows] if buckets is not None else np.zeros(len(rows), np.int64)
    groups: dict[tuple, list[int]] = {}
    for t, b, k in zip(labels, bk.tolist(), toks.tolist(), strict=True):
        g = groups.setdefault((t, b), [0, 0])
        g[0] += 1
        g[1] += k
    return {**stage_stats(doc, rows, chars, toks, np.ones(len(rows), bool), {}),
            "groups": [[t, b, v[0], v[1]] for (t, b), v in sorted(groups.items())],
            "titles": _titles(doc, rows, ids, near)}


def _titles(doc: dict, rows: np.ndarray, ids: list[str], near: np.ndarray) -> dict[str, list]:
    """Per cluster, [hash, title] of the shard's TITLES documents with the smallest id hashes."""
    if not len(rows):
        return {}
    h = np.array([xxhash.xxh3_64_intdigest(f"title:{doc['source']}:{i}") for i in ids], np.uint64)
    order = np.lexsort((h, near))
    pick, last, count = [], -1, 0
    for j in order.tolist():
        count = count + 1 if near[j] == last else 1
        last = near[j]
        if count <= TITLES:
            pick.append(j)
    texts = view.read_rows(doc["documents"], doc["layers"], rows[np.sort(np.array(pick))], ["text"]).column("text").to_pylist()
    by_row = dict(zip(np.sort(np.array(pick)).tolist(), texts))
    out: dict[str, list] = {}
    for j in pick:
        out.setdefault(f"c{near[j]}", []).append([int(h[j]), title(by_row[j])])
    return out


def steps(ctx: Context, sname: str, before: list[Step], dedup: list[Step], base: Step) -> list[Step]:
    """The sample, centroids and topic-<source> steps of one source's embedding clusters."""
    from filters import embeddings

    from pipeline.mixing.cells import cluster_labels

    tp = ctx.mixture.sources[sname].topics
    params = portable(tp.model_dump(mode="json"))  # a model folder by its files, not its place
    emb = ctx.provider("embeddings", sname)
    dim = embeddings.identity(tp.model)["dim"]

    def docs(stats):
        after = {sname: before} if before else None
        return [d for d in ctx.doc_shards(stats, dedup, after) if d["source"] == sname]

    def emb_path(d):
        return str(emb.dir(ctx.store) / sname / f"{shard_name(d['part'])}.parquet")

    inputs = [base] + dedup + before + [emb]

    def sample_shards(st, stats):
        ds = docs(stats)
        kept = sum(d["kept"] for d in ds)
        return [{"doc": d, "embedding": emb_path(d), "seed": tp.seed, "rate": tp.sample / max(1, kept),
                 "describe": f"{sname}/{shard_name(d['part'])}"} for d in ds]

    sample = Step(f"topics-{sname}-sample", "topics-sample", {"params": params}, inputs, kmeans.sample_shard,
                  shards=sample_shards)
    cents = Step(f"topics-{sname}-centroids", "topics-centroids", {"params": params}, [sample], kmeans.centroids_shard,
                 shards=lambda st, stats: [{"samples": str(sample.dir(ctx.store)), "shards": len(stats[sample.name]),
                                            "clusters": tp.clusters, "seed": tp.seed, "dim": dim, "describe": "k-means"}])

    def topic_shards(st, stats):
        c = stats[cents.name][0]
        return [{"doc": d, "embedding": emb_path(d), "centroids": c["centroids"], "dim": dim,
                 "describe": f"{sname}/{shard_name(d['part'])}"} for d in docs(stats)]

    topic = Step(f"topic-{sname}", "topic", {"params": params}, inputs + [cents], cluster_topic_shard, shards=topic_shards)
    ctx.topic_labels[sname] = cluster_labels(tp.clusters)
    return [sample, cents, topic]
