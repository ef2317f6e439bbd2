"""The YAML key table of docs/, generated from the models' fields and descriptions
(pipeline/docs.py writes it; tests/test_readme.py fails when it is stale)."""

from __future__ import annotations

from pydantic import BaseModel

from filters import base as filter_base
from filters.base import type_name as _type_name
from pipeline.config.models import Mixture


def reference_markdown() -> str:
    """docs/yaml.md's key table, generated from the models' fields and descriptions."""
    import typing

    rows = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]

    def walk(model: type[BaseModel], prefix: str, skip: tuple = ()):
        for name, f in model.model_fields.items():
            if name in skip:
                continue
            key = f"{prefix}{name}"
            value = None if f.is_required() else f.get_default(call_default_factory=True)
            default = "required" if f.is_required() else ("see below" if isinstance(value, BaseModel) else repr(value))
            desc = (f.description or "").replace("|", "/")
            rows.append(f"| `{key}` | {_type_name(f.annotation)} | {default} | {desc} |")
            args = typing.get_args(f.annotation)
            variants = _variants(f.annotation)
            if variants:  # a union picked by `type`: each variant's own keys under extract.<type>
                rows[-1] = rows[-1].replace(_type_name(f.annotation), "mapping or null", 1)
                each_variant(variants, key)
                continue
            if typing.get_origin(f.annotation) is dict:
                if _variants(args[1]):  # `classifiers`: each family's keys under classifiers.<name>.<key>
                    rows[-1] = rows[-1].replace(_type_name(f.annotation), "map of mapping", 1)
                    each_variant(_variants(args[1]), f"{key}.<name>")
                elif isinstance(args[1], type) and issubclass(args[1], BaseModel) and args[1] is not filter_base.FilterParams:
                    walk(args[1], f"{key}.<name>.")
                continue
            for m in args or (f.annotation,):
                if isinstance(m, type) and issubclass(m, BaseModel):
                    walk(m, f"{key}.")

    def each_variant(variants: list[type[BaseModel]], key: str):
        for m in variants:
            t = typing.get_args(m.model_fields["type"].annotation)[0]
            doc = " ".join((m.__doc__ or "").split()).replace("|", "/")
            rows.append(f"| `{key}` with `type: {t}` | | | {doc} |")
            walk(m, f"{key}.", skip=("type",))

    walk(Mixture, "")
    return "\n".join(rows)


def _variants(ann) -> list[type[BaseModel]]:
    """The models of a discriminated union picked by `type` (`X | None` or not), else []."""
    from pipeline.config.load import union_of

    u = union_of(ann)
    return list(u.variants.values()) if u else []
