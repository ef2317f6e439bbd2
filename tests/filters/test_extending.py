"""docs/extending.md's filter example is the code that runs, and it behaves as the doc says."""

from __future__ import annotations

import re

import pyarrow as pa

from filters import base as filter_base
from tests.conftest import ROOT


def test_the_doc_shows_the_filter_that_runs():
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "extending.md").read_text(), re.S)
    assert (ROOT / "tests" / "filters" / "vowels_example.py").read_text() in blocks


def test_the_example_filter_keeps_prose_and_drops_gibberish_with_its_reason():
    from tests.filters import vowels_example  # registers min_vowels

    f = filter_base.build(filter_base.parse_params({"type": "min_vowels", "min_ratio": 0.25}))
    assert isinstance(f, vowels_example.VowelFilter)
    batch = pa.RecordBatch.from_pydict({"id": ["a", "b", "c"], "text": ["A sentence of plain prose.", "xkcd qwrt zzkf", "12345"]})
    res = f.apply(batch)
    assert list(res.keep) == [True, False, True] and res.reasons == [None, "too_few_vowels", None]
    off = filter_base.build(filter_base.parse_params({"type": "min_vowels", "min_ratio": None})).apply(batch)
    assert all(off.keep)
