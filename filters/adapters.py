"""Adapters: any datatrove filter (`type: datatrove`) or a user's function (`type: python`),
under the same rules as the built-ins: a reason for every drop, counted in the ledger.

    hashes:   {type: datatrove, class: RegexFilter, args: {regex_exp: "#{3,}"}}
    mine:     {type: python, callable: mypkg.rules:keep_doc, mode: document}

A document-mode callable gets the text and returns True (keep), False, or (False, reason);
a batch-mode callable gets the Arrow record batch and returns (keep mask, reasons). The
source file of a named callable or class enters the filter step's hash (`user_code`): an
edit to it re-runs the step.
"""

from __future__ import annotations

import importlib
from typing import Any, Literal

import numpy as np
import pyarrow as pa
from pydantic import ConfigDict, Field

from filters.base import Filter, FilterParams, FilterResult, register_filter


class DatatroveParams(FilterParams):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)
    type: Literal["datatrove"] = "datatrove"
    class_: str = Field(alias="class", description="a class in datatrove.pipeline.filters, or a dotted path to one")
    args: dict[str, Any] = Field(default_factory=dict, description="keyword arguments for the class")


def _resolve(path: str, default_module: str | None = None):
    if ":" in path:
        mod, _, name = path.partition(":")
    elif "." in path:
        mod, _, name = path.rpartition(".")
    else:
        mod, name = default_module, path
    try:
        return getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot import {path!r}: {e}") from None


def _module_of(path: str, default_module: str | None = None) -> str | None:
    if ":" in path:
        return path.partition(":")[0]
    return path.rpartition(".")[0] if "." in path else default_module


def _reference(path: str, default_module: str | None = None) -> str:
    """`module:name` of a `module:name`, dotted or bare path (what the step hash names)."""
    if ":" in path:
        return path
    mod, _, name = path.rpartition(".") if "." in path else (default_module, "", path)
    return f"{mod}:{name}"


def _normalise(res) -> tuple[bool, str | None]:
    if isinstance(res, tuple):
        return bool(res[0]), (None if res[0] else (res[1] if len(res) > 1 and res[1] else "removed"))
    return bool(res), (None if res else "removed")


@register_filter("datatrove", libraries=("datatrove",))
class DatatroveFilter(Filter):
    """Any datatrove filter class, run per document; its reason strings are kept."""

    Params = DatatroveParams

    @classmethod
    def dependencies(cls, params: DatatroveParams) -> list[tuple[str | None, str | None]]:
        """datatrove's own declaration: `_requires_dependencies` along the class's MRO."""
        try:
            klass = _resolve(params.class_, "datatrove.pipeline.filters")
        except ValueError:
            return [(_module_of(params.class_, "datatrove.pipeline.filters"), None)]
        out = []
        for t in klass.__mro__:
            for d in getattr(t, "_requires_dependencies", None) or []:
                module, pip = d if isinstance(d, tuple) else (d, d)
                out.append((module, pip))
        return out

    @classmethod
    def user_code(cls, params: DatatroveParams) -> list[str]:
        """A class outside datatrove (a dotted path to the user's own): its source enters the
        hash (datatrove's own classes are covered by datatrove's version)."""
        ref = _reference(params.class_, "datatrove.pipeline.filters")
        return [] if ref.split(":")[0].split(".")[0] == "datatrove" else [ref]

    def __init__(self, params: DatatroveParams):
        super().__init__(params)
        self.inner = _resolve(params.class_, "datatrove.pipeline.filters")(**params.args)

    def apply(self, batch: pa.RecordBatch) -> FilterResult:
        from datatrove.data import Document

        ids = batch.column("id").to_pylist()
        out = [_normalise(self.inner.filter(Document(text=t, id=i))) for t, i in zip(batch.column("text").to_pylist(), ids)]
        return FilterResult(np.array([k for k, _ in out], dtype=bool), [r for _, r in out])


class PythonParams(FilterParams):
    type: Literal["python"] = "python"
    callable: str = Field(description="module:function (importable on every worker)")
    mode: Literal["document", "batch"] = Field("document", description="call it per text, or per Arrow batch")
    args: dict[str, Any] = Field(default_factory=dict, description="keyword arguments passed on each call")


@register_filter("python")
class PythonFilter(Filter):
    """A user function over a document's text or over an Arrow batch."""

    Params = PythonParams

    @classmethod
    def dependencies(cls, params: PythonParams) -> list[tuple[str | None, str | None]]:
        return [(_module_of(params.callable), None)]

    @classmethod
    def user_code(cls, params: PythonParams) -> list[str]:
        return [_reference(params.callable)]

    def __init__(self, params: PythonParams):
        super().__init__(params)
        self.fn = _resolve(params.callable)

    def apply(self, batch: pa.RecordBatch) -> FilterResult:
        p: PythonParams = self.params
        if p.mode == "batch":
            res = self.fn(batch, **p.args)
            if isinstance(res, FilterResult):
                return res
            keep, reasons = res
            keep = np.asarray(keep, dtype=bool)
            return FilterResult(keep, [None if k else (r or "removed") for k, r in zip(keep, reasons)])
        out = [_normalise(self.fn(t, **p.args)) for t in batch.column("text").to_pylist()]
        return FilterResult(np.array([k for k, _ in out], dtype=bool), [r for _, r in out])
