"""The length filter: reasons name the failed bound; None switches a bound off, 0 does not."""

from __future__ import annotations

import pyarrow as pa
import pytest

from filters import base
from filters.length import LengthFilter, LengthParams


def _batch(texts):
    return pa.RecordBatch.from_pydict({"id": [str(i) for i in range(len(texts))], "text": texts})


def test_reasons_follow_the_order_of_checks():
    f = LengthFilter(LengthParams(min_chars=5, max_chars=30, min_words=2, max_words=4))
    res = f.apply(_batch(["hey", "one two three", "onlyoneword", "a b c d e f", "x" * 40]))
    assert res.keep.tolist() == [False, True, False, False, False]
    assert res.reasons == ["too_few_chars", None, "too_few_words", "too_many_words", "too_many_chars"]
    assert res.scores["n_words"].to_pylist() == [1, 3, 1, 6, 1]


def test_none_is_off_and_zero_is_a_threshold():
    assert LengthFilter(LengthParams()).apply(_batch(["", "a"])).keep.tolist() == [True, True]
    res = LengthFilter(LengthParams(max_words=0)).apply(_batch(["", "a"]))
    assert res.keep.tolist() == [True, False] and res.reasons == [None, "too_many_words"]


def test_registry_lookup_and_helpful_miss():
    assert base.filter_class("length") is LengthFilter
    with pytest.raises(KeyError, match="unknown filter type 'lenght'; known types: .*length"):
        base.filter_class("lenght")
    with pytest.raises(ValueError, match="registered twice: filters.length.LengthFilter and .*Other"):
        @base.register_filter("length")
        class Other(base.Filter):
            Params = LengthParams


def test_curate_filters_lists_parameters():
    text = base.describe_registry()
    assert "length (v1): Document length bounds" in text
    assert "    min_chars: int | None, default None. drop documents with fewer characters" in text


def test_builtin_modules_map_every_builtin_type_to_its_family_and_a_worker_imports_only_those():
    import subprocess
    import sys

    import re
    from pathlib import Path

    assert {name: cls.__module__ for name, cls in base.registry().items()
            if cls.__module__.startswith("filters.")} == base.BUILTIN_MODULES
    # every module that registers a type is in the map (else registry() would never import it)
    registering = {f"filters.{f.stem}" for f in Path(base.__file__).parent.glob("*.py")
                   if f.stem != "base" and re.search(r"^@register_filter\(", f.read_text(), re.M)}
    assert registering == set(base.BUILTIN_MODULES.values())
    code = ("import sys; from filters import base; base.build(base.parse_params({'type': 'gopher_repetition'})); "
            "print(sorted(m for m in sys.modules if m.startswith('filters.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = eval(out)
    assert "filters.gopher" in loaded and not {"filters.pii", "filters.rewrite", "filters.adapters", "filters.language"} & set(loaded)
