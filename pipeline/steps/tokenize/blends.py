"""`tokenize.layout: cells`: the trainers' blends of the cells, written beside their files.

With one dataset per cell, the mixture's weights move to the trainer: each cell's files
hold the cell's documents as the mixture chose them (its epochs included), and a blend
says how much of each to draw. The weights written are the mixture's realised token shares,
so the default blend trains on the mixture's proportions; edit a cell's weight to reweight
it without a new run (a weight above its share repeats the cell's documents, as the
trainer's sampler does). Per phase when the mixture has phases:

    cells.json         {cell: {"weight", "tokens", "documents", "files": [prefix, ...]}}
    data-path.txt      Megatron-LM's --data-path: "weight prefix" per file, a cell's weight
                       shared among its files by tokens
    olmo-mix.yaml      OLMo-core's source mixture: per cell `source_name`, `target_ratio`, `paths` (memmap)
    folders.json       datatrove: per cell its folder (DatatroveFolderDataset) and weight
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.io import atomic
from pipeline.steps.tokenize import registry


def _groups(fmt: str, b: dict) -> dict[str, dict[str, dict]]:
    """phase ("" for none) -> cell -> {"tokens", "documents", "files": [relative prefixes]}."""
    out: dict[str, dict[str, dict]] = {}
    for f in b["files"]:
        rel = f["path"][len(f"tokenized/{fmt}/"):]
        cell = f["cell"]
        head = rel[: -len(cell + "/" + rel.rsplit("/", 1)[1])].rstrip("/")  # the phase's folder, or ""
        g = out.setdefault(head, {}).setdefault(cell, {"tokens": 0, "documents": 0, "files": []})
        real = f["tokens"] - f.get("padding", 0)  # packed: a cell's weight is its documents' tokens, not its padding
        g["tokens"] += real
        g["documents"] += f["documents"]
        if f["tokens"]:
            g["files"].append((rel, real))
    return out


def write(root: Path, fmt: str, b: dict) -> tuple[str, dict]:
    """The blends of one format under `root` (tokenized/<format>/); returns the main file's
    name and, per phase ("" for none), each cell's weight, tokens and documents."""
    f = registry.get(fmt)
    main = f.blend_file or "cells.json"
    cells_out: dict[str, dict] = {}
    for phase, cells in _groups(fmt, b).items():
        total = sum(g["tokens"] for g in cells.values()) or 1
        where = root / phase if phase else root
        table = {c: {"weight": round(g["tokens"] / total, 6), "tokens": g["tokens"], "documents": g["documents"],
                     "files": [str(root / rel) for rel, _ in g["files"]]} for c, g in sorted(cells.items())}
        atomic.write_bytes(where / "cells.json", (json.dumps(table, indent=1) + "\n").encode())
        if f.blend is not None:  # the format's own blend (megatron, memmap, datatrove); cells.json for any
            atomic.write_bytes(where / main, f.blend(root, where, table, cells, b).encode())
        cells_out[phase] = {c: {k: t[k] for k in ("weight", "tokens", "documents")} for c, t in table.items()}
    return main, cells_out
