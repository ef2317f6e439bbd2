"""Held-out validation sets: `mixture.validation` and eval sources, written to validation/.

A share of every train source is held out after dedup and decontamination, so that no
training document is an exact or near copy of a validation document, and before the
quality classifiers and the mixture, so that nothing trains on it. The choice is a seeded
hash of each document's id, exact over the whole source without a task that reads it
(pipeline/select.py): `validation-keys` writes each document shard's sorted keys (weight 1,
or its tokens with `tokens:`), `validation-select` finds each source's cutoff, and
`validation`, once per document shard, is an attribute layer (`keep` false, reason
`held_out`) that also writes the held-out documents to `docs/<source>/part-XXXXX.parquet`.
Every document of an eval source is written there too (reason `eval_source`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import xxhash

from pipeline import select
from pipeline.dedup import apply
from pipeline.io import atomic, fs
from pipeline.steps import view

COLUMNS = ["id", "text", "source", "source_id", "metadata", "n_chars", "n_tokens"]


def keys(seed: int, source: str, ids: list[str]) -> np.ndarray:
    return np.array([xxhash.xxh3_64_intdigest(f"validation:{seed}:{source}:{i}") for i in ids], np.uint64)


def keys_shard(spec: dict, out) -> dict:
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


def select_shard(spec: dict, out) -> dict:
    """`validation-select`: per train source, the largest key held out (exact: the smallest
    key whose cumulative weight reaches the share)."""
    res = {}
    for source, paths in spec["keys"].items():
        paths = select.KeySet(paths)  # footers read once for both questions
        n, total = select.totals(paths)  # documents, and their weight (documents again, or tokens)
        want = round(spec["fraction"] * n) if spec["fraction"] is not None else min(spec["tokens"], total)
        if want <= 0:
            res[source] = {"cutoff": None, "docs": 0, "weight": 0, "available": total}
            continue
        c, docs, w = select.cutoff(paths, want)
        res[source] = {"cutoff": str(c), "docs": docs, "weight": w, "available": total, "want": want}
    return {"rows": sum(v["docs"] for v in res.values()), "sources": res}


def apply_shard(spec: dict, out) -> dict:
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
    st = apply.stage_stats(d, rows, chars, toks, keep[rows], {why: n_held} if n_held else {})
    if held:
        t = pa.Table.from_batches(held)
        path = fs.path(out.dir) / "docs" / d["source"] / f"part-{d['part']:05d}.parquet"
        fs.makedirs(path.parent)
        fs.write_table(t, path, compression="zstd")
        n, sha = atomic.file_digest(path)
        st["held"] = {"file": f"{d['source']}/part-{d['part']:05d}.parquet", "rows": t.num_rows, "bytes": n, "sha256": sha,
                      "tokens": int(pa.compute.sum(t.column("n_tokens")).as_py() or 0)}
    return st
