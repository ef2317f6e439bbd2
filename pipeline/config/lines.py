"""Where a key is in the YAML file: key paths mapped to line numbers, and dotted names.

Mapping keys to lines is also where a document's shape is first seen whole, so the walk
refuses the shapes nothing after it could survive, with the line: a key given twice in one
mapping (YAML keeps the last silently: two sources named `web`), an alias that contains
itself (YAML allows it; validating it recursed without end), aliases that expand to a
huge document from a small file ("billion laughs"), and nesting no mixture needs.
"""

from __future__ import annotations

import yaml

MAX_DEPTH = 64  # a mixture is a few levels deep; a filter's `args` a few more
MAX_ALIAS_NODES = 100_000  # nodes repeated through aliases; a file without aliases repeats none


class Refused(ValueError):
    """A YAML document refused before validation: the line and why."""

    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line = line
        self.message = message


def walk(node: yaml.Node, loc: tuple, out: dict[tuple, int]) -> None:
    """Fill `out` with the line of every key path under `node`; raises Refused."""
    _walk(node, loc, out, set(), {}, 0)


def _walk(node: yaml.Node, loc: tuple, out: dict, path: set, seen: dict, depth: int) -> None:
    out.setdefault(loc, node.start_mark.line + 1)
    here = out[loc]
    if id(node) in path:
        raise Refused(here, f"{dotted(loc)}: an alias to a value that contains it (anchored at line "
                            f"{node.start_mark.line + 1}): a recursive value has no end; repeat a value, do not nest it in itself")
    if depth > MAX_DEPTH:
        raise Refused(here, f"{dotted(loc)}: nested deeper than {MAX_DEPTH} levels; a mixture file needs a few")
    if isinstance(node, yaml.MappingNode):
        items = [(k.value if isinstance(k, yaml.ScalarNode) else f"<{k.tag}>", k, v) for k, v in node.value]
        first: dict = {}
        for key, k, _ in items:  # YAML keeps the last of two equal keys and says nothing: two sources named web
            if key in first and key != "<<":
                raise Refused(k.start_mark.line + 1, f"{dotted(loc + (key,))}: given twice, at lines {first[key]} and "
                                                     f"{k.start_mark.line + 1}; YAML would keep the second silently: "
                                                     "rename one (or merge them)")
            first.setdefault(key, k.start_mark.line + 1)
    elif isinstance(node, yaml.SequenceNode):
        items = [(i, v, v) for i, v in enumerate(node.value)]
    else:
        return
    if id(node) in seen:  # reached again through an alias: its values count again
        seen[None] = seen.get(None, 0) + len(items)
        if seen[None] > MAX_ALIAS_NODES:
            raise Refused(out[loc[:1]], f"{dotted(loc[:1])}: aliases expand the file to over {MAX_ALIAS_NODES:,} "
                                        "values here; write the values out, or nest fewer aliases")
    seen[id(node)] = True
    path.add(id(node))
    for key, at, v in items:
        out[loc + (key,)] = at.start_mark.line + 1
        _walk(v, loc + (key,), out, path, seen, depth + 1)
    path.discard(id(node))


def line_of(lines: dict[tuple, int], loc: tuple) -> int:
    loc = tuple(loc)
    while loc and loc not in lines:
        loc = loc[:-1]
    return lines.get(loc, 1)


def dotted(loc: tuple) -> str:
    s = ""
    for part in loc:
        s += f"[{part}]" if isinstance(part, int) else (f".{part}" if s else str(part))
    return s or "(top level)"
