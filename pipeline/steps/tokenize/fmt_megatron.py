"""Megatron-LM's indexed dataset: `.bin` (the tokens back to back) and `.idx`:
`MMIDIDX\\x00\\x00`, version 1 (<Q), the dtype code (<B: 8 uint16, 4 int32), sequences and
documents (<Q each: n, n + 1), then int32 lengths, int64 byte pointers, int64 document
indices 0..n. Megatron-LM's `IndexedDataset` and datatrove's `MegatronDocumentTokenizer`
agree on it. The trainer reads `--data-path` ("weight prefix" a file)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.steps.tokenize.registry import FileSet, TokenFormat, register, standard_dtype

CODES = {"uint16": 8, "int32": 4}  # Megatron-LM indexed_dataset DType codes (it has no uint32)
MAGIC = b"MMIDIDX\x00\x00"


def files(f: FileSet) -> dict[str, bytes]:
    lengths = f.lengths
    size = np.dtype(f.dtype).itemsize
    idx = b"".join([MAGIC, np.uint64(1).tobytes(), np.uint8(CODES[f.dtype]).tobytes(),
                    np.uint64(len(lengths)).tobytes(), np.uint64(len(lengths) + 1).tobytes(),
                    lengths.astype("<i4").tobytes(), (np.r_[0, np.cumsum(lengths)[:-1]] * size).astype("<i8").tobytes()
                    if len(lengths) else b"", np.arange(len(lengths) + 1, dtype="<i8").tobytes()])
    return {".bin": f.data, ".idx": idx}


def check(base: Path, n_tokens: int, dtype: np.dtype, starts, ends, piece_ends, seq_len) -> list[str]:
    out = []
    idx = base.with_name(base.name + ".idx").read_bytes()
    if idx[:9] != MAGIC or np.frombuffer(idx[9:17], "<u8")[0] != 1:
        return ["the .idx is not a Megatron index, version 1"]
    code = idx[17]
    if {8: 2, 4: 4}.get(code) != dtype.itemsize:
        out.append(f"the .idx's dtype code {code} does not match {dtype}")
    n, nd = (int(x) for x in np.frombuffer(idx[18:34], "<u8"))
    if len(idx) != 34 + 12 * n + 8 * nd:
        return out + [f"the .idx is {len(idx):,} bytes, {34 + 12 * n + 8 * nd:,} for {n:,} sequences"]
    sizes = np.frombuffer(idx, "<i4", n, 34).astype(np.int64)
    ptrs = np.frombuffer(idx, "<i8", n, 34 + 4 * n)
    doc_idx = np.frombuffer(idx, "<i8", nd, 34 + 12 * n)
    if nd != n + 1 or doc_idx[0] != 0 or np.any(doc_idx != np.arange(nd)):
        out.append("document_indices are not 0..n (one sequence a document, document_indices[0] == 0)")
    if n and (np.any(ptrs != np.r_[0, np.cumsum(sizes)[:-1]] * dtype.itemsize) or sizes.sum() != n_tokens):
        out.append(f"sequence lengths and pointers do not tile the .bin's {n_tokens:,} tokens")
    if n != len(starts) or (n and np.any(sizes != ends - starts)):
        out.append("the .idx's sequences are not the documents of the sidecar" if seq_len is None else
                   f"the .idx's sequences are not {n_tokens // seq_len:,} sequences of {seq_len:,}")
    return out


def trainer(root: Path, files: list[tuple[str, int]], body: dict) -> str:
    """Megatron-LM's `--data-path`: each file's prefix weighted by its tokens (the files are
    the mixture already, so sampling them by size keeps its weights)."""
    total = sum(n for _, n in files) or 1
    return " ".join(f"{n / total:.6g} {root / rel}" for rel, n in files if n) + "\n"


def blend(root: Path, where: Path, table: dict, cells: dict, body: dict) -> str:
    """`--data-path` over the cells: a cell's weight shared among its files by tokens."""
    return " ".join(f"{t['weight'] * n / g['tokens']:.6g} {root / rel}" for c, t in table.items()
                    for g in [cells[c]] for rel, n in g["files"]) + "\n"


FORMAT = register(TokenFormat(
    "megatron", (".bin", ".idx"), files,
    standard_dtype("int32", {"uint32": "Megatron's .idx has no uint32 code; use int32 (or auto)"}),
    doc="Megatron-LM .bin + .idx (MMIDIDX version 1); data-path.txt", check=check,
    trainer_file="data-path.txt", trainer=trainer, blend_file="data-path.txt", blend=blend), __name__)
