"""Gopher's quality and repetition rules (Rae et al. 2021, table A1), as datatrove 0.10 applies them.

Same defaults, same order of checks, same words (filters/words.py), so the decisions agree
with datatrove's `GopherQualityFilter` and `GopherRepetitionFilter`
(tests/filters/test_conformance.py). Differences, on purpose:
- a threshold of `None` is off and `0` is a threshold (datatrove switches off on 0);
- `min_alpha_words_ratio` is datatrove's `max_non_alpha_words_ratio`, named for what it checks;
- ratios over zero words are 0 instead of a ZeroDivisionError.
Repetition is computed faster, not differently: a document with no repeated 5-gram has
no repeated longer n-gram, so those checks are skipped, and n-gram counts run over tuples.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Literal

from pydantic import Field

from filters.base import FilterParams, PerDocFilter, register_filter
from filters.words import split_into_words

try:  # the punctuation datatrove counts as "symbol" characters
    from datatrove.utils.text import PUNCTUATION_SET
except ImportError:  # pragma: no cover - datatrove is a dependency
    PUNCTUATION_SET = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")

_PARA = re.compile(r"\n{2,}")
_LINES = re.compile(r"\n+")
STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")


class GopherQualityParams(FilterParams):
    type: Literal["gopher_quality"] = "gopher_quality"
    min_words: int | None = Field(50, description="fewer non-symbol words: too_few_words")
    max_words: int | None = Field(100_000, description="more non-symbol words: too_many_words")
    min_avg_word_length: float | None = Field(3, description="mean characters per non-symbol word below: avg_word_length_below_min")
    max_avg_word_length: float | None = Field(10, description="mean characters per non-symbol word above: avg_word_length_above_max")
    max_symbol_word_ratio: float | None = Field(0.1, description="'#' or ellipses per word above: too_many_hashes / too_many_ellipses")
    max_bullet_lines_ratio: float | None = Field(0.9, description="share of lines starting with a bullet above: too_many_bullet_lines")
    max_ellipsis_lines_ratio: float | None = Field(0.3, description="share of lines ending with an ellipsis above: too_many_ellipsis_lines")
    min_alpha_words_ratio: float | None = Field(0.8, description="share of words with a letter below: too_few_alpha_words")
    min_stop_words: int | None = Field(2, description="fewer distinct stop words present: too_few_stop_words")
    stop_words: list[str] = Field(default_factory=lambda: list(STOP_WORDS), description="the stop words")
    language: str = Field("en", description="word splitting language (spaCy rules)")


@register_filter("gopher_quality")
class GopherQuality(PerDocFilter):
    """Gopher quality rules: word counts and lengths, symbols, bullets, ellipses, alphabetic words, stop words."""

    Params = GopherQualityParams

    def __init__(self, params):
        super().__init__(params)
        self.stop = frozenset(params.stop_words)

    def check(self, text: str) -> str | None:
        p: GopherQualityParams = self.params
        words = split_into_words(text, p.language)
        n_words = len(words)
        # most words are purely alphabetic: decide those in C, look closer only at the rest
        others = [w for w in words if not w.isalpha()]
        symbols = [w for w in others if PUNCTUATION_SET.issuperset(w)]
        n_ns = n_words - len(symbols)
        if p.min_words is not None and n_ns < p.min_words:
            return "too_few_words"
        if p.max_words is not None and n_ns > p.max_words:
            return "too_many_words"
        if n_ns and (p.min_avg_word_length is not None or p.max_avg_word_length is not None):
            avg = (sum(map(len, words)) - sum(map(len, symbols))) / n_ns
            if p.min_avg_word_length is not None and avg < p.min_avg_word_length:
                return "avg_word_length_below_min"
            if p.max_avg_word_length is not None and avg > p.max_avg_word_length:
                return "avg_word_length_above_max"
        if p.max_symbol_word_ratio is not None and n_words:
            if text.count("#") / n_words > p.max_symbol_word_ratio:
                return "too_many_hashes"
            if (text.count("...") + text.count("…")) / n_words > p.max_symbol_word_ratio:
                return "too_many_ellipses"
        lines = text.splitlines()
        if lines and p.max_bullet_lines_ratio is not None:
            bullets = sum(1 for s in lines if s.lstrip().startswith(("•", "-")))
            if bullets / len(lines) > p.max_bullet_lines_ratio:
                return "too_many_bullet_lines"
        if lines and p.max_ellipsis_lines_ratio is not None:
            ell = sum(1 for s in lines if s.rstrip().endswith(("...", "…")))
            if ell / len(lines) > p.max_ellipsis_lines_ratio:
                return "too_many_ellipsis_lines"
        if p.min_alpha_words_ratio is not None and n_words:
            alpha = n_words - len(others) + sum(1 for w in others if _has_alpha(w))
            if alpha / n_words < p.min_alpha_words_ratio:
                return "too_few_alpha_words"
        if p.min_stop_words is not None and len(self.stop.intersection(words)) < p.min_stop_words:
            return "too_few_stop_words"
        return None


def _has_alpha(w: str) -> bool:
    return any(c.isalpha() for c in w)


# ---------------------------------------------------------------- repetition


class GopherRepetitionParams(FilterParams):
    type: Literal["gopher_repetition"] = "gopher_repetition"
    max_dup_para_frac: float | None = Field(0.3, description="share of paragraphs that repeat an earlier one: dup_para_frac")
    max_dup_para_char_frac: float | None = Field(0.2, description="share of characters in repeated paragraphs: dup_para_char_frac")
    max_dup_line_frac: float | None = Field(0.3, description="share of lines that repeat an earlier one: dup_line_frac")
    max_dup_line_char_frac: float | None = Field(0.2, description="share of characters in repeated lines: dup_line_char_frac")
    max_top_ngram_char_frac: dict[int, float] = Field(
        default_factory=lambda: {2: 0.2, 3: 0.18, 4: 0.16},
        description="n -> share of characters covered by the most frequent n-gram: top_<n>_gram")
    max_dup_ngram_char_frac: dict[int, float] = Field(
        default_factory=lambda: {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10},
        description="n -> share of characters in repeated n-grams: duplicated_<n>_n_grams")
    language: str = Field("en", description="word splitting language (spaCy rules)")


def find_duplicates(items: list[str]) -> tuple[int, int]:
    """(repeated elements, their characters): every occurrence after the first counts."""
    seen: set[str] = set()
    n = chars = 0
    for x in items:
        if x in seen:
            n += 1
            chars += len(x)
        else:
            seen.add(x)
    return n, chars


def _top_ngram_chars(words: list[str], n: int) -> int:
    grams = Counter(zip(*(words[i:] for i in range(n))))
    if not grams:
        return 0
    count = max(grams.values())
    top = next(k for k, v in grams.items() if v == count)  # first seen wins ties, as Counter.most_common(1)
    return (sum(map(len, top)) + n - 1) * count


def _all_dup_ngram_chars(words: list[str], n: int) -> int:
    """Characters in repeated n-grams, scanning left to right and skipping past a repeat."""
    grams = list(map("".join, zip(*(words[i:] for i in range(n)))))
    if len(set(grams)) == len(grams):
        return 0
    seen: set[str] = set()
    chars, idx, end = 0, 0, len(grams)
    while idx < end:
        g = grams[idx]
        if g in seen:
            chars += len(g)
            idx += n
        else:
            seen.add(g)
            idx += 1
    return chars


@register_filter("gopher_repetition")
class GopherRepetition(PerDocFilter):
    """Gopher repetition rules: repeated paragraphs, lines and n-grams."""

    Params = GopherRepetitionParams

    def check(self, text: str) -> str | None:
        p: GopherRepetitionParams = self.params
        if not text:
            return "empty"
        size = len(text)
        paragraphs = _PARA.split(text.strip())
        dups, chars = find_duplicates(paragraphs)
        if p.max_dup_para_frac is not None and dups / len(paragraphs) > p.max_dup_para_frac:
            return "dup_para_frac"
        if p.max_dup_para_char_frac is not None and chars / size > p.max_dup_para_char_frac:
            return "dup_para_char_frac"
        lines = _LINES.split(text)
        dups, chars = find_duplicates(lines)
        if p.max_dup_line_frac is not None and dups / len(lines) > p.max_dup_line_frac:
            return "dup_line_frac"
        if p.max_dup_line_char_frac is not None and chars / size > p.max_dup_line_char_frac:
            return "dup_line_char_frac"
        words = split_into_words(text, p.language)
        for n, frac in sorted(p.max_top_ngram_char_frac.items()):
            if len(words) >= n and _top_ngram_chars(words, n) / size > frac:
                return f"top_{n}_gram"
        for n, frac in sorted(p.max_dup_ngram_char_frac.items()):
            dup = _all_dup_ngram_chars(words, n)
            if dup / size > frac:
                return f"duplicated_{n}_n_grams"
            if dup == 0:  # no repeated n-gram: no repeated longer one either
                break
        return None

