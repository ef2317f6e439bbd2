"""Quality classification: train a classifier, score documents, threshold, apply.

    classify-<name>-train       one task: a balanced, seeded sample of the positive and negative
                                sources (after their filters and dedup) or files; 90/10 split;
                                model.bin, sample.parquet (what was trained on), eval.json
    classify-<name>-<source>    per document shard: P(positive) for every row (its current
                                text), plus a tie-break hash of the id
    quality-<source>-threshold  one task: the threshold; for keep_fraction, the exact k-th
                                largest (score, id hash) key among the documents that reached
                                this stage, by a 4-pass radix select streaming the score files
    quality-<source>            per document shard: keep, reason, score -> attributes

The sample is the k documents of each class with the smallest hash(seed, source, id):
the same for any sharding. Thresholds and keep fractions touch only the last two steps.
The model itself (training, scoring, labels, metrics) is the classifier family's, looked
up by the classifier's `type` (filters/classifiers.py); nothing here knows fastText.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

import numpy as np
import pyarrow as pa
import xxhash

from filters.classifiers import family
from pipeline.shards import select
from pipeline.shards.apply import scatter, sizes, stage_stats, write_attributes
from pipeline.errors import InputError
from pipeline.engine.step import task
from pipeline.io import atomic, fs, readers
from pipeline.io.discover import format_from_name
from pipeline.engine.cutoff import Prior, link_prior, prior_rows, prior_table, same_as_before
from pipeline.shards.documents import DocShard
from pipeline.shards import kmeans, readkey, view

VALIDATION_EVERY = 10  # one example in ten, per class, is held out


class ExamplesSpec(TypedDict):
    """A `classify-<name>-examples` shard (steps/classify/plan.py `example_shards`)."""

    doc: DocShard
    seed: int
    tau: int  # the class's sample-hash bound: the documents hashing under it are candidates
    describe: str


class TrainSpec(TypedDict):
    """The one `classify-<name>-train` shard (plan.py `train_shards`; graded.py's for `annotations`)."""

    name: str  # the classifier's name
    params: dict  # its parameters as JSON
    describe: str
    positive: NotRequired[dict]  # a binary classifier's sides: {shards, files, tau, digests}
    negative: NotRequired[dict]
    classes: NotRequired[dict]  # a topic classifier's, label -> the same, in label order
    annotations: NotRequired[str]  # a graded classifier's file (type: regression)


class TopicSpec(TypedDict):
    """A `topic-<source>` shard (plan.py `topic_shards`)."""

    doc: DocShard
    model: str
    type: str  # the classifier family
    options: dict  # fam.options(params)
    vectors: NotRequired[str]  # the embed-<source> attribute, for a family on embeddings
    describe: str


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


def _h(seed: int, *parts) -> int:
    return xxhash.xxh3_64_intdigest(":".join(str(p) for p in (seed, *parts)))


class _BottomK:
    """The k smallest hashes seen, with their payloads; memory O(k + one batch)."""

    def __init__(self, k: int):
        self.k = k
        self.h = np.zeros(0, np.uint64)
        self.payload: list = []

    def add(self, hashes: np.ndarray, payload: list):
        self.h = np.concatenate([self.h, hashes])
        self.payload += payload
        if len(self.h) > 2 * self.k:
            self._prune()

    def _prune(self):
        if len(self.h) > self.k:
            keep = np.argpartition(self.h, self.k - 1)[: self.k]
            self.h = self.h[keep]
            self.payload = [self.payload[i] for i in keep]

    def result(self) -> list[tuple[int, object]]:
        self._prune()
        order = np.argsort(self.h, kind="stable")
        return [(int(self.h[i]), self.payload[i]) for i in order]


def _file_examples(path: str):
    """(line or row, text) of an example file: .txt (a line each), JSONL with `text`, Parquet."""
    import orjson

    fmt, comp = format_from_name(fs.path(path).name)
    if fmt == "parquet":
        row = 0
        for b in fs.parquet_file(path).iter_batches(columns=["text"]):
            for t in b.column("text").to_pylist():
                yield row, t
                row += 1
        return
    if comp is None and path.endswith((".gz", ".zst")):
        comp = "gzip" if path.endswith(".gz") else "zstd"
    for line_no, _, raw in readers.iter_lines(path, comp, {}):
        if fmt == "jsonl":
            yield line_no, orjson.loads(raw)["text"]
        else:
            yield line_no, raw.decode("utf-8", "replace")


def tau(k: int, kept: int) -> int:
    """The hash bound under which a shard offers its documents to a class's sample of k:
    k + 8 sqrt(k) + 64 expected among `kept` documents, so that fewer than k fall under it
    with a chance far below 1e-12 (then training falls back to a full pass, still exact)."""
    if kept <= 0:
        return 2**64 - 1
    return min(2**64 - 1, int((k + 8 * k**0.5 + 64) / kept * 2**64))


def examples_shard(spec: ExamplesSpec, out) -> dict:
    """`classify-<name>-examples`, per document shard of a classifier's sources: the kept
    documents whose sample hash is under the class's bound `tau` (hash, row, id)."""
    d, seed, bound = spec["doc"], spec["seed"], np.uint64(spec["tau"])
    hs, rows, ids, n = [], [], [], 0
    for r, b in view.kept_batches(d["documents"], d["layers"], ["id"]):
        i = b.column("id").to_pylist()
        h = np.array([_h(seed, d["source"], x) for x in i], np.uint64)
        sel = np.flatnonzero(h < bound) if spec["tau"] < 2**64 - 1 else np.arange(len(h))
        hs.append(h[sel])
        rows.append(r[sel])
        ids += [i[j] for j in sel.tolist()]
        n += len(h)
    row = np.concatenate(rows).astype(np.int64) if rows else np.zeros(0, np.int64)
    # the candidates' texts too (a few row groups of this shard, read here in parallel with the other
    # shards): training then reads these small files and never a document shard
    text = view.read_rows(d["documents"], d["layers"], row, ["text"]).column("text") if len(row) else pa.array([], pa.string())
    table = pa.table({"h": np.concatenate(hs) if hs else np.zeros(0, np.uint64), "row": row,
                      "id": pa.array(ids, pa.string()), "text": text})
    atomic.write_table(table, out.path(".parquet"), compression="zstd")
    return {"rows": n, "source": d["source"], "candidates": table.num_rows}


def _scan_all(bk: "_BottomK", d: dict, seed: int) -> None:
    for rows, b in view.kept_batches(d["documents"], d["layers"], ["id"]):
        ids = b.column("id").to_pylist()
        h = np.array([_h(seed, d["source"], i) for i in ids], np.uint64)
        bk.add(h, [(d["documents"], d["layers"], d["source"], int(r), i) for r, i in zip(rows.tolist(), ids, strict=True)])


def _sample(side: dict, k: int, seed: int) -> list[tuple[int, str, str]]:
    """(hash, origin, text) of the k examples of one class with the smallest hashes: the
    shards' candidates under the bound (examples_shard) and the example files; exact, the
    same as a pass over every kept document, which is the fallback if the bound fell short."""

    def gather(full: bool) -> list:
        bk = _BottomK(k)
        with_files = [d for d in side["shards"] if not full and "candidates" in d]
        for d in side["shards"]:
            if full or "candidates" not in d:
                _scan_all(bk, d, seed)
        # one small file per shard: many in flight on an object store (each GET waits tens of ms)
        read = map if not with_files or fs.is_local(fs.path(with_files[0]["candidates"])) else fs.read_many
        for d, t in zip(with_files, read(lambda d: fs.read_table(d["candidates"]), with_files), strict=True):
            if "text" in t.column_names:  # the texts came with the candidates (examples_shard)
                bk.add(t.column("h").to_numpy(), [(None, None, d["source"], i, x) for i, x in
                                                  zip(t.column("id").to_pylist(), t.column("text").to_pylist(), strict=True)])
                continue
            bk.add(t.column("h").to_numpy(), [(d["documents"], d["layers"], d["source"], int(r), i) for r, i in
                                              zip(t.column("row").to_pylist(), t.column("id").to_pylist(), strict=True)])
        for path in side["files"]:
            key = side.get("digests", {}).get(path, path)  # the file's content, not where it lies: the same sample anywhere
            for line, text in _file_examples(path):
                if text:
                    bk.add(np.array([_h(seed, key, line)], np.uint64), [(None, None, path, line, text)])
        return bk.result()

    chosen = gather(False)
    offered = sum(d.get("offered", 0) for d in side["shards"])
    kept = sum(d.get("kept", 0) for d in side["shards"])
    if offered < kept and not (len(chosen) >= k and chosen[-1][0] < side["tau"]):
        chosen = gather(True)  # the bound let fewer than k through: every kept document, as before
    out: dict[int, tuple[int, str, str]] = {}
    by_shard: dict[str, list] = {}
    for pos, (h, (docs, layers, origin, row, x)) in enumerate(chosen):
        if docs is None:
            out[pos] = (h, f"{origin}:{row}", x)
        else:
            by_shard.setdefault(docs, []).append((pos, h, layers, origin, row, x))
    for docs, items in by_shard.items():
        rows = np.array(sorted(r for *_, r, _ in items))
        t = view.read_rows(docs, items[0][2], rows, ["id", "text"])
        text_of = dict(zip(rows.tolist(), t.column("text").to_pylist(), strict=True))
        for pos, h, _, origin, row, x in items:
            out[pos] = (h, f"{origin}:{x}", text_of[row])
    return [out[i] for i in range(len(chosen))]


@task(version="4")  # 2: samples from the examples step's candidates; 3: example files by content, not path; 4: their texts
def train_shard(spec: TrainSpec, out) -> dict:
    if "annotations" in spec:  # a graded classifier (type: regression)
        from pipeline.steps.classify.graded import train_graded

        return train_graded(spec, out)
    if "classes" in spec:
        return _train_topics(spec, out)
    p, seed = spec["params"], spec["params"]["seed"]
    fam = family(p["type"])
    cap = p["max_examples_per_class"]
    pos = _sample(spec["positive"], cap, seed)
    neg = _sample(spec["negative"], cap, seed)
    k = min(len(pos), len(neg))
    if k < 20:
        raise InputError(
            f"classifier {spec['name']}: only {len(pos)} positive and {len(neg)} negative examples reach training "
            f"(after their sources' filters and dedup); {fam.title} needs thousands of documents per class: check "
            f"classifiers.{spec['name']}.positive and .negative, and what the run's ledger.json says those sources' "
            "filters removed, or add example files")
    label = p["label"]
    d = fs.path(out.dir)
    rows = _labelled([(label, pos[:k]), (fam.negative_label, neg[:k])])
    model = _fit(fam, rows, p, seed, d)
    val = [r for r in rows if r[4] == "validation"]
    ev = fam.evaluate(model, [r[3] for r in val], np.array([r[1] == label for r in val]), label, fam.options(p))
    ev["examples"] = {"train": {"positive": sum(1 for r in rows if r[4] == "train" and r[1] == label),
                                "negative": sum(1 for r in rows if r[4] == "train" and r[1] != label)},
                      "validation": {"positive": ev["positives"], "negative": ev["negatives"]},
                      "available_capped": {"positive": len(pos), "negative": len(neg)}}
    return _finish(fam, rows, ev, d)


def _labelled(sides: list[tuple[str, list]]) -> list[tuple]:
    """(hash, label, origin, text, split) of every example, every tenth of each label held
    out, in a seeded interleaving of the labels (by example hash)."""
    rows = []
    for lab, side in sides:
        for j, (h, origin, text) in enumerate(side):
            rows.append((h, lab, origin, text, "validation" if j % VALIDATION_EVERY == VALIDATION_EVERY - 1 else "train"))
    rows.sort(key=lambda r: (r[0], r[1]))
    return rows


def _fit(fam, rows: list, p: dict, seed: int, d):
    """The family's model trained on the rows' train split, in their order, saved in d."""
    return fam.train([(r[1], r[3]) for r in rows if r[4] == "train"], p, seed, d / fam.model_file)


def _finish(fam, rows: list, ev: dict, d) -> dict:
    """eval.json, sample.parquet (every example's origin, label and split), and the marker."""
    atomic.write_json(d / "eval.json", ev)
    atomic.write_table(pa.table({"origin": [r[2] for r in rows], "label": [r[1] for r in rows], "split": [r[4] for r in rows],
                             "hash": pa.array([r[0] for r in rows], pa.uint64())}), d / "sample.parquet")
    final = d / fam.model_file
    size, sha = atomic.file_digest(final)
    return {"rows": len(rows), "eval": ev, "model": str(final), "model_bytes": size, "model_sha256": sha}


def _train_topics(spec: TrainSpec, out) -> dict:
    """A multi-class (topic) classifier: the same seeded sample per label as the binary
    one, up to max_examples_per_class each (not balanced: a topic with few examples keeps
    the others' data); eval.json gives per-label precision and recall of the top label on
    the held-out tenth of each label."""
    p, seed = spec["params"], spec["params"]["seed"]
    fam = family(p["type"])
    cap = p["max_examples_per_class"]
    got = {lab: _sample(side, cap, seed) for lab, side in spec["classes"].items()}
    if min(len(v) for v in got.values()) < 20:
        raise InputError(
            f"classifier {spec['name']}: only " + ", ".join(f"{len(v)} {lab}" for lab, v in got.items()) + " examples reach "
            f"training (after their sources' filters and dedup); {fam.title} needs hundreds per label: check "
            f"classifiers.{spec['name']}.labels and what ledger.json says those sources' filters removed, or add example files")
    d = fs.path(out.dir)
    topic_of = {fam.class_label(lab): lab for lab in got}
    rows = _labelled([(fam.class_label(lab), side) for lab, side in got.items()])
    model = _fit(fam, rows, p, seed, d)
    val = [r for r in rows if r[4] == "validation"]
    ev = fam.evaluate_topics(model, [r[3] for r in val], [topic_of[r[1]] for r in val], list(got), fam.options(p))
    ev["examples"] = {split: {lab: sum(1 for r in rows if r[1] == tag and r[4] == split) for tag, lab in topic_of.items()}
                      for split in ("train", "validation")}
    return _finish(fam, rows, ev, d)


def topic_shard(spec: TopicSpec, out) -> dict:
    """`topic-<source>`, per document shard: the top label and its probability for every
    kept row (null elsewhere; it removes nothing), and the kept documents and tokens per
    (topic, quality bucket) for the mixture's cells."""

    doc = spec["doc"]
    fam = family(spec["type"])
    model, options = fam.load(spec["model"]), spec["options"]  # what changes a score (the plan's fam.options)
    n = view.num_rows(doc["documents"])
    buckets = view.shard_buckets(doc)
    rows, labels, probs, toks, chars = [], [], [], [], []
    vectors = stored_vectors(spec["vectors"]) if spec.get("vectors") else None  # embedded once, by embed-<source>
    cols = ["n_tokens", "n_chars"] + ([] if vectors is not None else ["text"])
    for r, b in view.kept_batches(doc["documents"], doc["layers"], cols):
        lab, pr = fam.predict_vectors(model, vectors[r], options) if vectors is not None else \
            fam.predict(model, b.column("text").to_pylist(), options)
        rows.append(r)
        labels += lab
        probs.append(pr)
        toks.append(b.column("n_tokens").fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64))
        chars.append(b.column("n_chars").to_numpy(zero_copy_only=False).astype(np.int64))
    rows = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    probs = np.concatenate(probs) if probs else np.zeros(0, np.float32)
    tok = np.concatenate(toks) if toks else np.zeros(0, np.int64)
    chars = np.concatenate(chars) if chars else np.zeros(0, np.int64)
    ids = fs.read_table(doc["documents"], columns=["id"]).column("id")
    seen = np.zeros(n, bool)
    seen[rows] = True
    table = pa.table({"id": ids, "keep": pa.array(np.where(seen, True, False), pa.bool_(), mask=~seen),
                      "reason": pa.nulls(n, pa.string()),
                      "topic": scatter(n, rows, pa.array(labels, pa.string())),
                      "topic_score": scatter(n, rows, pa.array(probs, pa.float32()))})
    write_attributes(out.dir, doc, table)
    groups: dict[tuple, list[int]] = {}
    bk = buckets[rows] if buckets is not None else np.zeros(len(rows), np.int64)
    for t, b, k in zip(labels, bk.tolist(), tok.tolist(), strict=True):
        g = groups.setdefault((t, b), [0, 0])
        g[0] += 1
        g[1] += k
    return {**stage_stats(doc, rows, chars, tok, np.ones(len(rows), bool), {}),
            "groups": [[t, b, v[0], v[1]] for (t, b), v in sorted(groups.items())]}


