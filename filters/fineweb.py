"""FineWeb's quality rules (Penedo et al. 2024), as datatrove 0.10's `FineWebQualityFilter` applies them.

Same defaults and order; reasons keep datatrove's names (`line_punct_ratio`,
`short_line_ratio`, `char_dup_ratio`, `list_ratio`). `min_line_punct_ratio` is
datatrove's `line_punct_thr`, `max_short_line_ratio` its `short_line_thr`.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pyarrow as pa
from pydantic import Field

from filters import kernels
from filters.base import Filter, FilterParams, FilterResult, register_filter
from filters.gopher import find_duplicates

try:
    from datatrove.utils.text import TERMINAL_PUNCTUATION
except ImportError:  # pragma: no cover
    TERMINAL_PUNCTUATION = {".", "!", "?"}


_WORDS = "<needs the word count>"


class FineWebQualityParams(FilterParams):
    type: Literal["fineweb_quality"] = "fineweb_quality"
    min_line_punct_ratio: float | None = Field(0.12, description="share of lines ending in terminal punctuation below: line_punct_ratio")
    line_punct_exclude_zero: bool = Field(False, description="do not drop documents where no line ends in punctuation")
    max_short_line_ratio: float | None = Field(0.67, description="share of short lines above: short_line_ratio")
    short_line_length: int = Field(30, ge=0, description="a line of at most this many characters is short")
    max_char_dup_ratio: float | None = Field(0.01, description="characters in repeated lines per character above: char_dup_ratio")
    max_newline_word_ratio: float | None = Field(0.3, description="newlines per word above: list_ratio")
    stop_chars: list[str] | None = Field(None, description="line endings that count as terminal punctuation; default datatrove's set")
    language: str = Field("en", description="word splitting language (spaCy rules)")


@register_filter("fineweb_quality", libraries=("spacy", "datatrove"))
class FineWebQuality(Filter):
    """FineWeb quality rules: punctuated lines, short lines, repeated lines, list-like pages."""

    Params = FineWebQualityParams

    def __init__(self, params):
        super().__init__(params)
        self.stop_chars = tuple(params.stop_chars if params.stop_chars is not None else sorted(TERMINAL_PUNCTUATION))

    def apply(self, batch: pa.RecordBatch) -> FilterResult:
        texts = batch.column("text").to_pylist()
        reasons = [self.check(t) for t in texts]
        todo = [i for i, r in enumerate(reasons) if r is _WORDS]
        for g in kernels.groups([texts[i] for i in todo]):  # the documents that reach the list rule
            part = todo[g.start:g.stop]
            counts = kernels.batch_words([texts[i] for i in part], self.params.language).counts.tolist()
            for i, n in zip(part, counts):
                reasons[i] = self.check(texts[i], n)
        return FilterResult(np.array([r is None for r in reasons], dtype=bool), reasons)

    def check(self, text: str, n_words: int | None = None) -> str | None:
        """The rules in datatrove's order; `_WORDS` when the list rule needs the word count."""
        p: FineWebQualityParams = self.params
        lines = [ln for ln in text.split("\n") if ln.strip() != ""]
        if not lines:
            return "empty"
        n = len(lines)
        if p.min_line_punct_ratio is not None:
            ratio = sum(1 for ln in lines if ln.endswith(self.stop_chars)) / n
            if ratio < p.min_line_punct_ratio and not (ratio == 0 and p.line_punct_exclude_zero):
                return "line_punct_ratio"
        if p.max_short_line_ratio is not None:
            if sum(1 for ln in lines if len(ln) <= p.short_line_length) / n > p.max_short_line_ratio:
                return "short_line_ratio"
        if p.max_char_dup_ratio is not None:
            chars = len(text) - text.count("\n")
            if chars and find_duplicates(lines)[1] / chars > p.max_char_dup_ratio:
                return "char_dup_ratio"
        if p.max_newline_word_ratio is not None:
            if n_words is None:
                return _WORDS
            if n_words and text.count("\n") / n_words > p.max_newline_word_ratio:
                return "list_ratio"
        return None
