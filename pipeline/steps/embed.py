"""The embed stage: `embed-<source>`, one embedding attribute per document shard.

Why a step of its own: an embedding is the expensive part of everything that uses one
(semantic dedup, embedding clusters as topics), and it depends
only on the documents after their filters and on the model, so a threshold, a cluster
count or a dedup edit never embeds again. The step's hash holds the backend, its version,
its files' sha256 and `max_tokens`.

`<step>/<source>/part-XXXXX.parquet` has every row of the document shard, in order: `id`
and `embedding`, a fixed-size list of float16 (unit-length vectors: float16 keeps ~3
decimal digits, cosine errors below 1e-3), or with `dtype: int8` of int8 beside
`embedding_scale` (float32, a row's largest |x| / 127: x = embedding x embedding_scale; half
the bytes), null where the source's filters removed the row (every row, removed ones too, when an embedding classifier scores the source: it
reads them instead of embedding again). A task holds one shard's vectors (512 bytes a document with WordLlama's 256
dimensions) and one batch of text (filters/embeddings.py: BATCH_CHARS).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

import numpy as np
import pyarrow as pa

from pipeline.engine.step import Step, shard_name, task
from pipeline.errors import InputError
from pipeline.io import fs
from pipeline.plan.stage import Stage, texts
from pipeline.shards import apply, view

if TYPE_CHECKING:
    from pipeline.plan.context import Context

VERSION = "1"
TEXT_BATCH = 2048  # documents read at a time (the backend batches by characters inside)


class _Vectors:
    """A shard's vectors as the attribute stores them, filled a batch at a time: float16, or
    int8 and a scale a row (quantized from each batch's float32 vectors, as
    `embeddings.as_stored` does, so a head scoring the attribute scores what it trained on)."""

    def __init__(self, n: int, dim: int, dtype: str):
        self.dtype, self.dim = dtype, dim
        self.x = np.zeros((n, dim), np.int8 if dtype == "int8" else np.float16)
        self.scale = np.zeros(n, np.float32) if dtype == "int8" else None

    def put(self, rows: np.ndarray, v: np.ndarray) -> None:
        from filters import embeddings

        if self.scale is None:
            self.x[rows] = v.astype(np.float16)
        else:
            self.x[rows], self.scale[rows] = embeddings.quantize(v)

    def columns(self, seen: np.ndarray) -> dict[str, pa.Array]:
        """`embedding` (and `embedding_scale`), null where not `seen`."""
        col = pa.FixedSizeListArray.from_arrays(pa.array(self.x.reshape(-1)), self.dim, mask=pa.array(~seen))
        if self.scale is None:
            return {"embedding": col}
        return {"embedding": col, "embedding_scale": pa.array(self.scale, pa.float32(), mask=~seen)}


def _every_batch(documents: str, layers: list[str]):
    """(rows, batch) of every row of the shard, with the filters' rewrites: what a classifier
    scores (pipeline/steps/classify/quality.py score_shard scores removed documents too)."""
    pf = fs.parquet_file(documents)
    state = view.Layers(layers, pf.metadata.num_rows, ["text"])
    start = 0
    for batch in pf.iter_batches(batch_size=TEXT_BATCH, columns=["id", "text"]):
        yield np.arange(start, start + batch.num_rows), state.apply(batch, start)
        start += batch.num_rows


class EmbedSpec(TypedDict):
    """An `embed-<source>` shard (embed.py `plan`): one ingest shard after its filters."""

    doc: dict  # source, part, documents and layers (the filter step's alone): not a whole DocShard
    embedding: dict  # model, max_tokens, dim, and dtype when not float16
    every_row: bool  # every row, removed ones too (an embedding classifier scores them)
    describe: str


@task(version=VERSION)
def embed_shard(spec: EmbedSpec, out) -> dict:
    from filters import embeddings

    doc, e = spec["doc"], spec["embedding"]
    n = view.num_rows(doc["documents"])
    dim = e["dim"]
    vecs = _Vectors(n, dim, e.get("dtype", "float16"))
    seen = np.zeros(n, bool)
    nbytes = 0
    batches = _every_batch(doc["documents"], doc["layers"]) if spec.get("every_row") else \
        view.kept_batches(doc["documents"], doc["layers"], ["id", "text"], batch_rows=TEXT_BATCH)
    for rows, batch in batches:
        texts = batch.column("text").to_pylist()
        nbytes += sum(len(t) for t in texts)
        try:
            v = embeddings.embed(e["model"], texts, e["max_tokens"])
        except embeddings.NonFiniteEmbedding as err:  # named by document: k-means and semantic dedup never see one
            ids = batch.column("id").to_pylist() if "id" in batch.schema.names else None
            who = ", ".join(f"{ids[k] if ids else ''} (row {int(rows[k])})" for k in err.rows[:3])
            raise InputError(f"{doc['documents']}: document(s) {who}: {err}") from None
        vecs.put(rows, v)
        seen[rows] = True
    ids = fs.read_table(doc["documents"], columns=["id"]).column("id")
    apply.write_attributes(out.dir, doc, pa.table({"id": ids, **vecs.columns(seen)}))
    return {"rows": int(seen.sum()), "source": doc["source"], "part": doc["part"], "docs": int(seen.sum()),
            "chars": nbytes}


def texts_cut_later(m) -> bool:
    """Whether a layer after the filters rewrites documents' texts (paragraph dedup, a
    decontamination that cuts): then a classifier's text is not the one embed-<source>
    embedded, and it embeds its own."""
    return bool((m.dedup and m.dedup.paragraph) or (m.decontaminate and m.decontaminate.action == "cut"))


def vector_readers(m) -> dict[str, tuple[str, int, str]]:
    """Source -> (model, max_tokens, dtype) of the classifier that scores it (quality or topic) from
    document embeddings (a family with `reads_vectors`: embedding probes, regression heads),
    when it can read embed-<source>'s vectors (no later layer rewrites the texts)."""
    from filters.classifiers import embeddings_of

    if texts_cut_later(m):
        return {}
    out = {}
    for sname, src in m.sources.items():
        for use in (src.quality, src.topic):
            c = m.classifiers.get(use.classifier) if use else None
            for r in embeddings_of(m.classifiers, c) if c is not None else []:
                out.setdefault(sname, r)
    return out


