"""A toy token format: the tokens as little-endian uint32 (`.u32`) and each sequence's
length as one line of text (`.lens`). The worked example of docs/extending.md
(tests/pipeline/steps/tokenize/test_token_formats.py checks the two agree and runs it)."""

from __future__ import annotations

from pathlib import Path

from pipeline.steps.tokenize.registry import FileSet, TokenFormat, register


def dtype(requested: str, vocab: int) -> str:
    """The token type for `tokenize.dtype` (a ValueError says why one does not fit)."""
    if requested not in ("auto", "uint32"):
        raise ValueError("toy files hold uint32 ids; use dtype: uint32 (or auto)")
    return "uint32"


def files(f: FileSet) -> dict[str, bytes]:
    """One mixture shard's file set (`f.data`: its tokens in `dtype`): the data first, its index last."""
    return {".u32": f.data, ".lens": "".join(f"{n}\n" for n in f.lengths.tolist()).encode()}


def check(base: Path, n_tokens: int, dtype, starts, ends, piece_ends, seq_len) -> list[str]:
    """verify-tokens: the lengths tile the data (the counts, specials and texts are checked for any format)."""
    lens = [int(x) for x in base.with_name(base.name + ".lens").read_text().split()]
    return [] if lens == (ends - starts).tolist() and sum(lens) == n_tokens else [".lens does not tile the .u32"]


def trainer(root: Path, files: list[tuple[str, int]], body: dict) -> str:
    """What a trainer reads beside the files: one line a file, its tokens and its path."""
    return "".join(f"{n} {root / rel}.u32\n" for rel, n in files if n)


FORMAT = register(TokenFormat(
    "toy", (".u32", ".lens"), files, dtype,
    doc="uint32 tokens + a text file of lengths", check=check, trainer_file="toy-data.txt", trainer=trainer), __name__)
