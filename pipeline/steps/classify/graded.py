"""Training a graded classifier (`type: regression`) from an annotations file.

Why apart from tasks.py: a graded classifier learns from `id, score, text` rows a user
brings (FineWeb-Edu's LLM annotations, say), not from the run's sources by class, so its
train step reads one file and has no examples step. The rest is the stage's, as for the
other families: the sample (the `max_examples_per_class` rows with the smallest seeded
hashes of their ids: the same whatever the file's order), every tenth of them by hash held
out, eval.json (the family's Spearman, Pearson and MAE on the held-out rows),
sample.parquet and the model file.

A row without an id, a score or a text, or with a score that is not a number, is an error
naming the file and row: a grade that cannot be read is not silently dropped.
"""

from __future__ import annotations

import math
from typing import TypedDict

import numpy as np
import orjson
import pyarrow as pa

from filters.classifiers import family
from pipeline.errors import InputError
from pipeline.io import fs, readers
from pipeline.io.discover import format_from_name

VALIDATION_EVERY = 10


def read_annotations(path: str) -> list[tuple[str, float, str]]:
    """(id, score, text) of every row of the file, checked."""
    fmt, comp = format_from_name(fs.path(path).name)
    rows: list[tuple[str, object, object]] = []
    if fmt == "parquet":
        t = fs.read_table(path)
        missing = [c for c in ("id", "score", "text") if c not in t.column_names]
        if missing:
            raise InputError(f"{path}: no column {', '.join(missing)}; annotations need id, score and text")
        rows = list(zip(t.column("id").to_pylist(), t.column("score").to_pylist(), t.column("text").to_pylist()))
        where = "row"
    elif fmt == "csv" or path.endswith(".csv"):
        import pyarrow.csv as pcsv

        with fs.path(path).open("rb") as f:
            t = pcsv.read_csv(f, convert_options=pcsv.ConvertOptions(column_types={"id": pa.string(), "text": pa.string()}))
        missing = [c for c in ("id", "score", "text") if c not in t.column_names]
        if missing:
            raise InputError(f"{path}: no column {', '.join(missing)}; annotations need id, score and text")
        rows = list(zip(t.column("id").to_pylist(), t.column("score").to_pylist(), t.column("text").to_pylist()))
        where = "row"
    else:
        if comp is None and path.endswith((".gz", ".zst")):
            comp = "gzip" if path.endswith(".gz") else "zstd"
        for line_no, _, raw in readers.iter_lines(path, comp, {}):
            try:
                r = orjson.loads(raw)
            except orjson.JSONDecodeError as e:
                raise InputError(f"{path}:{line_no}: not JSON ({e}); annotations are one object a line") from None
            rows.append((r.get("id"), r.get("score"), r.get("text")))
        where = "line"
    out = []
    for i, (id_, score, text) in enumerate(rows, 1):
        ok = isinstance(score, (int, float)) and not isinstance(score, bool) and math.isfinite(score)
        if id_ is None or text is None or not ok:
            what = "id" if id_ is None else "text" if text is None else f"score {score!r} (a number)"
            raise InputError(f"{path}:{where} {i}: no {what}; every annotation needs id, a numeric score and text")
        out.append((str(id_), float(score), str(text)))
    if not out:
        raise InputError(f"{path}: no annotations")
    return out


class GradedSpec(TypedDict):
    """The one `classify-<name>-train` shard of a graded classifier (steps/classify/plan.py)."""

    name: str
    params: dict  # the classifier's parameters as JSON
    annotations: str  # the file of graded documents (id, score, text)
    describe: str


def train_graded(spec: GradedSpec, out) -> dict:
    import xxhash

    from pipeline.io import atomic

    p, seed = spec["params"], spec["params"]["seed"]
    fam = family(p["type"])
    rows = read_annotations(spec["annotations"])
    keyed = sorted((xxhash.xxh3_64_intdigest(f"{seed}:{i}"), i, s, t) for i, s, t in rows)[: p["max_examples_per_class"]]
    if len(keyed) < 20:
        raise InputError(f"classifier {spec['name']}: {len(keyed)} annotations in {spec['annotations']}; "
                         f"{fam.title} needs hundreds: add annotated documents")
    split = ["validation" if j % VALIDATION_EVERY == VALIDATION_EVERY - 1 else "train" for j in range(len(keyed))]
    train = [(s, t) for (_, _, s, t), sp in zip(keyed, split) if sp == "train"]
    val = [(s, t) for (_, _, s, t), sp in zip(keyed, split) if sp == "validation"]
    d = fs.path(out.dir)
    model = fam.train(train, p, seed, d / fam.model_file)
    ev = fam.evaluate_graded(model, [t for _, t in val], np.array([s for s, _ in val]))
    ev["examples"] = {"train": len(train), "validation": len(val), "annotations": len(rows)}
    atomic.write_json(d / "eval.json", ev)
    atomic.write_table(pa.table({"origin": [f"annotations:{i}" for _, i, _, _ in keyed], "label": [str(s) for _, _, s, _ in keyed],
                             "split": split, "hash": pa.array([h for h, _, _, _ in keyed], pa.uint64())}),
                   d / "sample.parquet")
    final = d / fam.model_file
    size, sha = atomic.file_digest(final)
    return {"rows": len(keyed), "eval": ev, "model": str(final), "model_bytes": size, "model_sha256": sha}