def plan(ctx: Context) -> list[Step]:
    """`embed-<source>` for every source when dedup.semantic reads embeddings, for the
    sources with `topics` (embedding clusters), and for the sources an embedding classifier
    scores with the run's embedding (then every row is embedded, removed ones too, as the
    score step scores them: they read these vectors instead of embedding the texts again;
    not when paragraph dedup or a cutting decontamination rewrites the texts after the filters).
    One model per run (config/checks.py); a classifier on another embedding embeds its texts."""
    from filters import embeddings
    from pipeline.plan import code

    m = ctx.mixture
    sem = m.dedup.semantic if m.dedup else None
    clustered = [s for s, spec in m.sources.items() if spec.topics]
    spec = sem or (m.sources[clustered[0]].topics if clustered else None)
    readers = vector_readers(m)
    ref = (spec.model, spec.max_tokens, spec.dtype) if spec is not None else next(iter(readers.values()), None)
    if ref is None:
        return []
    model, max_tokens, dtype = ref
    scored = {s for s, r in readers.items() if r == ref}
    ident = embeddings.identity(model)
    e = {"model": model, "max_tokens": max_tokens, "dim": ident["dim"], **({"dtype": dtype} if dtype != "float16" else {})}
    named = model if "/" not in model else f"{ident['backend']}:local"  # a folder: by its files (below)
    cls = type(embeddings.backend(embeddings.resolve(model)[0]))
    steps = []
    wanted = list(m.sources) if sem else [s for s in m.sources if s in clustered or s in scored]
    for sname in wanted:
        ing, flt = ctx.ingest[sname], ctx.filter.get(sname)
        every = sname in scored
        cfg = {"embedding": {**e, "model": named, "files": ident["files"]}, "dtype": dtype,
               **({"rows": "all"} if every else {})}  # only then: a run without probes keeps its hashes

        def shards(st, stats, sname=sname, ing=ing, flt=flt, every=every) -> list[EmbedSpec]:  # this source's only: no other waits
            return [{"doc": {"source": sname, "part": i, "documents": str(ing.dir(ctx.store) / f"{shard_name(i)}.parquet"),
                             "layers": [str(flt.dir(ctx.store) / f"{shard_name(i)}.parquet")] if flt else []},
                     "embedding": e, "every_row": every, "describe": f"{sname}/{shard_name(i)}"}
                    for i in sorted(stats[ing.name])]

        step = Step(f"embed-{sname}", "embed", cfg, [ing, flt] if flt else [ing], embed_shard, shards=shards,
                    code=code.code({"embedding": {cls.name: cls.version}}, cls.libraries))
        step.meta["ref"] = ref
        ctx.provide("embeddings", step, sname)
        steps.append(step)
    return steps


STAGE = Stage("embed", plan, tasks=texts("embed"))
