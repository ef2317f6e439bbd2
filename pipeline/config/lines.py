"""Where a key is in the YAML file: key paths mapped to line numbers, and dotted names."""

from __future__ import annotations

import yaml


def walk(node: yaml.Node, loc: tuple, out: dict[tuple, int]) -> None:
    out.setdefault(loc, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = k.value
            out[loc + (key,)] = k.start_mark.line + 1
            walk(v, loc + (key,), out)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            out[loc + (i,)] = v.start_mark.line + 1
            walk(v, loc + (i,), out)


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
