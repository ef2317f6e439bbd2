"""Held-out validation sets: `mixture.validation` and eval sources, written to validation/.

A share of every train source is held out after dedup and decontamination, so that no
training document is an exact or near copy of a validation document, and before the
quality classifiers and the mixture, so that nothing trains on it. The choice is a seeded
hash of each document's id, exact over the whole source without a task that reads it
(pipeline/shards/select.py): `validation-keys` writes each document shard's sorted keys (weight 1,
or its tokens with `tokens:`), `validation-select` finds each source's cutoff, and
`validation`, once per document shard, is an attribute layer (`keep` false, reason
`held_out`) that also writes the held-out documents to `docs/<source>/part-XXXXX.parquet`.
Every document of an eval source is written there too (reason `eval_source`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, NotRequired, TypedDict

import numpy as np
import pyarrow as pa
import xxhash

from pipeline.shards import select
from pipeline.shards import apply
from pipeline.engine.step import Step, shard_name
from pipeline.io import atomic, fs
from pipeline.shards import view
from pipeline.shards.documents import DocShard, LayerMarker
from pipeline.plan.stage import Stage, texts

if TYPE_CHECKING:  # a worker does not load the config models
    from pipeline.plan.context import Context

COLUMNS = ["id", "text", "source", "source_id", "metadata", "n_chars", "n_tokens"]


def keys(seed: int, source: str, ids: list[str]) -> np.ndarray:
    return np.array([xxhash.xxh3_64_intdigest(f"validation:{seed}:{source}:{i}") for i in ids], np.uint64)


class KeysSpec(TypedDict):
    """A `validation-keys` shard (validation.py `plan`): one document shard of a train source."""

    doc: DocShard
    seed: int
    by: str  # tokens or docs: each key's weight
    describe: str


def keys_shard(spec: KeysSpec, out) -> dict:
    """`validation-keys`, per document shard of a train source: every kept document's key and weight."""
    d = spec["doc"]
    ks, ws = [], []
    for _, b in view.kept_batches(d["documents"], d["layers"], ["id", "n_tokens"]):
        ks.append(keys(spec["seed"], d["source"], b.column("id").to_pylist()))
        ws.append(b.column("n_tokens").fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
                  if spec["by"] == "tokens" else np.ones(b.num_rows, np.int64))
    k = np.concatenate(ks) if ks else np.zeros(0, np.uint64)
    w = np.concatenate(ws) if ws else np.zeros(0, np.int64)
    select.write_keys(out.path(".parquet"), k, w)
    return {"rows": len(k), "source": d["source"], "weight": int(w.sum())}


class HoldSpec(TypedDict):
    """The `validation-select` step's one shard (validation.py `select_shards`)."""

    keys: dict[str, dict]  # per train source, its key files (shards/select.py key_files)
    fraction: float | None  # the share held out, else ...
    tokens: int | None  # ... the tokens held out
    describe: str


def select_shard(spec: HoldSpec, out) -> dict:
    """`validation-select`: per train source, the largest key held out (exact: the smallest
    key whose cumulative weight reaches the share)."""
    res: dict[str, dict] = {}
    for source, paths in spec["keys"].items():
        paths = select.KeySet(paths)  # footers read once for both questions
        n, total = select.totals(paths)  # documents, and their weight (documents again, or tokens)
        want = round(spec["fraction"] * n) if spec["fraction"] is not None else min(spec["tokens"] or 0, total)
        if want <= 0:
            res[source] = {"cutoff": None, "docs": 0, "weight": 0, "available": total}
            continue
        c, docs, w = select.cutoff(paths, want)
        res[source] = {"cutoff": str(c), "docs": docs, "weight": w, "available": total, "want": want}
    return {"rows": sum(v["docs"] for v in res.values()), "sources": res}


class HeldOutSpec(TypedDict):
    """A `validation` shard (validation.py `apply_shards`): one document shard and its source's cutoff."""

    doc: DocShard
    seed: int
    role: str  # the source's role: train (held out below the cutoff), eval (all), reference (none)
    cutoff: str | None  # the largest key held out (None: none of a train source)
    describe: str


class HeldFile(TypedDict):
    """The held-out documents of one document shard: `docs/<file>`, with its counts and digest."""

    file: str
    rows: int
    bytes: int
    sha256: str
    tokens: int


class ValidationMarker(LayerMarker):
    """A `validation` shard's marker: a layer's, and the file of what it held out, if any."""

    held: NotRequired[HeldFile]


