"""datatrove's tokenized files, as its `DocumentTokenizer` writes them unshuffled: `.ds`
(the tokens, little-endian uint16 or uint32), `.ds.index` (<Q end of each document, in
tokens) and `.ds.metadata` ("<tokenizer>|<bytes a token>", the token count, the count
humanized). Its `DatatroveFolderDataset` reads the folder itself: no trainer file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pipeline.steps.tokenize.registry import FileSet, TokenFormat, register, standard_dtype


def files(f: FileSet) -> dict[str, bytes]:
    import humanize  # datatrove's own dependency: its metadata's third line

    meta = "\n".join([f"{f.tokenizer_name}|{np.dtype(f.dtype).itemsize}", str(f.tokens), humanize.metric(f.tokens, unit="T")])
    return {".ds": f.data, ".ds.index": np.cumsum(f.lengths).astype("<u8").tobytes(), ".ds.metadata": meta.encode()}


def check(base: Path, n_tokens: int, dtype: np.dtype, starts, ends, piece_ends, seq_len) -> list[str]:
    index = np.frombuffer(base.with_name(base.name + ".ds.index").read_bytes(), "<u8")
    if len(index) != len(ends) or (len(index) and (np.any(index != ends) or index[-1] != n_tokens)):
        return [".ds.index's document ends do not match the .ds"]
    return []


def blend(root: Path, where: Path, table: dict, cells: dict, body: dict) -> str:
    """Per cell its folder (a DatatroveFolderDataset) and weight."""
    return json.dumps({c: {"folder": str(where / c), "weight": t["weight"]} for c, t in table.items()}, indent=1) + "\n"


FORMAT = register(TokenFormat(
    "datatrove", (".ds", ".ds.index", ".ds.metadata"), files,
    standard_dtype("uint32", {"int32": "datatrove files hold uint16 or uint32 tokens; use uint32 (or auto)"}),
    doc="datatrove .ds + .ds.index + .ds.metadata (DatatroveFolderDataset reads the folder)", check=check,
    blend_file="folders.json", blend=blend), __name__)
