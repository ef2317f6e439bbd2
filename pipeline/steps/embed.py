"""The embed stage: `embed-<source>`, one embedding attribute per document shard.

Why a step of its own: an embedding is the expensive part of everything that uses one
(semantic dedup, embedding clusters as topics), and it depends
only on the documents after their filters and on the model, so a threshold, a cluster
count or a dedup edit never embeds again. The step's hash holds the backend, its version,
its files' sha256 and `max_tokens`.

`<step>/<source>/part-XXXXX.parquet` has every row of the document shard, in order: `id`
and `embedding`, a fixed-size list of float16 (unit-length vectors: float16 keeps ~3
decimal digits, cosine errors below 1e-3), null where the source's filters removed the
row. A task holds one shard's vectors (512 bytes a document with WordLlama's 256
dimensions) and one batch of text (filters/embeddings.py: BATCH_CHARS).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from pipeline.engine.step import Step, shard_name, task
from pipeline.io import fs
from pipeline.plan.stage import Stage
from pipeline.shards import apply, view

if TYPE_CHECKING:
    from pipeline.plan.context import Context

VERSION = "1"
TEXT_BATCH = 2048  # documents read at a time (the backend batches by characters inside)


def vectors_type(dim: int) -> pa.DataType:
    return pa.list_(pa.float16(), dim)


@task(version=VERSION)
def embed_shard(spec: dict, out) -> dict:
    from filters import embeddings

    doc, e = spec["doc"], spec["embedding"]
    n = view.num_rows(doc["documents"])
    dim = e["dim"]
    vecs = np.zeros((n, dim), np.float16)
    seen = np.zeros(n, bool)
    nbytes = 0
    for rows, batch in view.kept_batches(doc["documents"], doc["layers"], ["text"], batch_rows=TEXT_BATCH):
        texts = batch.column("text").to_pylist()
        nbytes += sum(len(t) for t in texts)
        vecs[rows] = embeddings.embed(e["model"], texts, e["max_tokens"]).astype(np.float16)
        seen[rows] = True
    ids = fs.read_table(doc["documents"], columns=["id"]).column("id")
    flat = pa.array(vecs.reshape(-1))
    col = pa.FixedSizeListArray.from_arrays(flat, dim, mask=pa.array(~seen))
    apply.write_attributes(out.dir, doc, pa.table({"id": ids, "embedding": col}))
    return {"rows": int(seen.sum()), "source": doc["source"], "part": doc["part"], "docs": int(seen.sum()),
            "chars": nbytes}


def embedding_path(step: Step, store, source: str, part: int) -> str:
    return str(apply.attribute_path(step.dir(store), source, part))


def plan(ctx: Context) -> list[Step]:
    """`embed-<source>` for every source when dedup.semantic reads embeddings, else for the
    sources with `topics` (embedding clusters); one model per run (config/checks.py)."""
    from filters import embeddings
    from pipeline.plan import code

    m = ctx.mixture
    sem = m.dedup.semantic if m.dedup else None
    clustered = [s for s, spec in m.sources.items() if spec.topics]
    spec = sem or (m.sources[clustered[0]].topics if clustered else None)
    if spec is None:
        return []
    ident = embeddings.identity(spec.model)
    e = {"model": spec.model, "max_tokens": spec.max_tokens, "dim": ident["dim"]}
    named = spec.model if "/" not in spec.model else f"{ident['backend']}:local"  # a folder: by its files (below)
    cfg = {"embedding": {**e, "model": named, "files": ident["files"]}, "dtype": "float16"}
    cls = type(embeddings.backend(embeddings.resolve(spec.model)[0]))
    steps = []
    for sname in (list(m.sources) if sem else clustered):
        ing, flt = ctx.ingest[sname], ctx.filter.get(sname)

        def shards(st, stats, sname=sname, ing=ing, flt=flt):  # this source's shards only: no other source waits
            return [{"doc": {"source": sname, "part": i, "documents": str(ing.dir(ctx.store) / f"{shard_name(i)}.parquet"),
                             "layers": [str(flt.dir(ctx.store) / f"{shard_name(i)}.parquet")] if flt else []},
                     "embedding": e, "describe": f"{sname}/{shard_name(i)}"} for i in sorted(stats[ing.name])]

        step = Step(f"embed-{sname}", "embed", cfg, [ing, flt] if flt else [ing], embed_shard, shards=shards,
                    code=code.code({"embedding": {cls.name: cls.version}}, cls.libraries))
        ctx.embed[sname] = step
        steps.append(step)
    return steps


STAGE = Stage("embed", plan)
