"""A mixture YAML file to a `LoadedMixture`, reporting every problem with its line.

Loading has three passes, each reporting every problem it finds, not only the first:
1. YAML is parsed with its node marks, so any key path maps back to a line.
2. pydantic validates shapes and types (`extra="forbid"`: a typo is an error); each
   `filters.<name>` mapping is validated by the registered type's own Params model, each
   `classifiers.<name>` by its family's (an unknown `type` lists the registered ones).
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
from filters import classifiers as classifier_registry
from pipeline.config.checks import check_references
from pipeline.config.lines import Refused, dotted, line_of, walk
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
    model, _ = _walk(loc, raw)
    if isinstance(model, type) and issubclass(model, BaseModel):
        return sorted(model.model_fields)
    return []


class _Union:
    """A discriminated union (`extract`, `classifiers.<name>`): its models by tag, and how
    the file's value picks one."""

    def __init__(self, variants: dict[str, type[BaseModel]], pick):
        self.variants = variants
        self.pick = pick

    def model(self, value: Any) -> Any:
        try:
            return self.variants.get(self.pick(value))
        except TypeError:  # an unhashable `type:` value
            return None


def _walk(loc: tuple, raw: dict) -> tuple[Any, tuple]:
    """(the model at `loc`, `loc` without the tags pydantic puts after a discriminated
    union: `classifiers.c.fasttext.epochs` is `classifiers.c.epochs` in the file)."""
    model: Any = Mixture
    value: Any = raw  # the file's value at the same place
    out = []
    for part in loc:
        if isinstance(model, _Union):
            if part in model.variants:  # pydantic's tag, not a key of the file
                model = model.variants[part]
                continue
            model = model.model(value)
        out.append(part)
        if isinstance(model, tuple):  # ("dict", value model): `part` is a name the user chose
            model = model[1]
        elif isinstance(model, type) and issubclass(model, BaseModel) and part in model.model_fields:
            model = _unwrap(model.model_fields[part].annotation)
        else:
            model = None
        value = value.get(part) if isinstance(value, dict) else None
    if isinstance(model, _Union):
        model = model.model(value)
    return model, tuple(out)


def _unwrap(ann: Any) -> Any:
    """The model behind an annotation: `X | None` -> X, `dict[str, X]` -> ("dict", X), a
    discriminated union -> _Union."""
    import types
    import typing

    origin = typing.get_origin(ann)
    if origin in (typing.Union, types.UnionType):
        return next(_unwrap(a) for a in typing.get_args(ann) if a is not type(None))
    if origin is dict:
        return ("dict", _unwrap(typing.get_args(ann)[1]))
    return union_of(ann) or ann


def union_of(ann: Any) -> _Union | None:
    """A discriminated union's models by their `type` and how a value picks one (`X | None`
    looked through), or None: `extract` (a `type` key) and `classifiers.<name>` (a `type`
    key with a default, pipeline/config/models.py)."""
    import types
    import typing

    from pydantic import Discriminator
    from pydantic.fields import FieldInfo

    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(ann) if a is not type(None)]
        ann = inner[0] if len(inner) == 1 else ann
    if typing.get_origin(ann) is not typing.Annotated:
        return None
    inner, *meta = typing.get_args(ann)  # one variant flattens to Annotated[X, Tag, Discriminator]
    union = typing.get_origin(inner) in (typing.Union, types.UnionType)
    variants = [typing.get_args(v)[0] if typing.get_origin(v) is typing.Annotated else v
                for v in (typing.get_args(inner) if union else (inner,))]
    if not all(isinstance(v, type) and issubclass(v, BaseModel) and "type" in v.model_fields for v in variants):
        return None
    for m in meta:
        if isinstance(m, Discriminator) and callable(m.discriminator):
            pick = m.discriminator
        elif isinstance(m, FieldInfo) and isinstance(m.discriminator, str):
            pick = lambda v, key=m.discriminator: v.get(key) if isinstance(v, dict) else None
        else:
            continue
        return _Union({typing.get_args(v.model_fields["type"].annotation)[0]: v for v in variants}, pick)
    return None


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
    if kind == "union_tag_invalid":  # a `type:` no variant has
        tag = err["ctx"]["tag"]
        if loc[:1] == ("classifiers",):
            try:
                classifier_registry.family(tag)
            except KeyError as e:  # the registry's own words: the known types
                return e.args[0]
        return f"unknown type {tag!r}; known types: {err['ctx']['expected_tags'].replace(chr(39), '')}"
    msg = err["msg"]
    if kind == "finite_number":  # YAML's .nan and .inf (or "nan" in quotes): every number of a mixture is finite
        return f"must be a finite number, not {err.get('input')!r}; give a number such as 0.25"
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
        loc = _walk(loc, raw)[1]
        if err["type"] == "union_tag_invalid":
            loc = (*loc, "type")
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
    except RecursionError:  # the parser recurses once per level
        raise UsageError(f"{path}:1: nested too deeply to read; a mixture file needs a few levels") from None
    lines: dict[tuple, int] = {}
    try:  # before anything reads `raw`: it may hold itself (a recursive alias) or expand hugely
        if node is not None:
            walk(node, (), lines)
    except Refused as e:
        raise UsageError(f"{path}:{e.line}: {e.message}") from None
    if not isinstance(raw, dict):
        raise UsageError(f"{path}:1: the mixture file must be a mapping with at least `name` and `sources`")

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
    plugin_stages, data["stages"] = _plugins(raw, problems)
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
        mixture = _resolve_embedding_paths(mixture, path.parent.resolve())
    if problems:
        raise UsageError(format_problems(path, lines, problems))
    return LoadedMixture(mixture, path, lines, raw, plugin_stages)


