"""What of the code enters a step's hash beside its config: the versions of the filter
types and classifier families it runs, the installed versions of the libraries whose
output it stores, and the digests of the user's source files it calls.

Why: a step is reused while its hash is unchanged, so whatever changes its output must be
in the hash. The config is; this is the code's part: a filter's `register_filter(version=...)`,
an upgraded ftfy or fastText, an edited `type: python` function. A stage's plan puts what
these functions build in `Step(code=...)`; engine/step.py adds the task's version and
hashes it into `code_hash`, and `curate plan` says "code changed" and what, when only that
differs from the last run.

    {"filters": {"gopher_quality": "2", "ftfy": "1"}, "libraries": {"ftfy": "6.3.1", "spacy": "3.8.18"},
     "callables": {"mypkg.rules:keep": "<sha256 of the file that defines it>"}}

Library versions are those of the distributions installed where the plan is made (read
once per process): a cluster's nodes should have the same (the Docker image does); a
library that is not installed there is recorded as None. `python` stands for the
interpreter's major.minor. A user function's digest is its source file's bytes (the file
that defines it, as a worker imports it): an edit anywhere in that file re-runs the steps
that call it; modules it imports are not followed.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import sys
from collections.abc import Iterable
from pathlib import Path

# import names whose distribution is named otherwise (tried in order; the first is Curate's own dependency)
DISTRIBUTIONS = {"fasttext": ("fasttext-numpy2-wheel", "fasttext", "fasttext-wheel")}


@functools.cache
def library_version(name: str) -> str | None:
    """The installed version of the package imported as `name` (its distribution's), or
    None; "python": the interpreter's major.minor (what date parsing and the like follow)."""
    if name == "python":
        return f"{sys.version_info.major}.{sys.version_info.minor}"
    from importlib import metadata

    for dist in DISTRIBUTIONS.get(name, (name,)):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    dists = _packages_distributions().get(name)  # an import name that is not its distribution's (~0.5 s, once)
    return metadata.version(dists[0]) if dists else None


@functools.cache
def _packages_distributions() -> dict[str, list[str]]:
    from importlib import metadata

    return dict(metadata.packages_distributions())


def source_digest(ref: str) -> str | None:
    """sha256 of the source file that defines `module:name` (the file a worker's import of it
    reads), read anew at every plan; None where there is none (a built-in; a module that is
    missing, which `curate validate` reports)."""
    mod, _, qual = ref.partition(":")
    path = None
    try:
        obj = importlib.import_module(mod)
        for part in qual.split("."):
            obj = getattr(obj, part)
        path = getattr(sys.modules.get(getattr(obj, "__module__", None) or mod), "__file__", None)
    except Exception:  # noqa: BLE001 -- the user's module failed to import: its file, found without running it
        try:
            spec = importlib.util.find_spec(mod)
            path = spec.origin if spec else None
        except (ImportError, ValueError):
            path = None
    if not path or not Path(path).is_file():
        return None
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def code(versions: dict[str, dict[str, str]] | None = None, libraries: Iterable[str] = (),
         callables: Iterable[str] = ()) -> dict:
    """A step's `code`: `versions` (section -> name -> version, e.g. {"filters": {...}}), the
    installed versions of `libraries` and the digests of `callables`; empty parts left out."""
    out = {k: dict(sorted(v.items())) for k, v in (versions or {}).items() if v}
    if libs := {n: library_version(n) for n in sorted(set(libraries))}:
        out["libraries"] = libs
    if calls := {r: source_digest(r) for r in sorted(set(callables))}:
        out["callables"] = calls
    return out


def filter_code(params: Iterable) -> dict:
    """A filter step's code: each filter type's registered version, the libraries the
    filters call, the user functions they name (`params`: the chain's FilterParams)."""
    from filters import base

    versions, libs, calls = {}, [], []
    for p in params:
        cls = base.filter_class(p.type)
        versions[p.type] = cls.version
        libs += cls.used_libraries(p)
        calls += cls.user_code(p)
    return code({"filters": versions}, libs, calls)


def family_code(type_name: str) -> dict:
    """The code of a step that trains, scores or predicts with a classifier family: its
    registered version and its libraries."""
    from filters.classifiers import family

    cls = type(family(type_name))
    return code({"classifier": {type_name: cls.version}}, cls.libraries)


def extract_code(spec: dict) -> dict:
    """The code of an ingest step that extracts web pages (`spec`: its `extract` mapping):
    resiliparse decodes every page, trafilatura extracts when picked, a `type: python`
    extractor is the user's function."""
    libs = ["resiliparse"] + (["trafilatura"] if spec["type"] == "trafilatura" else [])
    return code(None, libs, [spec["callable"]] if spec["type"] == "python" else [])


def portable(d: dict) -> dict:
    """`d` with an embedding given as a local folder (`model`, `embedding`) replaced by its
    files' identity, so a step's hash names the model's bytes, not where the folder lies."""
    from filters import embeddings

    out = dict(d)
    for k in ("model", "embedding"):
        v = out.get(k)
        if isinstance(v, str) and "/" in v and "://" not in v:
            ident = embeddings.identity(v)
            out[k] = f"{ident['backend']}:" + ",".join(f"{n}={h}" for n, h in sorted(ident["files"].items()))
    return out
