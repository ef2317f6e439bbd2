"""The token-format registry: what a trainer's file format is to Curate, as one record.

A format is one module that builds a `TokenFormat` and registers it (formats.py imports the
built-in ones: megatron, datatrove, memmap, levanter). The tokenize stage, the manifest,
`verify-tokens`, `explain --token` and the trainer configs read formats only through it:

- `extensions`, the file set of one mixture shard, the data file first and its index last
  (written in that order: the index says the set is whole);
- `dtype(requested, vocab)`, the token type (`standard_dtype` for most formats);
- `files(FileSet)`, the per-shard write: a file set's bytes by extension;
- `check(...)`, verify-tokens' own invariants of a file set (the generic checks, counts,
  specials and texts are the view's);
- `trainer` / `blend`, what a trainer reads beside the files (layout mixture / cells);
- for a format whose files are not per shard (Levanter's caches span the shards), `steps`
  plans its own steps (per-shard pieces, then a cross-shard finalize), and `publish`,
  `verify` and `locate` replace the per-file ones.

A format registered outside this package (a test's, a user's) is found by a task on
another process through `module`: the planner puts it in the shard specs and `get` imports
it there (the built-ins are always loaded).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

_REGISTRY: dict[str, "TokenFormat"] = {}
# the built-in formats, loaded on first use (a new one is a module and a line here)
BUILTIN = ("pipeline.steps.tokenize.fmt_megatron", "pipeline.steps.tokenize.fmt_datatrove",
           "pipeline.steps.tokenize.fmt_memmap", "pipeline.steps.tokenize.fmt_levanter")


@dataclass(frozen=True)
class FileSet:
    """What a format's `files` writes from: one mixture shard's sequences, back to back."""

    data: bytes  # the tokens, already in `dtype`, little-endian
    lengths: np.ndarray  # int64: each sequence's tokens (a document with its specials, or a packed window)
    dtype: str
    tokens: int
    tokenizer_name: str  # as the run resolved it (gpt2 or a tokenizer.json's path)
    rows: list[tuple[int, int, str, str, int]] | None = None  # `needs_rows`: (start, end, id, source, row) a piece


@dataclass(frozen=True)
class TokenFormat:
    name: str
    extensions: tuple[str, ...]
    files: Callable[[FileSet], dict[str, bytes]]
    dtype: Callable[[str, int], str]
    doc: str = ""  # one line for `curate formats` and the docs
    check: Callable[..., list[str]] | None = None  # (base, n_tokens, dtype, seq_starts, seq_ends, piece_ends, seq_len)
    trainer_file: str | None = None  # layout mixture: the trainer's config beside the files (None: the folder is it)
    trainer: Callable[[Path, list[tuple[str, int]], dict], str] | None = None  # (root, [(file stem, tokens)], body) -> text
    blend_file: str | None = None  # layout cells: the blend of the cells beside them
    blend: Callable[[Path, Path, dict, dict, dict], str] | None = None  # (root, folder, table, cells, body) -> text
    needs_rows: bool = False  # `files` reads FileSet.rows (the memmap csv)
    unit: str = "files"  # what verify-tokens counts
    steps: Callable | None = None  # (ctx, settings, write_shard, validation_shard) -> steps: a format with its own steps
    publish: Callable | None = None  # (ctx, stats, settings, body) -> (path, rel) links into tokenized/
    write_trainer: Callable | None = None  # (ctx, settings, body) -> the trainer file's name
    verify: Callable | None = None  # (run_dir, tokenized, body, encoder, sample, seed) -> (problems, summary)
    locate: Callable | None = None  # (run_dir, body, stem, offset) -> the document holding the token
    module: str = field(default="", compare=False)  # where it was registered from (set by `register`)

    @property
    def data(self) -> str:
        return self.extensions[0]


def register(fmt: TokenFormat, module: str | None = None) -> TokenFormat:
    """Add a format (a module's one line: `FORMAT = register(TokenFormat(...), __name__)`)."""
    if fmt.name in _REGISTRY and _REGISTRY[fmt.name].module != (module or fmt.module):
        raise ValueError(f"token format {fmt.name!r} is registered twice ({_REGISTRY[fmt.name].module} and {module})")
    if module:
        fmt = dataclasses.replace(fmt, module=module)
    _REGISTRY[fmt.name] = fmt
    return fmt


def get(name: str, module: str | None = None) -> TokenFormat:
    """The format `name`; `module`: where it is registered, imported when this process has
    not seen it. A miss names the registered formats."""
    _builtins()
    if name not in _REGISTRY and module:
        importlib.import_module(module)
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"{name!r} is not a token format; registered: {', '.join(names())} "
                       "(`curate formats` lists them; docs/extending.md adds one)") from None


def names() -> list[str]:
    _builtins()
    return list(_REGISTRY)


def describe() -> str:
    """`curate formats`: each registered format, its file set and what it is."""
    rows = [f"{'format':<12} {'files':<34} what"]
    for n in names():
        f = _REGISTRY[n]
        rows.append(f"{n:<12} {' '.join(f.extensions):<34} {f.doc}")
    return "\n".join(rows)


@functools.cache
def _builtins() -> None:
    """Import the built-in formats' modules once (they import this module: loaded by name,
    on first use, so that no import cycle runs through the registry)."""
    for m in BUILTIN:
        importlib.import_module(m)


def module_of(name: str) -> dict:
    """{"format_module": ...} for a spec when `name` is not a built-in format (a task on
    another process imports it), else {} (the built-ins' specs and hashes stay as they were)."""
    m = get(name).module
    return {"format_module": m} if m not in BUILTIN else {}


def standard_dtype(wide: str, refuse: dict[str, str] | None = None) -> Callable[[str, int], str]:
    """The usual rule: `auto` is uint16 when every id fits, else `wide`; uint16 refused for a
    larger vocabulary; `refuse`: other types the format cannot hold, with the reason."""
    refuse = refuse or {}

    def dtype(requested: str, vocab: int) -> str:
        if requested == "auto":
            return "uint16" if vocab <= 1 << 16 else wide
        if requested == "uint16" and vocab > 1 << 16:
            raise ValueError(f"uint16 holds ids below 65,536 but the vocabulary has {vocab:,}; use dtype: auto or {wide}")
        if requested in refuse:
            raise ValueError(refuse[requested])
        return requested
    return dtype
