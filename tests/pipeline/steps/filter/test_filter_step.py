"""The filter step in a real run: order, first failing filter, scores, and C4's rewrite flowing downstream."""

from __future__ import annotations

import orjson
import pyarrow.parquet as pq

from pipeline import config
from pipeline.run import runner
from pipeline.plan import tokens
from pipeline.io import atomic
from tests.conftest import curate, write_yaml

GOOD = "The cat sat on the mat and looked at the dog."
DOC = "\n".join([GOOD] * 5 + ["Enable javascript to see the menu please.", "We use cookies to track you here."])


def _run(tmp_path, c4_extra: str):
    (tmp_path / "d").mkdir(exist_ok=True)
    recs = [{"text": DOC}, {"text": "Buy cookies now"}, {"text": GOOD}]
    (tmp_path / "d" / "a.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
    y = write_yaml(tmp_path / "m.yaml", f"""
        name: rw
        sources:
          s: {{paths: ["d/*.jsonl"], filters: [c4, no_cookies]}}
        filters:
          c4: {{type: c4_quality, min_sentences: 5{c4_extra}}}
          no_cookies: {{type: regex, pattern: cookies, reason: mentions_cookies}}
    """)
    return runner.run(config.load(y), log=lambda m: None)


def test_first_failing_filter_is_the_stage_and_later_filters_do_not_run(ray_local, tmp_path):
    run_dir = _run(tmp_path, "")
    attrs = pq.read_table(next((run_dir / "steps").glob("filter-s-*")) / "part-00000.parquet").to_pylist()
    assert [(a["keep"], a["stage"], a["reason"]) for a in attrs] == [
        (False, "no_cookies", "mentions_cookies"),  # c4 decides only: the cookie line is still in the text
        (False, "c4", "too_few_sentences"),
        (False, "c4", "too_few_sentences")]
    led = atomic.read_json(run_dir / "ledger.json")["sources"]["s"]
    assert led["removed"] == {"filter:c4": {"too_few_sentences": 2}, "filter:no_cookies": {"mentions_cookies": 1}}
    assert [st["docs_in"] for st in led["stages"][1:3]] == [3, 1]


def test_c4_rewrite_changes_the_text_downstream(ray_local, tmp_path):
    run_dir = _run(tmp_path, ", rewrite: true")
    rows = pq.read_table(run_dir / "mixture").to_pylist()
    expected = "\n".join([GOOD] * 5)
    assert [r["text"] for r in rows] == [expected]  # javascript and cookie lines dropped; the regex no longer matches
    assert rows[0]["n_tokens"] == tokens.count("gpt2", [expected])[0]
    led = atomic.read_json(run_dir / "ledger.json")["sources"]["s"]
    c4 = next(st for st in led["stages"] if st["stage"] == "filter:c4")
    assert c4["chars_out"] == len(expected) and led["conservation"] is True
    r = curate("explain", str(run_dir), "--id", rows[0]["id"])
    assert f"text rewritten               {len(DOC):,} -> {len(expected):,} chars" in r.stdout


def test_scores_stay_on_their_rows_and_are_null_where_a_filter_did_not_look():
    import pyarrow as pa

    from filters import base
    from pipeline.steps.filter import filter_batch

    texts = ["a b c d e f", "x", "one two three four", "", "p q r s t u v w"]
    batch = pa.RecordBatch.from_pydict({"id": list("abcde"), "text": texts, "metadata": [None] * 5,
                                        "n_chars": [len(t) for t in texts], "n_tokens": [1] * 5})
    chain = [("short", base.build(base.parse_params({"type": "length", "min_words": 2}))),
             ("long", base.build(base.parse_params({"type": "length", "max_words": 5})))]
    stages = {k: {"docs_in": 0, "docs_out": 0, "chars_in": 0, "chars_out": 0, "tokens_in": 0, "tokens_out": 0, "removed": {}}
              for k, _ in chain}
    t = filter_batch(batch, chain, stages)
    assert t.column("short.n_words").to_pylist() == [6, 1, 4, 0, 8]
    assert t.column("long.n_words").to_pylist() == [6, None, 4, None, 8]
    assert t.column("stage").to_pylist() == ["long", "short", None, "short", "long"]
    assert (stages["long"]["docs_in"], stages["long"]["docs_out"]) == (3, 1)
