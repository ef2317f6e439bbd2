"""Quality scores, thresholds and their application: the per-shard scoring of a source by a
classifier, the source's threshold, and each shard's keep decision and quality bucket.

    classify-<name>-<source>    per document shard: P(positive) for every row (its current
                                text), plus a tie-break hash of the id
    quality-<source>-threshold  one task: the threshold; for keep_fraction, the exact k-th
                                largest (score, id hash) key among the documents that reached
                                this stage, merged from the score shards' key files
                                (pipeline/shards/select.py; past engine.select_group files, a tree)
    quality-<source>            per document shard: keep, reason, score -> attributes

Training and the examples it learns from: steps/classify/tasks.py.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

import numpy as np
import pyarrow as pa
import xxhash

from filters.classifiers import family
from pipeline.engine.cutoff import Prior, key_array, link_prior, prior_rows, prior_table, same_as_before, text_keys
from pipeline.engine.step import task
from pipeline.io import atomic, fs
from pipeline.shards import readkey, select, view
from pipeline.shards.apply import scatter, sizes, stage_stats, write_attributes
from pipeline.shards.documents import DocShard
from pipeline.steps.classify.tasks import stored_vectors


class ThresholdSpec(TypedDict):
    """The one `quality-<source>-threshold` shard (plan.py)."""

    keys: str  # the scoring step's keys/ folder (kept rows' keys, complemented)
    shards: int  # how many score shards wrote keys
    min_score: float | None
    keep_fraction: float | None
    buckets: int | None
    max_score: float | None
    describe: str


class QualityApplySpec(TypedDict):
    """A `quality-<source>` shard (plan.py): a document shard's scores against the threshold."""

    doc: DocShard
    scores: str  # its score file
    threshold: float | None
    key: int | str | None  # the threshold's exact key (score, tie) for keep_fraction
    bucket_keys: list | None
    edges: list | None
    n_buckets: int
    max_score: float | None
    describe: str


def _tie(ids: list[str]) -> np.ndarray:
    return np.array([xxhash.xxh32_intdigest(i) for i in ids], np.uint32)


class ScoreSpec(TypedDict):
    """A scoring shard (steps/classify/plan.py): one document shard, the model and what changes a score."""

    doc: DocShard
    model: str  # the model file (trained in the run, or pinned with `model:`)
    type: str  # the classifier family
    label: str  # the positive label
    options: dict  # fam.options(params)
    vectors: NotRequired[str]  # the embed-<source> attribute, for a family on embeddings
    vectors_ref: NotRequired[list]
    describe: str
    prior: NotRequired[Prior]  # from the executor: the earlier shard of the same partial key


@task(version="4")  # 4: 128-bit text keys; 3: text_key, and the rows of an earlier shard whose texts are the same reused (2: keys/)
def score_shard(spec: ScoreSpec, out) -> dict:
    doc = spec["doc"]
    rk, state = readkey.shard(doc, ("text",))  # the keep mask and texts: not a dedup's cluster columns
    if (st := same_as_before(spec, out, rk)) is not None:
        return st
    same = readkey.texts(state)  # the texts alone: every row is scored, kept or not
    if not spec.get("vectors") and (st := _same_texts(spec, out, same, state)) is not None:
        return {**st, "read_key": rk}
    fam = family(spec["type"])
    model, options = fam.load(spec["model"]), spec["options"]  # what changes a score (the plan's fam.options)
    pf = fs.parquet_file(doc["documents"])
    vectors = stored_vectors(spec["vectors"]) if spec.get("vectors") else None  # embedded once, by embed-<source>
    texts = vectors is None or fam.mixed_inputs  # an ensemble's other members read the texts
    # the earlier shard's scores by text (a score is a function of the text alone for such a family)
    before = prior_rows(spec, ["text_key", "score"]) if vectors is None and fam.scores_alone else None
    old_scores = before.table.column("score").to_numpy() if before is not None else None
    parts_s, parts_t, parts_k, ids = [], [], [], []
    start, reused = 0, 0
    for batch in pf.iter_batches(batch_size=view.BATCH_ROWS, columns=["id", "text"] if texts else ["id"]):
        batch = state.apply(batch, start)
        if vectors is not None and fam.mixed_inputs:
            parts_s.append(fam.score_mixed(model, batch.column("text").to_pylist(), vectors[start:start + batch.num_rows],
                                           tuple(spec["vectors_ref"]), spec["label"], options))
        elif vectors is not None:
            parts_s.append(fam.score_vectors(model, vectors[start:start + batch.num_rows], spec["label"], options))
        else:
            tx = batch.column("text").to_pylist()
            tk = text_keys(tx)
            parts_k.append(tk)
            at = before.find(tk) if before is not None else np.full(len(tk), -1)
            sc = np.zeros(len(tx), np.float32)
            sc[at >= 0] = old_scores[at[at >= 0]] if old_scores is not None else 0
            miss = np.flatnonzero(at < 0)
            if len(miss):
                sc[miss] = fam.score(model, [tx[j] for j in miss.tolist()], spec["label"], options)
            reused += len(tx) - len(miss)
            parts_s.append(sc)
        start += batch.num_rows
        i = batch.column("id").to_pylist()
        parts_t.append(_tie(i))
        ids += i
    cols = {"id": pa.array(ids, pa.string()),
            "score": np.concatenate(parts_s) if parts_s else np.zeros(0, np.float32),
            "tie": np.concatenate(parts_t) if parts_t else np.zeros(0, np.uint32)}
    if vectors is None:  # what the next variant's shard looks its texts' scores up by
        cols["text_key"] = key_array(np.concatenate(parts_k) if parts_k else np.zeros((0, 2), np.uint64))
    table = pa.table(cols)
    final = out.path(".parquet")
    atomic.write_table(table, final, compression="zstd")
    # the keys of the rows still kept, complemented (smallest = best), for the threshold's merge
    keys = score_keys(table.column("score").to_numpy(), table.column("tie").to_numpy())[state.keep]
    select.write_keys(out.path(".parquet", "keys"), ~keys, np.ones(len(keys), np.int64))
    return {"rows": table.num_rows, "kept": len(keys), "read_key": rk, "scored_before": reused, "texts_key": same}


