"""Reference sections generated from the code, so the docs cannot drift from it.

    python -m pipeline.docs          print the generated blocks
    python -m pipeline.docs --write  rewrite them in their docs files (FILES) between their markers

Each block lives between `<!-- BEGIN name -->` and `<!-- END name -->` in the file FILES names.
tests/test_readme.py fails when a docs file and the code disagree.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# block name -> the file (relative to the repository root) that holds its markers
FILES = {
    "yaml-keys": "docs/yaml.md",
    "filters": "docs/filters.md",
}


def blocks() -> dict[str, str]:
    from filters.base import reference_markdown as filter_table
    from pipeline.config import reference_markdown as key_table

    return {"yaml-keys": key_table(), "filters": filter_table()}


def render(text: str, names: list[str] | None = None, where: str = "the text") -> str:
    """`text` with the generated blocks `names` (default: every block) rewritten between their markers."""
    generated = blocks()
    for name in generated if names is None else names:
        pat = re.compile(rf"(<!-- BEGIN {name} -->\n).*?(<!-- END {name} -->)", re.S)
        if not pat.search(text):
            raise SystemExit(f"{where} has no <!-- BEGIN {name} --> ... <!-- END {name} --> markers")
        text = pat.sub(lambda m, body=generated[name]: m.group(1) + body + "\n" + m.group(2), text)
    return text


def targets(root: Path = ROOT) -> dict[Path, list[str]]:
    """Each docs file that holds generated blocks, with the names of its blocks."""
    out: dict[Path, list[str]] = {}
    for name, rel in FILES.items():
        out.setdefault(root / rel, []).append(name)
    return out


def render_file(path: Path, names: list[str]) -> str:
    return render(path.read_text(), names, where=str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path))


if __name__ == "__main__":
    if "--write" in sys.argv:
        for path, names in targets().items():
            path.write_text(render_file(path, names))
            print(f"wrote {path}")
    else:
        for name, body in blocks().items():
            print(f"<!-- {name} ({FILES[name]}) -->\n{body}\n")
