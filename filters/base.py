"""The filter contract and the registry of filter types.

A filter sees a batch of documents (an Arrow record batch with at least `id` and `text`)
and answers, for every row, keep or drop, a reason for each drop, and optional score
columns. The batch is the hot path; the filter step (pipeline/steps/filter.py) runs a
source's filters in order, each only on the rows still kept, and records the first
failing filter as the document's removal stage.

Parameters are pydantic models: thresholds are `min_*` / `max_*` with their unit, and
`None` switches a threshold off. A filter type is registered by name:

    @register_filter("length")
    class LengthFilter(Filter):
        Params = LengthParams
        def apply(self, batch): ...

and a mixture YAML picks it with `type: length`. `curate filters` lists the registry. The
registration's `version=` and `libraries=` enter the hash of the filter steps that run
the type (pipeline/plan/code.py), as its parameters do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal, cast

import numpy as np
import pyarrow as pa
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_serializer, model_validator

from filters.registry import Registry


def _compiles(v: str) -> str:
    import re

    try:
        re.compile(v)
    except re.error as e:
        raise ValueError(f"not a valid regular expression: {e}") from None
    return v


def list_lines(path: str) -> list[str]:
    """The entries of a user's list file (block lists, word lists): one a line, `#` starts a
    comment, blank lines skipped. A local path or a URL (fsspec)."""
    from pipeline.io import fs

    lines = (line.split("#", 1)[0].strip() for line in fs.path(path).read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line]


# a Python regular expression, checked when the YAML is read (not first in a worker)
RegexPattern = Annotated[str, AfterValidator(_compiles)]


class FilterParams(BaseModel):
    """Base of every filter's parameters: frozen, unknown keys are errors. Any instance
    takes `per_language` (filters/routing.py): its parameters per detected language."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)  # .nan, .inf: config errors
    type: str
    per_language: dict[str, dict[str, Any]] | str | None = Field(
        None, description="parameters per language detected by the chain's language filter: {<lang>: {<param>: "
                          "<value>}, default: {...}}, `fineweb2` (FineWeb-2's thresholds) or a YAML/JSON file of the "
                          "same mapping (filters/routing.py)")

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        """per_language only when set: a config without it dumps, and hashes, as before it existed."""
        d = handler(self)
        if isinstance(d, dict) and d.get("per_language", 0) is None:
            d.pop("per_language")
        return d

    @model_validator(mode="after")
    def _per_language(self):
        if self.per_language is not None:
            from filters import routing

            routing.check(self)
        return self


@dataclass
class FilterResult:
    """What a filter says about a batch: one entry per row of the batch."""

    keep: np.ndarray  # bool, len == batch rows
    reasons: list[str | None]  # None where kept
    scores: dict[str, pa.Array] = field(default_factory=dict)
    texts: list[str | None] | None = None  # a rewriting filter's new text for kept rows (None: unchanged)
    changes: dict[str, np.ndarray] | None = None  # a rewriter's per-row counts of what it changed, by kind

    def __post_init__(self):
        n = len(self.keep)
        if len(self.reasons) != n or any(len(v) != n for v in self.scores.values()):
            raise ValueError("FilterResult: keep, reasons and scores must have one entry per row")
        if self.texts is not None and len(self.texts) != n:
            raise ValueError("FilterResult: texts must have one entry per row")


class Filter:
    """Subclass, set `Params`, implement `apply`. One instance serves many batches."""

    name: ClassVar[str]
    version: ClassVar[str] = "1"  # register_filter(version=...): bumped when the output changes for the same parameters
    libraries: ClassVar[tuple[str, ...]] = ()  # register_filter(libraries=...): the packages whose output it stores
    Params: ClassVar[type[FilterParams]]
    description: ClassVar[str] = ""
    # (module, pip requirement) the type imports when built; `curate validate` checks them,
    # so a missing optional package is a config error with its pip line, not a worker crash
    requires: ClassVar[tuple[tuple[str, str | None], ...]] = ()

    def __init__(self, params: FilterParams):
        self.params = params

    @classmethod
    def used_libraries(cls, params: FilterParams) -> tuple[str, ...]:
        """The packages (import names) whose output this instance stores: their installed
        versions enter the filter step's hash. Default: the registration's `libraries`."""
        return cls.libraries

    @classmethod
    def user_code(cls, params: FilterParams) -> list[str]:
        """The user's functions or classes the parameters name (`module:name`): the digest of
        each one's source file enters the filter step's hash, so editing it re-runs the step."""
        return []

    @classmethod
    def dependencies(cls, params: FilterParams) -> list[tuple[str, str | None]]:
        """What this instance needs importable; a pip requirement of None: the user's own module."""
        return list(cls.requires)

    def apply(self, batch: pa.RecordBatch) -> FilterResult:
        raise NotImplementedError


class PerDocFilter(Filter):
    """A filter whose rules read one document at a time: `check(text) -> reason | None`."""

    def check(self, text: str) -> str | None:
        raise NotImplementedError

    def apply(self, batch: pa.RecordBatch) -> FilterResult:
        reasons = [self.check(t) for t in batch.column("text").to_pylist()]
        return FilterResult(np.array([r is None for r in reasons], dtype=bool), reasons)


