"""A registry of named extension types (the Dolma idea): filter types and classifier
families each have one. A type registers itself with a class decorator under the name the
YAML's `type:` uses, with its version and the libraries whose output it stores (both
enter the step hash: pipeline/plan/code.py); a lookup imports the built-in module that
registers a name (so a worker imports only the families its chain uses), and a miss lists
the known names."""

from __future__ import annotations

import importlib
from collections.abc import Callable


class Registry:
    def __init__(self, kind: str, builtin_modules: dict[str, str], hint: str = "", builtin_first: bool = False):
        self.kind = kind  # "filter", "classifier": the word in messages
        self.builtin_modules = builtin_modules  # name -> the module that registers it
        self.hint = hint  # appended to a miss, e.g. which command lists them
        self.builtin_first = builtin_first  # list the built-in ones in their map's order (the first is a default)
        self.types: dict[str, type] = {}

    def register(self, name: str, version: str = "1", libraries: tuple[str, ...] = (),
                 check: Callable[[str, type], None] | None = None):
        """Class decorator: register `cls` under `name`; sets its name, version, libraries
        and a description from its docstring's first line. `version` (bump it when the
        type's output changes for the same parameters) and the installed versions of
        `libraries` (import names of the packages whose output the type stores) enter the
        hash of every step that runs it."""

        def wrap(cls: type) -> type:
            other = self.types.get(name)
            if other is not None and other is not cls:
                raise ValueError(f"{self.kind} type {name!r} is registered twice: {other.__module__}.{other.__qualname__} "
                                 f"and {cls.__module__}.{cls.__qualname__}; rename one")
            if check is not None:
                check(name, cls)
            cls.name = name
            cls.version = version
            cls.libraries = tuple(libraries)
            if not cls.description and cls.__doc__:
                cls.description = cls.__doc__.strip().splitlines()[0]
            self.types[name] = cls
            return cls

        return wrap

    def all(self) -> dict[str, type]:
        """Every registered type, the built-in modules imported first."""
        for module in dict.fromkeys(self.builtin_modules.values()):
            importlib.import_module(module)  # registers its types
        if not self.builtin_first:
            return dict(sorted(self.types.items()))
        builtin = [n for n in self.builtin_modules if n in self.types]
        return {n: self.types[n] for n in builtin + sorted(set(self.types) - set(builtin))}

    def get(self, name: str) -> type:
        """The type registered as `name`; an unknown name is a KeyError listing the known ones."""
        cls = self.types.get(name)
        if cls is None and name in self.builtin_modules:
            importlib.import_module(self.builtin_modules[name])
            cls = self.types.get(name)
        if cls is None:
            known = self.all()
            if name not in known:
                raise KeyError(f"unknown {self.kind} type {name!r}; known types: {', '.join(known)}{self.hint}")
            cls = known[name]
        return cls
