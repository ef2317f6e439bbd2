"""Dolma's `dolma tokens` / OLMo's memmap datasets: `.npy` (the raw tokens, no header:
`np.memmap(path, dtype)`) and `.csv.gz` (a csv row a document: start, end, id, source, its
row in the mixture file; Dolma's `MemmapMetadata` order, its csv writer's line ends; gzip
with no name and time 0, so the bytes are the same every run). OLMo reads `data:` paths."""

from __future__ import annotations

import csv
import gzip
import io
from pathlib import Path

import numpy as np
import yaml

from pipeline.steps.tokenize.registry import FileSet, TokenFormat, register, standard_dtype


def files(f: FileSet) -> dict[str, bytes]:
    text = io.StringIO()
    csv.writer(text).writerows(f.rows or [])
    return {".npy": f.data, ".csv.gz": gzip.compress(text.getvalue().encode(), mtime=0)}


def check(base: Path, n_tokens: int, dtype: np.dtype, starts, ends, piece_ends, seq_len) -> list[str]:
    rows = list(csv.reader(io.StringIO(gzip.decompress(base.with_name(base.name + ".csv.gz").read_bytes()).decode())))
    if len(rows) != len(piece_ends) or (rows and ((seq_len is None and int(rows[-1][1]) != n_tokens)
                                                   or [int(r[1]) for r in rows] != piece_ends.tolist())):
        return [".csv.gz's start/end do not match the .npy"]
    return []


def trainer(root: Path, files: list[tuple[str, int]], body: dict) -> str:
    """OLMo's `data:` section: the memmap paths and their dtype."""
    return f"data:\n  memmap_dtype: {body['dtype']}\n  paths:\n" + "".join(f"    - {root / rel}.npy\n" for rel, n in files if n)


def blend(root: Path, where: Path, table: dict, cells: dict, body: dict) -> str:
    """OLMo-core's source mixture: per cell `source_name`, `target_ratio`, `paths`."""
    return "# OLMo-core source mixture: a cell's target_ratio is its share of the mixture's tokens\n" + yaml.safe_dump(
        {"memmap_dtype": body["dtype"], "source_mixture": {"sources": [
            {"source_name": c, "target_ratio": t["weight"], "paths": [f"{p}.npy" for p in t["files"]]}
            for c, t in table.items() if t["files"]]}}, sort_keys=False)


FORMAT = register(TokenFormat(
    "memmap", (".npy", ".csv.gz"), files,
    standard_dtype("uint32", {"int32": "memmap files hold uint16 or uint32 tokens; use uint32 (or auto)"}),
    doc="Dolma/OLMo memmap .npy + .csv.gz; olmo-data.yaml", check=check, trainer_file="olmo-data.yaml",
    trainer=trainer, blend_file="olmo-mix.yaml", blend=blend, needs_rows=True), __name__)