# The module that registers each built-in type (the one list of the built-in families), so
# that a worker imports only the families its chain uses (importing all of them is ~20 ms of
# every worker's first task, most of a small shard's time). tests/filters/test_length.py
# checks it against the registrations in filters/*.py.
BUILTIN_MODULES = {
    "c4_paragraph": "filters.c4", "c4_quality": "filters.c4", "datatrove": "filters.adapters",
    "extracted": "filters.web", "fineweb_quality": "filters.fineweb", "flagged_words": "filters.flagged",
    "ftfy": "filters.rewrite", "gopher_quality": "filters.gopher", "gopher_repetition": "filters.gopher",
    "language": "filters.language", "length": "filters.length", "line_remover": "filters.rewrite",
    "pii": "filters.pii", "python": "filters.adapters", "regex": "filters.patterns",
    "regex_replace": "filters.rewrite", "url": "filters.patterns",
}

FILTERS = Registry("filter", BUILTIN_MODULES)
_REGISTRY = FILTERS.types  # name -> class, as registered so far


def register_filter(name: str, version: str = "1", libraries: tuple[str, ...] = ()):
    """Class decorator: register a filter type under `name` (the YAML `type:`). `version`
    and the installed versions of `libraries` (import names) enter the filter step's hash."""
    return FILTERS.register(name, version, libraries)


def registry() -> dict[str, type[Filter]]:
    """Every registered filter type, importing the built-in families first."""
    return FILTERS.all()


def filter_class(type_name: str) -> type[Filter]:
    return FILTERS.get(type_name)


def parse_params(spec: dict) -> FilterParams:
    """Validate one `filters.<name>` mapping; raises KeyError or pydantic.ValidationError."""
    if not isinstance(spec, dict) or "type" not in spec:
        raise KeyError("missing 'type'; known types: " + ", ".join(registry()))
    return filter_class(spec["type"]).Params.model_validate(spec)


def path_fields(params: FilterParams) -> dict[str, str]:
    """The parameters that name files (marked `is_path`), with the files a filter reads by
    default: the validator checks they exist, and their contents enter the step hash."""
    out = {}
    for name, f in type(params).model_fields.items():
        extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
        if extra.get("is_path") and getattr(params, name) is not None:
            out[name] = getattr(params, name)
    pl = getattr(params, "per_language", None)
    if isinstance(pl, str) and pl != "fineweb2":  # a file of per-language parameters
        out["per_language"] = pl
    default = getattr(filter_class(params.type), "default_files", None)
    if default:
        out.update({k: v for k, v in default(params).items() if k not in out})
    return out


def missing_dependencies(params: FilterParams) -> list[str]:
    """One message per module the filter needs that cannot be imported here, with its fix."""
    import importlib.util

    out = []
    for module, pip in filter_class(params.type).dependencies(params):
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a parent package is missing
            found = False
        if found:
            continue
        if pip is None:
            out.append(f"the module {module!r} cannot be imported here; install the package that provides it "
                       "(on every node of a cluster), or fix the import path")
        else:
            out.append(f"filter type {params.type!r} needs the module {module!r}, which is not installed; "
                       f"pip install '{pip}' (on every node of a cluster)")
    return out


def build(params: FilterParams) -> Filter:
    """A filter instance; with per_language, one that routes each document to its language's
    parameters (filters/routing.py)."""
    if params.per_language is not None:
        from filters.routing import Routed

        return cast(Filter, Routed(params, lambda p: filter_class(p.type)(p)))  # Routed has a Filter's methods
    return filter_class(params.type)(params)


def describe_registry() -> str:
    """Every filter type with its parameters and defaults (`curate filters`)."""
    lines = []
    for name, cls in registry().items():
        lines.append(f"{name} (v{cls.version}): {cls.description}")
        for fname, f in cls.Params.model_fields.items():
            fname = f.alias or fname
            if fname in ("type", "per_language"):
                continue
            default = "required" if f.is_required() else f"default {f.get_default(call_default_factory=True)!r}"
            ann = getattr(f.annotation, "__name__", None) or str(f.annotation).replace("typing.", "")
            lines.append(f"    {fname}: {ann}, {default}" + (f". {f.description}" if f.description else ""))
        lines.append("")
    lines.append("thresholds are min_*/max_* with their unit; None (null in YAML) switches one off")
    lines.append("every type also takes per_language: its parameters per detected language ({<lang>: {...}, default: "
                 "{...}}, fineweb2, or a YAML file), after a language filter in the chain")
    return "\n".join(lines)


def reference_markdown() -> str:
    """docs/filters.md's filter table, generated from the registry."""

    rows = ["| type | parameter | type | default | meaning |", "| --- | --- | --- | --- | --- |"]
    for name, cls in registry().items():
        rows.append(f"| `{name}` | | | | {cls.description} |")
        for fname, f in cls.Params.model_fields.items():
            fname = f.alias or fname
            if fname not in ("type", "per_language"):  # per_language: every type's, documented once
                default = "required" if f.is_required() else repr(f.get_default(call_default_factory=True))
                rows.append(f"| | `{fname}` | {type_name(f.annotation)} | {default} | {f.description or ''} |")
    return "\n".join(rows)


def type_name(ann: Any) -> str:
    """A field's annotation in words, for the generated key and filter tables."""
    import types
    import typing

    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin in (typing.Union, types.UnionType):
        named = " or ".join(type_name(a) for a in args if a is not type(None))
        return named + (" or null" if type(None) in args else "")
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in args)
    if origin is list:
        return f"list of {type_name(args[0])}"
    if origin is dict:
        return f"map of {type_name(args[1])}"
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return "mapping"
    return getattr(ann, "__name__", str(ann))
