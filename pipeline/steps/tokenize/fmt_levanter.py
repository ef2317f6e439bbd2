"""Levanter's caches (levanter.py): a format whose files span the shards. Its per-shard
write is a piece of ids (`.ids`, the documents' ends in the provenance sidecar); its own
steps assemble the pieces into each cache's zarr3 chunk files (the cross-shard finalize),
and it publishes, verifies and locates tokens by cache, not by file."""

from __future__ import annotations

from pipeline.steps.tokenize import levanter, levanter_publish, levanter_read
from pipeline.steps.tokenize.registry import FileSet, TokenFormat, register


def files(f: FileSet) -> dict[str, bytes]:
    return {".ids": f.data}


def dtype(requested: str, vocab: int) -> str:
    """The caches' ids; "auto" stays: the pieces are as narrow as the ids (levanter.plan)."""
    if requested not in ("auto", "int32"):
        raise ValueError("Levanter's caches hold int32 ids (the type its trainer feeds the model); use int32 (or auto)")
    return "int32"


def locate(run_dir, body: dict, stem: str, offset: int) -> dict:
    return levanter_read.locate(run_dir, body["caches"], stem, offset)


FORMAT = register(TokenFormat(
    "levanter", (".ids",), files, dtype, doc="Levanter caches (tensorstore zarr3 arrays); levanter-data.yaml",
    unit="caches", steps=levanter.plan, publish=levanter_publish.pairs, write_trainer=levanter_publish.write,
    verify=levanter_read.verify, locate=locate), __name__)