ENTRY_POINTS = "curate.stages"  # an installed package's stages: `[project.entry-points."curate.stages"] x = "pkg.mod:STAGE"`


def plugin_stages(modules: list[str]) -> tuple:
    """The stages of `modules` (a mixture's `plugins:`) and of installed packages' entry points,
    for what reads a finished run (its report, `curate explain`); one that cannot load is left out."""
    return _plugins({"plugins": list(modules)}, [])[0]


def _plugins(raw: dict, problems: list) -> tuple[tuple, dict]:
    """The STAGE of every installed package's `curate.stages` entry point and of every module
    `plugins:` names, and `stages:` parsed by each one's config model; what is wrong goes to
    `problems`, at its YAML key."""
    import importlib
    from importlib.metadata import entry_points

    names, found = raw.get("plugins") or [], []
    for ep in entry_points(group=ENTRY_POINTS):
        try:
            found.append(ep.load())
        except Exception as e:  # noqa: BLE001 -- an installed package's stage: which one, and why
            problems.append((("plugins",), f"the installed stage {ep.name!r} ({ep.value}, entry point group "
                             f"{ENTRY_POINTS}) cannot load: {type(e).__name__}: {e}"))
    for i, mod in enumerate(names if isinstance(names, list) else []):
        try:
            stage = getattr(importlib.import_module(str(mod)), "STAGE", None)
        except Exception as e:  # noqa: BLE001 -- the user's module: what failed, at its key
            problems.append((("plugins", i), f"cannot import {mod!r}: {type(e).__name__}: {e}; the module must be "
                             "importable where the run and its workers run (installed, or on PYTHONPATH)"))
            continue
        if not (callable(getattr(stage, "plan", None)) and isinstance(getattr(stage, "name", None), str)):
            problems.append((("plugins", i), f"module {mod!r} declares no STAGE (a pipeline.plan.stage.Stage); "
                             "see docs/extending.md"))
            continue
        found.append(stage)
    by_name = {s.name: s for s in found}
    parsed, sections = {}, raw.get("stages") or {}
    for name, section in (sections.items() if isinstance(sections, dict) else []):
        stage = by_name.get(name)
        if stage is None:
            problems.append((("stages", name), f"no plugin stage is named {name!r}" + (
                f" (plugins declare: {', '.join(sorted(by_name))})" if by_name else "; add its module to `plugins:`")))
        elif stage.config is None:
            problems.append((("stages", name), f"stage {name!r} takes no settings; remove this section"))
        else:
            try:
                parsed[name] = stage.config.model_validate(section or {})
            except ValidationError as e:
                problems.extend(_errors_from_pydantic(e, ("stages", name), raw))
    for name, stage in by_name.items():  # a stage whose settings all have defaults needs no section
        if name not in parsed and stage.config is not None and name not in sections:
            try:
                parsed[name] = stage.config()
            except ValidationError:
                problems.append((("stages",), f"stage {name!r} needs its settings: add `stages: {{{name}: ...}}`"))
    return tuple(found), parsed


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
                                           c.pretrained_key: absolute(c.pretrained) if c.pretrained else None,
                                           **({"annotations": absolute(c.annotations)} if getattr(c, "annotations", None)
                                              else {})})
    return m.model_copy(update={"classifiers": fixed})


def _folder(v: str, base: Path) -> str:
    """An embedding model given as a local folder (a path with a '/'), made absolute."""
    return str((base / v).resolve()) if "/" in v and "://" not in v and not Path(v).is_absolute() else v


def _resolve_embedding_paths(m: Mixture, base: Path) -> Mixture:
    """Embedding models named by a local folder (dedup.semantic.model, sources.<name>.topics.model and the
    `model` of embedding classifiers) are relative to the YAML file."""
    update: dict = {}
    if m.dedup and m.dedup.semantic:
        sem = m.dedup.semantic.model_copy(update={"model": _folder(m.dedup.semantic.model, base)})
        update["dedup"] = m.dedup.model_copy(update={"semantic": sem})
    sources = {s: spec.model_copy(update={"topics": spec.topics.model_copy(update={"model": _folder(spec.topics.model, base)})})
               if spec.topics else spec for s, spec in m.sources.items()}
    classifiers = {n: c.model_copy(update={"model": _folder(c.model, base)})
                   if c.pretrained_key != "model" and isinstance(getattr(c, "model", None), str) else c
                   for n, c in m.classifiers.items()}
    return m.model_copy(update={**update, "sources": sources, "classifiers": classifiers})


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
