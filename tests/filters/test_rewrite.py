"""Rewriters (filters/rewrite.py) and flagged words (filters/flagged.py): the ftfy rewriter
equals ftfy.fix_text on real text with mojibake planted in several encodings, each line rule
on hand-made cases, and a real run where rewritten text reaches the mixture and the ledger
counts the changes."""

from __future__ import annotations

import random

import ftfy
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from filters import base
from pipeline.io import atomic
from tests.conftest import curate, write_jsonl, write_yaml


def _batch(texts):
    return pa.record_batch({"id": [str(i) for i in range(len(texts))], "text": texts})


def _build(**p):
    return base.build(base.parse_params(p))


def _mojibake(text: str, rng: random.Random) -> str:
    """One of several real-world corruptions of (part of) a text."""
    kind = rng.randrange(7)
    if kind == 0:  # UTF-8 read as Windows-1252
        return text.encode("utf-8").decode("cp1252", errors="replace")
    if kind == 1:  # ... as Latin-1
        return text.encode("utf-8").decode("latin-1")
    if kind == 2:  # twice
        return text.encode("utf-8").decode("cp1252", errors="replace").encode("utf-8").decode("cp1252", errors="replace")
    if kind == 3:  # ... as Mac Roman
        return text.encode("utf-8").decode("mac_roman")
    if kind == 4:  # HTML entities and curly quotes
        return text.replace("'", "&#x27;").replace(" a ", " “a” ").replace("é", "&eacute;")
    if kind == 5:  # fullwidth letters, a ligature, CRLF
        return text.replace("A", "Ａ").replace("fi", "ﬁ").replace("\n", "\r\n")
    return text  # clean


@pytest.fixture(scope="module")
def planted(demo_corpus):
    rng = random.Random(3)
    texts = []
    for lang in ("fr", "es", "en"):
        t = pq.read_table(demo_corpus / "wiki" / f"summaries_{lang}.parquet", columns=["text"]).column("text").to_pylist()
        texts += t[:400]
    rng.shuffle(texts)
    return [_mojibake(t, rng) for t in texts[:1000]]


@pytest.mark.parametrize("opts", [{}, {"normalization": "NFKC", "uncurl_quotes": False},
                                  {"fix_encoding": False, "unescape_html": True}])
def test_ftfy_gives_ftfys_own_bytes(planted, opts):
    res = _build(type="ftfy", **opts).apply(_batch(planted))
    want = [ftfy.fix_text(t, ftfy.TextFixerConfig(**opts)) for t in planted]
    got = [n if n is not None else o for n, o in zip(res.texts, planted, strict=True)]
    assert got == want  # byte-identical, document by document
    changed = sum(1 for n in res.texts if n is not None)
    assert changed == int(res.changes["docs_changed"].sum()) and changed > 300  # most plants are repaired
    if not opts:
        clean = sum(1 for t in planted if ftfy.fix_text(t) == t)
        assert changed == len(planted) - clean


def test_every_line_rule_on_its_own_case():
    page = "\n".join([
        "HOME ABOUT CONTACT",            # upper case
        "Sign in",                       # short edge line (start)
        "The river flows north through the valley for many miles.[1]",
        "12 likes",                      # counter
        "1,204 comments",                # counter
        "2024-05-01 12:30",              # digits only
        "https://example.com/page?id=3",  # URL only
        "The river flows north through the valley for many miles.[1]",  # repeated
        "It was named in 1820 by settlers [citation needed] who farmed there.",
        "Share",                         # short edge line (end)
    ])
    lr = _build(type="line_remover", remove_repeated_lines=True, min_edge_words=3)
    new, c = lr.rewrite(page)
    assert new.split("\n") == ["The river flows north through the valley for many miles.",
                               "It was named in 1820 by settlers  who farmed there."]
    assert c == {"upper_lines": 1, "numeric_lines": 1, "counter_lines": 2, "url_lines": 1, "repeated_lines": 1,
                 "edge_lines": 2, "citations": 2, "chars_removed": len(page) - len(new)}
    # each rule is switchable
    off = _build(type="line_remover", max_upper_ratio=None, remove_numeric_lines=False, remove_counters=False,
                 remove_citations=False, remove_url_lines=False)
    assert off.rewrite(page)[0] == page
    # short capitals stay (too few letters), as do ordinary lines with numbers
    assert _build(type="line_remover").rewrite("OK\nIn 1990 the town had 3,000 people and two schools.")[0].startswith("OK")
    # a document losing too much is dropped, with the share in the reason
    strict = _build(type="line_remover", max_removed_fraction=0.05)
    res = strict.apply(_batch([page, "A plain line of ordinary text here.\nAnother plain line of text."]))
    assert res.keep.tolist() == [False, True] and res.reasons[0].startswith("too_many_lines_removed (")


