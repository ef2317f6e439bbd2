"""Publishing the Levanter caches: tokenized/levanter/ assembled from the chunk files by hard
links (copies on object stores; `shard_ledger.json` is a chunk task's file too), and `levanter-data.yaml`.

    tokenized/levanter/
      levanter-data.yaml                  the trainer's data section: the caches and train_weights
      <cache>/train/input_ids/{data,offsets}/zarr.json, c/<k>
      <cache>/train/shard_ledger.json
      <cache>/train/provenance/<piece>.docs.parquet    which document holds which tokens (explain --token)
      validation/validation/...           the held-out documents (a component of weight 0)

A cache is `mixture` (layout mixture) or a cell with `/` as `__` (layout cells). Nothing
here reads a token: the files are linked, the YAML is a few hundred bytes.
"""

from __future__ import annotations

from pipeline.io import atomic
from pipeline.steps.tokenize import levanter


def folder(cache: str) -> str:
    """A cache's folder under tokenized/levanter/: `<cache>/train`, or validation/validation."""
    return "validation/validation" if cache == "validation" else f"{cache}/train"


def pairs(ctx, stats: dict, st: dict, body: dict) -> list[tuple]:
    """The (file, relative name) pairs of tokenized/levanter/, and the manifest's `levanter` entry in `body`."""
    steps = [s for s in (ctx.step("tokens-levanter"), ctx.step("tokens-levanter-validation")) if s is not None]
    chunks = ctx.step("tokens-levanter-cache")
    out = []
    for i in sorted(stats[chunks.name]):
        m = stats[chunks.name][i]
        for f in m["files"]:
            out.append((chunks.dir(ctx.store) / m["cache"] / f, f"levanter/{folder(m['cache'])}/{f}"))
    entry = {"dtype": "int32", "extensions": [], "files": [], "tokens": 0, "validation_tokens": 0, "caches": {}}
    for name, ps in levanter.caches(ctx, steps, stats).items():
        start, listed = 0, []
        for p in ps:
            rel = f"levanter/{folder(name)}/provenance/{p['piece']}.docs.parquet"
            out.append((p["path"] + ".docs.parquet", rel))
            listed.append({"piece": p["piece"], "provenance": f"tokenized/{rel}", "start": start, "documents": p["rows"], "tokens": p["tokens"]})
            start += p["tokens"]
        entry["caches"][name] = {"path": f"tokenized/levanter/{folder(name)}", "documents": sum(p["rows"] for p in ps),
                                 "tokens": start, "pieces": listed}
        entry["validation_tokens" if name == "validation" else "tokens"] += start
    body["levanter"] = entry
    return out


def _weights(ctx, entry: dict) -> dict[str, float]:
    """train_weights: the mixture's cell weights (layout cells), or the one mixture cache."""
    if ctx.mixture.tokenize.layout != "cells":
        return {"mixture": 1.0}
    ph = ctx.mix.phases[0]
    if ph["weights"] is not None:
        return {levanter.cache_name(c): float(w) for c, w in ph["weights"].items()}
    # sample_rates: a cell's share is its tokens at its rate
    got = {levanter.cache_name(c): r * entry["caches"][levanter.cache_name(c)]["tokens"] for c, r in ph["rates"].items()}
    total = sum(got.values()) or 1
    return {c: round(v / total, 6) for c, v in got.items()}


def write(ctx, st: dict, entry: dict) -> str:
    """levanter-data.yaml (after the links: the ledgers are the chunk tasks'); returns its name."""
    root = ctx.run_dir / "tokenized" / "levanter"
    tok = st["tokenizer"]
    hf_name = tok.rsplit("/", 1)[0] if tok.endswith("tokenizer.json") else tok  # an HF tokenizer folder or name
    weights = _weights(ctx, entry)
    for name, c in entry["caches"].items():
        if name != "validation":
            c["weight"] = weights.get(name, 0.0)
    text = levanter.data_config(str(root), hf_name, {n: weights.get(n, 0.0) for n in entry["caches"] if n != "validation"},
                                "validation" in entry["caches"])
    atomic.write_bytes(root / "levanter-data.yaml", text.encode())
    return "levanter-data.yaml"
