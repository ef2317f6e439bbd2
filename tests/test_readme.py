"""The README and docs/ document the code as it is: generated tables, commands, links, the two make targets."""

from __future__ import annotations

import re

from pipeline import docs
from tests.conftest import ROOT

# Linked from the README and written on another branch; drop an entry once its file is merged.


def _markdown_files():
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _outside_fences(text: str) -> str:
    """The text without its fenced code blocks (``` or ````), where links and headings are not markdown."""
    out, fence = [], None
    for line in text.split("\n"):
        m = re.match(r"^(`{3,})", line)
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None and line.startswith(fence) and line.strip() == fence:
            fence = None
        elif fence is None:
            out.append(line)
    return "\n".join(out)


def _anchors(path) -> set[str]:
    """GitHub's anchors for the headings of a markdown file."""
    found = set()
    for line in _outside_fences(path.read_text()).split("\n"):
        m = re.match(r"^#{1,6}\s+(.*?)\s*$", line)
        if m:
            title = re.sub(r"[^\w\- ]", "", m.group(1).replace("`", "").lower())
            found.add(title.replace(" ", "-"))
    return found


def test_generated_tables_match_the_code():
    targets = docs.targets()
    assert set(sum(targets.values(), [])) == set(docs.blocks()), "every generated block needs a file in docs.FILES"
    for path, names in targets.items():
        text = path.read_text()
        assert docs.render(text, names) == text, f"{path.name} is stale: run `python -m pipeline.docs --write`"
    for path in _markdown_files():  # no stale copy of a block elsewhere
        for name in re.findall(r"<!-- BEGIN ([\w-]+) -->", path.read_text()):
            assert ROOT / docs.FILES[name] == path, f"{path.name} holds block {name}, which docs.FILES puts in {docs.FILES[name]}"


def test_every_cli_command_is_documented():
    from pipeline.cli import _parser

    text = "\n".join(p.read_text() for p in _markdown_files())
    sub = next(a for a in _parser()._actions if a.dest == "cmd")
    for name in sub.choices:
        assert f"`curate {name}" in text, f"`curate {name}` is in neither README.md nor docs/*.md"


def test_the_readme_starts_with_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert readme.index("make demo") < readme.index("make test") < 1200


def test_the_readme_is_short():
    readme = (ROOT / "README.md").read_text()
    lines = readme.count("\n") + (not readme.endswith("\n"))
    assert lines <= 300, f"README.md has {lines} lines (at most 300): move reference material to docs/"
    for block in re.split(r"\n\s*\n", _outside_fences(readme)):
        # a paragraph, or one item of a list, or one row of a table
        for para in re.split(r"\n(?=\s*(?:[-*|]|\d+\.)\s)", block):
            assert len(para) <= 1500, f"README.md paragraph of {len(para)} characters (at most 1,500): {para[:80]!r}"


def test_relative_links_point_at_files_and_headings():
    for path in _markdown_files():
        text = _outside_fences(path.read_text())
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            assert dest.exists(), f"{path.relative_to(ROOT)}: link to {target}: no such file"
            if anchor and dest.suffix == ".md":
                assert anchor in _anchors(dest), f"{path.relative_to(ROOT)}: link to {target}: no such heading"


def test_the_readme_says_a_mixture_file_must_be_trusted_like_code():
    """A mixture YAML imports code (`type: python` callables, datatrove classes by dotted
    path): the README says so, beside what Curate does read as data only."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Trust: a mixture file is code\n", 1)[1].split("\n## ", 1)[0]
    for said in ("`type: python`", "`callable:`", "`type: datatrove`", "dotted path", "Run only mixture files you would run as scripts"):
        assert said in section, said
    from filters import adapters  # the keys the README names are the ones that import code
    from pipeline.config import PythonExtract

    assert adapters.DatatroveParams.model_fields["class_"].alias == "class"
    assert "callable" in adapters.PythonParams.model_fields and "callable" in PythonExtract.model_fields


def test_docs_are_scannable_no_prose_line_over_800_characters_and_a_summary_first():
    """Every page of docs/ opens with its summary (a paragraph right after the title), and no
    prose line (outside code blocks and tables) is over 800 characters: a paragraph that long
    is a list or a table waiting to be written."""
    long, no_summary = [], []
    for f in sorted((ROOT / "docs").glob("*.md")):
        lines = _outside_fences(f.read_text()).split("\n")
        long += [f"{f.name}:{i} ({len(x)} chars)" for i, x in enumerate(lines, 1)
                 if not x.startswith("|") and len(x) > 800]
        body = [x for x in lines[1:] if x.strip()]
        if not lines[0].startswith("# ") or not body or body[0].startswith(("#", "|", "-", "*", "<!--")):
            no_summary.append(f.name)
    assert not long, "prose lines over 800 characters (split them into lists, tables or short paragraphs): " + ", ".join(long)
    assert not no_summary, f"pages that do not open with a summary after their title: {no_summary}"


def test_docs_prose_paragraphs_are_at_most_120_words():
    """A prose paragraph of docs/ (consecutive lines that are not a heading, a table, a list
    item, a quote, an indented continuation or code) holds at most 120 words: past that it is
    a list, a table or two paragraphs waiting to be written."""
    long = []
    for f in sorted((ROOT / "docs").glob("*.md")):
        para, start = [], 0
        lines = f.read_text().split("\n") + [""]
        fenced = False
        for i, x in enumerate(lines, 1):
            if x.startswith("```"):
                fenced = not fenced
            s = x.strip()
            prose = not fenced and s and not x.startswith("```") and not s.startswith(("|", "#", "- ", "* ", ">")) \
                and not re.match(r"^\d+\. ", s) and not x.startswith("  ")
            if prose:
                start = start if para else i
                para.append(s)
                continue
            if para and len(" ".join(para).split()) > 120:
                long.append(f"{f.name}:{start} ({len(' '.join(para).split())} words)")
            para = []
    assert not long, "prose paragraphs over 120 words (a list, a table or two paragraphs): " + ", ".join(long)