# ---------------------------------------------------------------- scoring


def _tie(ids: list[str]) -> np.ndarray:
    return np.array([xxhash.xxh32_intdigest(i) for i in ids], np.uint32)


def stored_vectors(path: str, rows: np.ndarray | None = None) -> np.ndarray:
    """The `embed-<source>` attribute's vectors of a document shard (all rows, or `rows`), as
    stored (float16: the families cast a batch at a time, so a task never holds the shard's
    vectors twice; int8 attributes scaled back to float32, as the heads were trained on them); an error naming the file when one of them was not embedded."""
    col, x = kmeans.read_vectors(path)  # float16 as stored, or int8 scaled back to float32
    missing = col.is_null().to_numpy(zero_copy_only=False)
    if rows is not None:
        x, missing = x[rows], missing[rows]
    if missing.any():
        raise ValueError(f"{path}: {int(missing.sum())} of the rows to score have no embedding (the embed step "
                         "embedded other rows); run again after removing that step's folder")
    return x


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


@task(version="3")  # 3: text_key, and the rows of an earlier shard whose texts are the same reused (2: keys/)
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
            tk = np.fromiter((xxhash.xxh3_64_intdigest(t or "") for t in tx), np.uint64, len(tx))
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
        cols["text_key"] = np.concatenate(parts_k) if parts_k else np.zeros(0, np.uint64)
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
    from pipeline.steps.dedup.rounds import fan_out

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
