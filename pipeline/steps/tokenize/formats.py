"""Token file sets, written from a mixture shard's documents in order (one sequence a
document), byte for byte what the trainers' own writers write. Each format is a module
registered in registry.py (fmt_megatron.py, fmt_datatrove.py, fmt_memmap.py,
fmt_levanter.py); this module is what the tasks call.

A file is written to a temporary name and renamed (pipeline/io/fs.py), so a retried task
rewrites the same bytes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from pipeline.io import atomic, fs
from pipeline.steps.tokenize import registry
from pipeline.steps.tokenize.registry import FileSet


def dtype_for(fmt: str, dtype: str, vocab: int) -> str:
    """The token type of `fmt` for `dtype` ("auto": uint16 when every id fits, else the
    format's wide type); a ValueError says why a given type cannot hold the vocabulary."""
    return registry.get(fmt).dtype(dtype, vocab)


def extensions(fmt: str) -> tuple[str, ...]:
    return registry.get(fmt).extensions


def write(fmt: str, base: Path, ids: np.ndarray, lengths: np.ndarray, dtype: str, tokenizer_name: str,
          rows: list[tuple[int, int, str, str, int]] | None = None, module: str | None = None) -> dict:
    """One token file set at `base` (no extension) from its sequences back to back: `ids` in
    `lengths` runs (a document each, with its specials; or packed windows); `rows`: each
    piece's (start, end, id, source, row), for a format that `needs_rows`. Returns its
    files' bytes and sha256 and the token count."""
    lengths = np.asarray(lengths, np.int64)
    tokens = int(lengths.sum())
    if len(ids) and int(ids.max()) > np.iinfo(np.dtype(dtype)).max:  # a cast would wrap it into another token
        raise ValueError(f"{base.name}: token id {int(ids.max()):,} does not fit {dtype}; the tokenizer gives ids past "
                         "the size its dtype was chosen for: set tokenize.dtype: uint32 (or auto)")
    data = ids.astype(np.dtype(dtype).newbyteorder("<"), copy=False).tobytes()  # one cast for the file
    files = registry.get(fmt, module).files(FileSet(data, lengths, dtype, tokens, tokenizer_name, rows))
    out = {}
    for ext, blob in files.items():  # the data first, its index last: the index says the set is whole
        p = base.with_name(base.name + ext)
        fs.makedirs(p.parent)
        atomic.write_bytes(p, blob)
        out[p.name] = {"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
    return {"files": out, "tokens": tokens, "documents": len(lengths)}