def _same_texts(spec: dict, out, tk: str, state) -> dict | None:
    """Only the keep mask moved since the earlier shard of the same partial key (the same
    documents, the same texts in every row): its scores file is this one's, byte for byte
    (every row is scored, kept or not), so it is linked, no text is read, and only the
    threshold's key file is written again from the rows now kept. None: compute."""
    h = spec.get("prior")
    if not isinstance(h, dict) or h["stats"].get("texts_key") != tk:
        return None
    table = prior_table(spec, ["score", "tie"])
    if table is None or table.num_rows != len(state.keep):
        return None
    if not link_prior(spec, out, lambda rel: rel.endswith(".parquet") and not rel.startswith("keys/")):
        return None
    keys = score_keys(table.column("score").to_numpy(), table.column("tie").to_numpy())[state.keep]
    select.write_keys(out.path(".parquet", "keys"), ~keys, np.ones(len(keys), np.int64))
    return {"rows": table.num_rows, "kept": len(keys), "scored_before": table.num_rows, "texts_key": tk,
            "scores_linked": True}


# ---------------------------------------------------------------- threshold


def threshold_shard(spec: ThresholdSpec, out) -> dict:
    """The threshold of a source: min_score as given, or the exact keep_fraction cutoff
    merged from the score tasks' key files (pipeline/shards/select.py: no pass over the source);
    with `buckets`, the exact quantile edges too (same merge, one footer read)."""
    from pipeline.steps.rounds import fan_out

    paths = select.KeySet((f"{spec['keys']}/part-{j:05d}.parquet" for j in range(spec["shards"])),  # footers read once
                          fan_out, spec.get("select_group", select.GROUP))
    n, _ = select.totals(paths)
    buckets = spec.get("buckets")
    res = {"rows": n, "docs_in": n, "bucket_keys": bucket_keys(paths, n, buckets) if buckets else None,
           "max_score": spec.get("max_score")}
    if spec["min_score"] is not None:
        return {**res, "kind": "min_score", "threshold": spec["min_score"], "key": None, "select_tasks": paths.tasks}
    if spec["keep_fraction"] is None:
        return {**res, "kind": "none", "threshold": 0.0, "key": None, "select_tasks": paths.tasks}
    k = round(spec["keep_fraction"] * n)
    if k == 0:
        return {**res, "kind": "keep_fraction", "k": 0, "threshold": 1.0, "key": str(2**64 - 1), "select_tasks": paths.tasks}
    c, _, _ = select.cutoff(paths, k)  # the k-th smallest complement: the k-th largest key
    key = (2**64 - 1) ^ c
    score = float(np.array([key >> 32], np.uint32).view(np.float32)[0])
    return {**res, "kind": "keep_fraction", "k": k, "threshold": score, "key": str(key), "select_tasks": paths.tasks}