def test_regex_replace_and_its_counts():
    rr = _build(type="regex_replace", pattern=r"(\d{3})-(\d{4})", replacement=r"<num \1>")
    res = rr.apply(_batch(["call 555-1234 or 555-9876", "nothing here"]))
    assert res.texts == ["call <num 555> or <num 555>", None]
    assert res.changes["spans"].tolist() == [2, 0] and res.changes["chars_replaced"].tolist() == [16, 0]
    with pytest.raises(Exception, match="not a valid regular expression"):
        base.parse_params({"type": "regex_replace", "pattern": "(unclosed"})


def test_flagged_words_ratio_phrases_and_drop(tmp_path):
    words = tmp_path / "flagged.txt"
    words.write_text("# a test list\nspamword\nbuy now\n")
    fw = _build(type="flagged_words", words_file=str(words), max_ratio=0.2)
    assert fw.count("Buy now! SPAMWORD deals, buy nowhere") == (3, 6)
    res = fw.apply(_batch(["buy now buy now spamword cheap", "a clean sentence about rivers and valleys"]))
    assert res.keep.tolist() == [False, True] and res.reasons[0].startswith("too_many_flagged_words (")
    assert np.allclose(res.scores["ratio"].to_numpy(), [5 / 6, 0.0])


def test_rewriters_in_a_run_reach_the_mixture_and_the_ledger(tmp_path):
    rows = [
        {"id": "moji", "text": "CafÃ© society met every week in the old town hall for many years."},
        {"id": "counters", "text": "12 likes\n3 comments\n1.2k views"},  # every line removed: emptied
        {"id": "mixed", "text": "NEWS FROM THE VALLEY\nThe valley had a long and quiet winter this year.[2]\n5 shares"},
        {"id": "clean", "text": "A clean document about rivers, hills and the weather in spring."},
    ]
    write_jsonl(tmp_path / "docs.jsonl", rows)
    y = write_yaml(tmp_path / "rw.yaml", """
        name: rw
        tokenizer: null
        sources:
          docs: {paths: [docs.jsonl], id_field: id, filters: [fix_unicode, lines]}
        filters:
          fix_unicode: {type: ftfy}
          lines: {type: line_remover}
    """)
    r = curate("run", str(y), "--output", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "out" / "rw"
    mixed = {x["id"]: x["text"] for x in pq.read_table(sorted((run / "mixture").glob("*.parquet"))).to_pylist()}
    assert mixed == {"moji": "Café society met every week in the old town hall for many years.",
                     "mixed": "The valley had a long and quiet winter this year.", "clean": rows[3]["text"]}
    led = atomic.read_json(run / "ledger.json")["sources"]["docs"]
    assert led["removed"]["filter:lines"] == {"emptied_by_rewrite": 1} and led["conservation"]
    st = {s["stage"]: s for s in led["stages"]}
    assert st["filter:fix_unicode"]["rewritten"]["docs"] == 1 and st["filter:fix_unicode"]["rewritten"]["docs_changed"] == 1
    r = curate("explain", str(run), "--id", "moji")  # before and after, where the text first changed
    assert r.returncode == 0 and "rewritten at character 3:" in r.stdout, r.stdout
    assert "before: 'CafÃ© society" in r.stdout and "after:  'Café society" in r.stdout, r.stdout
    assert st["filter:lines"]["rewritten"] == {"docs": 1, "upper_lines": 1, "counter_lines": 1, "citations": 1,
                                               "numeric_lines": 0, "url_lines": 0, "repeated_lines": 0, "edge_lines": 0,
                                               "chars_removed": len(rows[2]["text"]) - len(mixed["mixed"])}
