"""Quality classification, its training: the examples a classifier learns from and the model.

    classify-<name>-examples    per document shard: the candidates of each class (a bottom-k
                                sample by hash(seed, source, id))
    classify-<name>-train       one task: a balanced, seeded sample of the positive and negative
                                sources (after their filters and dedup) or files; 90/10 split;
                                model.bin, sample.parquet (what was trained on), eval.json

The sample is the k documents of each class with the smallest hash(seed, source, id):
the same for any sharding. Scoring, thresholds and their application, which thresholds and
keep fractions touch alone: steps/classify/quality.py. The model itself (training, scoring,
labels, metrics) is the classifier family's, looked up by the classifier's `type`
(filters/classifiers.py); nothing here knows fastText."""

from __future__ import annotations

from typing import NotRequired, TypedDict

import numpy as np
import pyarrow as pa
import xxhash

from filters.classifiers import family
from pipeline.shards.apply import scatter, stage_stats, write_attributes
from pipeline.errors import InputError
from pipeline.engine.step import task
from pipeline.io import atomic, fs, readers
from pipeline.io.discover import format_from_name
from pipeline.shards.documents import DocShard
from pipeline.shards import kmeans, view

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
