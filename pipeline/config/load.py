"""A mixture YAML file to a `LoadedMixture`, reporting every problem with its line.

Loading has three passes, each reporting every problem it finds, not only the first:
1. YAML is parsed with its node marks, so any key path maps back to a line.
2. pydantic validates shapes and types (`extra="forbid"`: a typo is an error); each
   `filters.<name>` mapping is validated by the registered type's own Params model.
3. References between sections are checked (filters, classifiers, sources, weights:
   config/checks.py).

An error reads `mixtures/x.yaml:12: sources.web.filters[2]: unknown filter 'gopher';
defined: english, gopher_quality`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from filters import base as filter_base
from pipeline.config.checks import check_references
from pipeline.config.lines import dotted, line_of, walk
from pipeline.config.models import LoadedMixture, Mixture
from pipeline.errors import UsageError


def _allowed_keys(loc: tuple, raw: dict) -> list[str]:
    """The keys the model at `loc` accepts, for 'unknown key' messages."""
    if len(loc) == 2 and loc[0] == "filters":
        spec = (raw.get("filters") or {}).get(loc[1])
        try:
            return sorted(f.alias or n for n, f in filter_base.filter_class(spec["type"]).Params.model_fields.items())
        except (KeyError, TypeError):
            return []
    model: Any = Mixture
    for part in loc:
        if isinstance(model, tuple):  # ("dict", value model): `part` is a name the user chose
            model = model[1]
        elif isinstance(model, type) and issubclass(model, BaseModel) and part in model.model_fields:
            model = _unwrap(model.model_fields[part].annotation)
        else:
            return []
    if isinstance(model, type) and issubclass(model, BaseModel):
        return sorted(model.model_fields)
    return []


def _unwrap(ann: Any) -> Any:
    """The model behind an annotation: `X | None` -> X, `dict[str, X]` -> ("dict", X)."""
    import types
    import typing

    origin = typing.get_origin(ann)
    if origin in (typing.Union, types.UnionType):
        return next(_unwrap(a) for a in typing.get_args(ann) if a is not type(None))
    if origin is dict:
        return ("dict", _unwrap(typing.get_args(ann)[1]))
    return ann


def _format_pydantic(err: dict, loc: tuple, raw: dict) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        import difflib

        allowed = _allowed_keys(loc[:-1], raw)
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
        guess = f"; did you mean {close[0]!r}?" if close else ""
        hint = f"; allowed keys: {', '.join(allowed)}" if allowed else ""
        return f"unknown key {loc[-1]!r}{guess}{hint}"
    if kind == "missing":
        return "required key is missing"
    msg = err["msg"]
    if kind == "value_error":  # our validators' own words say what is wrong and what to do
        return msg.removeprefix("Value error, ")
    if "input" in err and kind not in ("model_type", "dict_type"):
        inp = err["input"]
        shown = repr(inp) if not isinstance(inp, (dict, list)) else type(inp).__name__
        if len(shown) > 60:
            shown = shown[:57] + "..."
        msg += f" (got {shown})"
    return msg


def _errors_from_pydantic(exc: ValidationError, prefix: tuple, raw: dict) -> list[tuple[tuple, str]]:
    out = []
    for err in exc.errors():
        loc = prefix + tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p))
        out.append((loc, _format_pydantic(err, loc, raw)))
    return out


def load(path: str | Path) -> LoadedMixture:
    """Parse and validate a mixture YAML; raise UsageError listing every problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{path}: no such mixture file; see mixtures/ for examples") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: cannot read the mixture file: {e}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f"{mark.line + 1}" if mark else "1"
        problem = getattr(e, "problem", None) or str(e)
        raise UsageError(f"{path}:{line}: not valid YAML: {problem}") from None
    if not isinstance(raw, dict):
        raise UsageError(f"{path}:1: the mixture file must be a mapping with at least `name` and `sources`")
    lines: dict[tuple, int] = {}
    if node is not None:
        walk(node, (), lines)

    problems: list[tuple[tuple, str]] = []
    data = dict(raw)
    parsed_filters = {}
    raw_filters = raw.get("filters") or {}
    if isinstance(raw_filters, dict):
        for fname, spec in raw_filters.items():
            try:
                parsed_filters[fname] = filter_base.parse_params(spec)
            except KeyError as e:
                problems.append((("filters", fname, "type"), e.args[0]))
            except ValidationError as e:
                problems.extend(_errors_from_pydantic(e, ("filters", fname), raw))
        data["filters"] = parsed_filters
    mixture = None
    try:
        mixture = Mixture.model_validate(data)
    except ValidationError as e:
        problems.extend(
            p for p in _errors_from_pydantic(e, (), raw) if not (p[0][:1] == ("filters",) and len(p[0]) > 2)
        )
    if mixture is not None and not problems:
        problems.extend(check_references(mixture))
        mixture = _resolve_filter_paths(mixture, path.parent.resolve())
        mixture = _resolve_classifier_paths(mixture, path.parent.resolve())
    if problems:
        raise UsageError(format_problems(path, lines, problems))
    return LoadedMixture(mixture, path, lines, raw)


def _resolve_classifier_paths(m: Mixture, base: Path) -> Mixture:
    """Classifier model files and example files are relative to the YAML file."""
    fixed = {}
    for name, c in m.classifiers.items():
        def absolute(v: str) -> str:
            return v if v in m.sources or "://" in v or Path(v).is_absolute() else str((base / v).resolve())
        fixed[name] = c.model_copy(update={"positive": [absolute(v) for v in c.positive],
                                           "negative": [absolute(v) for v in c.negative],
                                           "labels": {k: [absolute(v) for v in vs] for k, vs in c.labels.items()}
                                           if c.labels is not None else None,
                                           "model": absolute(c.model) if c.model else None})
    return m.model_copy(update={"classifiers": fixed})


def _resolve_filter_paths(m: Mixture, base: Path) -> Mixture:
    """File parameters of filters (`is_path`) are relative to the YAML file: make them absolute."""
    fixed = {}
    for name, params in m.filters.items():
        update = {}
        for field in filter_base.path_fields(params):
            value = getattr(params, field, None)
            if isinstance(value, str) and "://" not in value and not Path(value).is_absolute():
                update[field] = str((base / value).resolve())
        fixed[name] = params.model_copy(update=update) if update else params
    return m.model_copy(update={"filters": fixed})


def format_problems(path: Path, lines: dict, problems: list[tuple[tuple, str]]) -> str:
    problems = sorted(set(problems), key=lambda p: (line_of(lines, p[0]), dotted(p[0])))
    return "\n".join(f"{path}:{line_of(lines, loc)}: {dotted(loc)}: {msg}" for loc, msg in problems)
