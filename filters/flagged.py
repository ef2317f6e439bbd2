"""Flagged words: drop a document whose share of words from a word list is above a threshold.

As in the ROOTS / BigScience and Dolma pipelines: the list is the user's file (one word or
phrase a line, `#` comments; the demo ships a small one written for the project); words
are lower-cased word-character runs (`\\w+`, so it works in any script with spaces),
phrases match as consecutive words. The ratio is flagged words over all words.
"""

from __future__ import annotations

import re
from typing import Literal

import numpy as np
import pyarrow as pa
from pydantic import Field

from filters.base import Filter, FilterParams, FilterResult, list_lines, register_filter

WORD = re.compile(r"\w+", re.UNICODE)


class FlaggedWordsParams(FilterParams):
    type: Literal["flagged_words"] = "flagged_words"
    words_file: str = Field(description="a word list, one word or phrase a line, # for comments (relative to the YAML file)",
                            json_schema_extra={"is_path": True})
    max_ratio: float | None = Field(0.01, ge=0, le=1, description="drop a document whose flagged words are more than this "
                                    "share of its words; null: only score")
    min_words: int = Field(1, ge=1, description="documents with fewer words are never dropped by the ratio")


def load_words(path: str) -> tuple[frozenset[str], dict[str, list[tuple[str, ...]]]]:
    """(single words, phrases by their first word) of a word list, lower-cased."""
    single, phrases = set(), {}
    for line in list_lines(path):
        words = tuple(WORD.findall(line.lower()))
        if len(words) == 1:
            single.add(words[0])
        elif words:
            phrases.setdefault(words[0], []).append(words)
    return frozenset(single), phrases


@register_filter("flagged_words")
class FlaggedWords(Filter):
    """Drop documents with too many words from a word list (ratio of flagged words)."""

    Params = FlaggedWordsParams

    def __init__(self, params: FlaggedWordsParams):
        super().__init__(params)
        self.single, self.phrases = load_words(params.words_file)

    def count(self, text: str) -> tuple[int, int]:
        """(flagged words, words) of a text; a phrase counts each of its words."""
        words = WORD.findall(text.lower())
        flagged, i = 0, 0
        while i < len(words):
            w = words[i]
            step = 1
            for ph in self.phrases.get(w, ()):
                if tuple(words[i:i + len(ph)]) == ph:
                    step = max(step, len(ph))
            if step > 1:
                flagged += step
            elif w in self.single:
                flagged += 1
            i += step
        return flagged, len(words)

    def apply(self, batch: pa.RecordBatch) -> FilterResult:
        p = self.params
        ratios, reasons = [], []
        for t in batch.column("text").to_pylist():
            f, n = self.count(t)
            r = f / n if n else 0.0
            ratios.append(r)
            reasons.append(f"too_many_flagged_words ({r:.3f})" if p.max_ratio is not None and n >= p.min_words
                           and r > p.max_ratio else None)
        return FilterResult(np.array([r is None for r in reasons], bool), reasons,
                            {"ratio": pa.array(ratios, pa.float32())})
