"""Length filters: the cheapest first cut, in characters and words.

Vectorised with pyarrow.compute: no Python loop over documents.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from filters.base import Filter, FilterParams, FilterResult, register_filter


class LengthParams(FilterParams):
    type: Literal["length"] = "length"
    min_chars: int | None = Field(None, ge=0, description="drop documents with fewer characters")
    max_chars: int | None = Field(None, ge=0, description="drop documents with more characters")
    min_words: int | None = Field(None, ge=0, description="drop documents with fewer whitespace-separated words")
    max_words: int | None = Field(None, ge=0, description="drop documents with more whitespace-separated words")
    min_lines: int | None = Field(None, ge=0, description="drop documents with fewer non-blank lines")
    max_lines: int | None = Field(None, ge=0, description="drop documents with more non-blank lines")


@register_filter("length")
class LengthFilter(Filter):
    """Document length bounds in characters, whitespace-separated words and non-blank lines."""

    Params = LengthParams

    def apply(self, batch: pa.RecordBatch) -> FilterResult:
        p: LengthParams = self.params
        text = batch.column("text")
        n = batch.num_rows
        keep = np.ones(n, dtype=bool)
        reasons: list[str | None] = [None] * n
        chars = pc.utf8_length(text).to_numpy(zero_copy_only=False)
        words = pc.count_substring_regex(text, r"\S+").to_numpy(zero_copy_only=False)
        lines = pc.count_substring_regex(text, r"(?m)^.*\S.*$").to_numpy(zero_copy_only=False)
        checks = [
            (p.min_chars, chars < (p.min_chars or 0), "too_few_chars"),
            (p.max_chars, chars > (p.max_chars or 0), "too_many_chars"),
            (p.min_words, words < (p.min_words or 0), "too_few_words"),
            (p.max_words, words > (p.max_words or 0), "too_many_words"),
            (p.min_lines, lines < (p.min_lines or 0), "too_few_lines"),
            (p.max_lines, lines > (p.max_lines or 0), "too_many_lines"),
        ]
        for threshold, failed, reason in checks:
            if threshold is None:
                continue
            newly = failed & keep
            for i in np.flatnonzero(newly):
                reasons[i] = reason
            keep &= ~failed
        return FilterResult(keep, reasons, {"n_words": pa.array(words, pa.int64())})