def apply_shard(spec: HeldOutSpec, out) -> ValidationMarker:
    """`validation`, per document shard: the held-out rows leave training and are written out."""
    d = spec["doc"]
    total = view.num_rows(d["documents"])
    rows, chars, toks = apply.sizes(d)
    keep = np.zeros(total, bool)
    keep[rows] = True
    seen = keep.copy()
    reason = [None] * total
    held, why = [], "held_out" if spec["role"] == "train" else "eval_source"
    holds = spec["role"] == "eval" or (spec["role"] == "train" and spec["cutoff"] is not None)
    for r, b in view.kept_batches(d["documents"], d["layers"], COLUMNS) if holds else []:  # reference sources pass
        if spec["role"] == "train":
            sel = keys(spec["seed"], d["source"], b.column("id").to_pylist()) <= np.uint64(int(spec["cutoff"]))
        else:
            sel = np.ones(b.num_rows, bool)
        if sel.any():
            keep[r[sel]] = False
            for i in r[sel].tolist():
                reason[i] = why
            held.append(b.filter(pa.array(sel)))
    ids = fs.read_table(d["documents"], columns=["id"]).column("id")
    apply.write_attributes(out.dir, d, pa.table({"id": ids, "keep": pa.array(np.where(seen, keep, False), pa.bool_(), mask=~seen),
                                                 "reason": pa.array(reason, pa.string())}))
    n_held = sum(b.num_rows for b in held)
    st: ValidationMarker = {**apply.stage_stats(d, rows, chars, toks, keep[rows], {why: n_held} if n_held else {})}
    if held:
        t = pa.Table.from_batches(held)
        path = fs.path(out.dir) / "docs" / d["source"] / f"part-{d['part']:05d}.parquet"
        fs.makedirs(path.parent)
        atomic.write_table(t, path, compression="zstd")
        n, sha = atomic.file_digest(path)
        st["held"] = {"file": f"{d['source']}/part-{d['part']:05d}.parquet", "rows": t.num_rows, "bytes": n, "sha256": sha,
                      "tokens": int(pa.compute.sum(t.column("n_tokens")).as_py() or 0)}
    return st


def plan(ctx: Context) -> list[Step]:
    """Keys per document shard of the train sources, one select, then a layer per document
    shard. Present when `mixture.validation` is set or a source has role: eval."""
    m = ctx.mixture
    v = m.mixture.validation
    evals = [s for s, spec in m.sources.items() if spec.role == "eval"]
    if v is None and not evals:
        return []
    base, layers = ctx.base(), ctx.layers
    train = [s for s, spec in m.sources.items() if spec.role == "train"] if v is not None else []
    prev = list(layers)
    by = "tokens" if v is not None and v.tokens is not None else "docs"
    cfg = {"seed": m.seed, "fraction": v.fraction if v else None, "tokens": v.tokens if v else None, "train": train, "eval": evals}

    def train_docs(stats):
        return (d for d in ctx.doc_shards(stats, prev) if d["source"] in train)

    def key_shards(st, stats) -> Iterator[KeysSpec]:
        return ({"doc": d, "seed": m.seed, "by": by, "describe": f"{d['source']}/{shard_name(d['part'])}"}
                for d in train_docs(stats))

    ks = Step("validation-keys", "validation-keys", cfg, base + prev, keys_shard, shards=key_shards, position_free=True)

    def select_shards(st, stats) -> list[HoldSpec]:  # each source's key files as a folder and a range, not a path a shard
        span = ctx.source_spans(stats, train)
        paths = {s: select.key_files(str(ks.dir(ctx.store)), *span[s]) for s in train}
        return [{"keys": paths, "fraction": v.fraction if v else None, "tokens": v.tokens if v else None,
                 "describe": "validation selection"}]

    sel = Step("validation-select", "validation-select", cfg, [ks], select_shard, shards=select_shards)

    def apply_shards(st, stats) -> Iterator[HeldOutSpec]:
        cut = stats[sel.name][0]["sources"]
        return ({"doc": d, "seed": m.seed, "role": m.sources[d["source"]].role,
                 "cutoff": (cut.get(d["source"]) or {}).get("cutoff"), "describe": f"{d['source']}/{shard_name(d['part'])}"}
                for d in ctx.doc_shards(stats, prev))  # a layer has a file for every document shard

    ap = Step("validation", "validation", cfg, base + prev + [sel], apply_shard,
              shards=apply_shards, position_free=True)
    ctx.add_layer(ap, "validation")
    return [ks, sel, ap]


def publish(ctx: Context, stats: dict) -> dict:
    """validation/<source>/part-XXXXX.parquet: the held-out documents (links or copies of the
    validation step's files), listed per source with rows, tokens and sha256 in the manifest."""
    step = ctx.step("validation")
    if step is None:
        return {}
    sel = stats["validation-select"][0]["sources"]
    pairs, out = [], {}
    for m in sorted(stats[step.name].values(), key=lambda m: (m["source"], m["part"])):
        h = m.get("held")
        e = out.setdefault(m["source"], {"role": ctx.mixture.sources[m["source"]].role, "docs": 0, "tokens": 0, "files": []})
        if h:
            pairs.append((step.dir(ctx.store) / "docs" / h["file"], h["file"]))
            e["docs"] += h["rows"]
            e["tokens"] += h["tokens"]
            e["files"].append({"path": f"validation/{h['file']}", "rows": h["rows"], "tokens": h["tokens"],
                               "bytes": h["bytes"], "sha256": h["sha256"]})
    for s_, v in sel.items():
        out.setdefault(s_, {"role": "train", "docs": 0, "tokens": 0, "files": []})["available"] = v["available"]
    atomic.link_tree(pairs, ctx.run_dir / "validation")
    return {"validation": {s_: e for s_, e in out.items() if e["role"] == "eval" or s_ in sel}}  # what validation/ holds


STAGE = Stage("validation", plan, publish=publish, outputs=("validation",), tasks=texts("validation"))
