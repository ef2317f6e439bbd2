"""The README documents the code as it is: generated tables, commands, the two make targets."""

from __future__ import annotations

from pipeline import docs
from tests.conftest import ROOT


def test_generated_tables_match_the_code():
    readme = (ROOT / "README.md").read_text()
    assert docs.render(readme) == readme, "README.md is stale: run `python -m pipeline.docs --write`"


def test_every_cli_command_is_documented():
    from pipeline.cli import _parser

    readme = (ROOT / "README.md").read_text()
    sub = next(a for a in _parser()._actions if a.dest == "cmd")
    for name in sub.choices:
        assert f"`curate {name}" in readme, name
    assert readme.index("make demo") < readme.index("make test") < 1200