def bucket_keys(paths: list, n: int, buckets: int) -> list[str]:
    """The smallest key of buckets 2..N: bucket b holds ascending ranks
    [ceil((b-1)n/N), ceil(bn/N)), so the top n - ceil((b-1)n/N) keys are in b or above."""
    wants = [n - -(-(b - 1) * n // buckets) for b in range(2, buckets + 1)]
    if n == 0:
        return [str(2**64 - 1)] * len(wants)
    got = select.cutoffs(paths, [max(w, 1) for w in wants])
    return [str((2**64 - 1) ^ c) if w > 0 else str(2**64 - 1) for w, (c, _, _) in zip(wants, got, strict=True)]


def bucket_of(keys: np.ndarray, scores: np.ndarray, spec: dict) -> np.ndarray | None:
    """Each row's bucket (1..N): by quantile edges on keys, or by score edges."""
    if spec.get("bucket_keys"):
        lows = np.array([int(k) for k in spec["bucket_keys"]], np.uint64)
        return (1 + np.searchsorted(lows, keys, side="right")).astype(np.int16)
    if spec.get("edges"):
        return (1 + np.searchsorted(np.array(spec["edges"], np.float32), scores.astype(np.float32), side="right")).astype(np.int16)
    return None


def score_keys(scores: np.ndarray, tie: np.ndarray) -> np.ndarray:
    """(score bits << 32 | tie): larger is better, no two documents alike (bar a 32-bit tie)."""
    bits = scores.astype(np.float32).view(np.uint32).astype(np.uint64)
    return (bits << np.uint64(32)) | tie.astype(np.uint64)


# ---------------------------------------------------------------- apply


HIST_BINS = 20  # the report's score histogram


def score_histogram(scores: np.ndarray) -> np.ndarray:
    """Counts of scores in HIST_BINS equal bins of [0, 1] (the quality task's marker; the
    report sums them)."""
    return np.histogram(scores, bins=HIST_BINS, range=(0.0, 1.0))[0]


def apply_shard(spec: QualityApplySpec, out) -> dict:
    doc = spec["doc"]
    t = fs.read_table(spec["scores"], columns=["id", "score", "tie"])
    n = t.num_rows
    rows, chars, toks = sizes(doc)
    seen = np.zeros(n, bool)
    seen[rows] = True
    score = t.column("score").to_numpy()
    key = score_keys(score, t.column("tie").to_numpy())
    thr = spec["threshold"]
    if spec["key"] is not None:
        passed = key >= np.uint64(int(spec["key"]))
    else:
        passed = score >= thr
    high = np.zeros(n, bool) if spec.get("max_score") is None else score > np.float32(spec["max_score"])
    keep = seen & passed & ~high
    drop = np.flatnonzero(seen & ~keep)
    label = f"quality_below:{thr:.4g}"
    above = f"quality_above:{spec['max_score']:.4g}" if spec.get("max_score") is not None else None
    why = [above if high[i] else label for i in drop]  # above the max (a safety classifier) first
    reasons = pa.array([f"{w} (score={score[i]:.4g})" for w, i in zip(why, drop, strict=True)], pa.string())
    cols = {"id": t.column("id"), "keep": pa.array(np.where(seen, keep, False), pa.bool_(), mask=~seen),
            "reason": scatter(n, drop, reasons) if len(drop) else pa.nulls(n, pa.string()),
            "score": t.column("score")}
    bucket = bucket_of(key, score, spec)
    extra = {}
    if bucket is not None:
        cols["bucket"] = pa.array(bucket, pa.int16(), mask=~seen)
        nb = spec["n_buckets"]
        kb = bucket[rows][keep[rows]].astype(np.int64) - 1  # the kept rows' buckets (0-based)
        extra = {"bucket_docs": np.bincount(kb, minlength=nb).tolist(),
                 "bucket_tokens": np.bincount(kb, weights=toks[keep[rows]], minlength=nb).astype(np.int64).tolist(),
                 "bucket_seen": np.bincount(bucket[rows].astype(np.int64) - 1, minlength=nb).tolist()}
    write_attributes(out.dir, doc, pa.table(cols))
    counts: dict[str, int] = {}
    for w in why:
        counts[w] = counts.get(w, 0) + 1
    return {**stage_stats(doc, rows, chars, toks, keep[rows], counts),
            "score_histogram": score_histogram(score[seen]).tolist(), **extra}
