"""README sections generated from the code, so the docs cannot drift from it.

    python -m pipeline.docs          print the generated blocks
    python -m pipeline.docs --write  rewrite them in README.md between their markers

tests/test_readme.py fails when README.md and the code disagree.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path


def blocks() -> dict[str, str]:
    from filters.base import reference_markdown as filter_table
    from pipeline.config import reference_markdown as key_table

    return {"yaml-keys": key_table(), "filters": filter_table()}


def render(readme: str) -> str:
    for name, body in blocks().items():
        pat = re.compile(rf"(<!-- BEGIN {name} -->\n).*?(<!-- END {name} -->)", re.S)
        if not pat.search(readme):
            raise SystemExit(f"README.md has no <!-- BEGIN {name} --> ... <!-- END {name} --> markers")
        readme = pat.sub(lambda m, body=body: m.group(1) + body + "\n" + m.group(2), readme)
    return readme


if __name__ == "__main__":
    path = Path(__file__).resolve().parents[1] / "README.md"
    if "--write" in sys.argv:
        path.write_text(render(path.read_text()))
        print(f"wrote {path}")
    else:
        for name, body in blocks().items():
            print(f"<!-- {name} -->\n{body}\n")
