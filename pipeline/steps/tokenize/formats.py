"""Token file formats, written from a mixture shard's documents in order (one sequence a
document), byte for byte what the trainers' own writers write:

- **megatron**: `.bin` (the tokens back to back) and `.idx`: `MMIDIDX\\x00\\x00`, version 1
  (<Q), the dtype code (<B: 8 uint16, 4 int32), sequences and documents (<Q each: n, n + 1),
  then int32 lengths, int64 byte pointers, int64 document indices 0..n. Megatron-LM's
  `IndexedDataset` and datatrove's `MegatronDocumentTokenizer` agree on it.
- **datatrove**: `.ds` (the tokens, little-endian uint16 or uint32), `.ds.index` (<Q end of
  each document, in tokens) and `.ds.metadata` ("<tokenizer>|<bytes a token>", the token
  count, the count humanized), as datatrove's `DocumentTokenizer` writes them unshuffled.
- **memmap** (Dolma's `dolma tokens`, OLMo's memmap datasets): `.npy` (the raw tokens, no
  header: `np.memmap(path, dtype)`) and `.csv.gz` (a csv row a document: start, end, id,
  source, its row in the mixture file; Dolma's `MemmapMetadata` order, its csv writer's
  line ends; gzip with no name and time 0, so the bytes are the same every run).

A file is written to a temporary name and renamed (pipeline/io/fs.py), so a retried task
rewrites the same bytes.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
from pathlib import Path

import numpy as np

from pipeline.io import atomic, fs

MEGATRON_CODES = {"uint16": 8, "int32": 4}  # Megatron-LM indexed_dataset DType codes (it has no uint32)
EXTENSIONS = {"megatron": (".bin", ".idx"), "datatrove": (".ds", ".ds.index", ".ds.metadata"), "memmap": (".npy", ".csv.gz"),
              "levanter": (".ids",)}  # levanter: the pieces its caches are assembled from (levanter.py)


def dtype_for(fmt: str, dtype: str, vocab: int) -> str:
    """The token type of `fmt` for `dtype` ("auto": uint16 when every id fits, else the
    format's wide type); a ValueError says why a given type cannot hold the vocabulary."""
    if fmt == "levanter":  # the caches' ids (levanter.py); "auto" stays: the pieces are as narrow as the ids
        if dtype not in ("auto", "int32"):
            raise ValueError("Levanter's caches hold int32 ids (the type its trainer feeds the model); use int32 (or auto)")
        return "int32"
    wide = "int32" if fmt == "megatron" else "uint32"  # datatrove and memmap: uint32
    if dtype == "auto":
        return "uint16" if vocab <= 1 << 16 else wide
    if dtype == "uint16" and vocab > 1 << 16:
        raise ValueError(f"uint16 holds ids below 65,536 but the vocabulary has {vocab:,}; use dtype: auto or {wide}")
    if fmt == "megatron" and dtype == "uint32":
        raise ValueError("Megatron's .idx has no uint32 code; use int32 (or auto)")
    if fmt != "megatron" and dtype == "int32":
        raise ValueError(f"{fmt} files hold uint16 or uint32 tokens; use uint32 (or auto)")
    return dtype


def write(fmt: str, base: Path, ids: np.ndarray, lengths: np.ndarray, dtype: str, tokenizer_name: str,
          rows: list[tuple[int, int, str, str, int]] | None = None) -> dict:
    """One token file set at `base` (no extension) from its sequences back to back: `ids` in
    `lengths` runs (a document each, with its specials; or packed windows); `rows`: the
    memmap csv's rows (start, end, id, source, row), a document or a piece of one each.
    Returns its files' bytes and sha256 and the token count."""
    lengths = np.asarray(lengths, np.int64)
    tokens = int(lengths.sum())
    if len(ids) and int(ids.max()) > np.iinfo(np.dtype(dtype)).max:  # a cast would wrap it into another token
        raise ValueError(f"{base.name}: token id {int(ids.max()):,} does not fit {dtype}; the tokenizer gives ids past "
                         "the size its dtype was chosen for: set tokenize.dtype: uint32 (or auto)")
    data = ids.astype(np.dtype(dtype).newbyteorder("<"), copy=False).tobytes()  # one cast for the file
    if fmt == "megatron":
        size = np.dtype(dtype).itemsize
        idx = b"".join([b"MMIDIDX\x00\x00", np.uint64(1).tobytes(), np.uint8(MEGATRON_CODES[dtype]).tobytes(),
                        np.uint64(len(lengths)).tobytes(), np.uint64(len(lengths) + 1).tobytes(),
                        lengths.astype("<i4").tobytes(), (np.r_[0, np.cumsum(lengths)[:-1]] * size).astype("<i8").tobytes()
                        if len(lengths) else b"", np.arange(len(lengths) + 1, dtype="<i8").tobytes()])
        files = {".bin": data, ".idx": idx}
    elif fmt == "levanter":  # a piece: the ids alone (the sidecar has the documents' ends)
        files = {".ids": data}
    elif fmt == "memmap":
        text = io.StringIO()
        csv.writer(text).writerows(rows or [])
        files = {".npy": data, ".csv.gz": gzip.compress(text.getvalue().encode(), mtime=0)}
    else:
        import humanize  # datatrove's own dependency: its metadata's third line

        meta = "\n".join([f"{tokenizer_name}|{np.dtype(dtype).itemsize}", str(tokens), humanize.metric(tokens, unit="T")])
        files = {".ds": data, ".ds.index": np.cumsum(lengths).astype("<u8").tobytes(), ".ds.metadata": meta.encode()}
    out = {}
    for ext, blob in files.items():  # the data first, its index last: the index says the set is whole
        p = base.with_name(base.name + ext)
        fs.makedirs(p.parent)
        atomic.write_bytes(p, blob)
        out[p.name] = {"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
    return {"files": out, "tokens": tokens, "documents": len(lengths)}
