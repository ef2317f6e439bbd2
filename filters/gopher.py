"""Gopher's quality and repetition rules (Rae et al. 2021, table A1), as datatrove 0.10 applies them.

Same defaults, same order of checks, same words (filters/words.py), so the decisions agree
with datatrove's `GopherQualityFilter` and `GopherRepetitionFilter`
(tests/filters/test_conformance.py). Differences, on purpose:
- a threshold of `None` is off and `0` is a threshold (datatrove switches off on 0);
- `min_alpha_words_ratio` is datatrove's `max_non_alpha_words_ratio`, named for what it checks;
- ratios over zero words are 0 instead of a ZeroDivisionError.
Both run over a whole batch (filters/kernels.py): the words of every document as integer
ids, word counts and lengths as per-document sums, n-grams counted by hash; only the
line and paragraph rules and the decision itself are per-document Python.
"""

from __future__ import annotations

import re
from typing import Literal

import numpy as np
import pyarrow as pa
from pydantic import Field

from filters import kernels
from filters.base import Filter, FilterParams, FilterResult, register_filter

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


@register_filter("gopher_quality", version="2", libraries=("spacy", "datatrove"))
class GopherQuality(Filter):
    """Gopher quality rules: word counts and lengths, symbols, bullets, ellipses, alphabetic words, stop words."""

    Params = GopherQualityParams

    def __init__(self, params):
        super().__init__(params)
        self.stop = frozenset(params.stop_words)

    def apply(self, batch: pa.RecordBatch) -> FilterResult:
        texts = batch.column("text").to_pylist()
        reasons: list[str | None] = []
        for g in kernels.groups(texts):  # bounded memory for batches of long documents
            reasons += self._group(texts[g.start:g.stop])
        return FilterResult(np.array([r is None for r in reasons], dtype=bool), reasons)

    def _group(self, texts: list[str]) -> list[str | None]:
        p: GopherQualityParams = self.params
        w = kernels.batch_words(texts, p.language)
        v, ids = w.vocab, w.ids
        n_words = w.counts
        symbol = v.array("symbol")[ids]
        n_ns = (n_words - w.per_doc_sum(symbol)).tolist()
        len_ns = w.per_doc_sum(np.where(symbol, 0, v.array("length")[ids])).tolist()
        n_alpha = w.per_doc_sum(v.array("alpha")[ids]).tolist()
        stop_ids = v.lookup(self.stop)
        if len(stop_ids):  # distinct stop words per document
            hit = np.isin(ids, stop_ids)
            pairs = np.unique(w.doc[hit] * len(stop_ids) + np.searchsorted(stop_ids, ids[hit]))
            n_stop = np.bincount(pairs // len(stop_ids), minlength=w.n_docs).tolist()
        else:
            n_stop = [0] * w.n_docs
        return [self._decide(t, nw, ns, ln, na, st)
                for t, nw, ns, ln, na, st in zip(texts, n_words.tolist(), n_ns, len_ns, n_alpha, n_stop)]

    def _decide(self, text: str, n_words: int, n_ns: int, len_ns: int, n_alpha: int, n_stop: int) -> str | None:
        """The rules in datatrove's order, from one document's counts (n_ns: non-symbol
        words, len_ns: their characters, n_alpha: words with a letter, n_stop: distinct
        stop words present)."""
        p: GopherQualityParams = self.params
        if p.min_words is not None and n_ns < p.min_words:
            return "too_few_words"
        if p.max_words is not None and n_ns > p.max_words:
            return "too_many_words"
        if n_ns and (p.min_avg_word_length is not None or p.max_avg_word_length is not None):
            avg = len_ns / n_ns
            if p.min_avg_word_length is not None and avg < p.min_avg_word_length:
                return "avg_word_length_below_min"
            if p.max_avg_word_length is not None and avg > p.max_avg_word_length:
                return "avg_word_length_above_max"
        if p.max_symbol_word_ratio is not None and n_words:
            if text.count("#") / n_words > p.max_symbol_word_ratio:
                return "too_many_hashes"
            if (text.count("...") + text.count("…")) / n_words > p.max_symbol_word_ratio:
                return "too_many_ellipses"
        if p.max_bullet_lines_ratio is not None or p.max_ellipsis_lines_ratio is not None:
            lines = text.splitlines()
            if lines and p.max_bullet_lines_ratio is not None:
                bullets = sum(1 for s in lines if s.lstrip().startswith(("•", "-")))
                if bullets / len(lines) > p.max_bullet_lines_ratio:
                    return "too_many_bullet_lines"
            if lines and p.max_ellipsis_lines_ratio is not None:
                ell = sum(1 for s in lines if s.rstrip().endswith(("...", "…")))
                if ell / len(lines) > p.max_ellipsis_lines_ratio:
                    return "too_many_ellipsis_lines"
        if p.min_alpha_words_ratio is not None and n_words and n_alpha / n_words < p.min_alpha_words_ratio:
            return "too_few_alpha_words"
        if p.min_stop_words is not None and n_stop < p.min_stop_words:
            return "too_few_stop_words"
        return None


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


@register_filter("gopher_repetition", version="2", libraries=("spacy", "datatrove"))
class GopherRepetition(Filter):
    """Gopher repetition rules: repeated paragraphs, lines and n-grams."""

    Params = GopherRepetitionParams

    def apply(self, batch: pa.RecordBatch) -> FilterResult:
        p: GopherRepetitionParams = self.params
        texts = batch.column("text").to_pylist()
        reasons: list[str | None] = [self._lines(t) for t in texts]
        todo_all = [i for i, r in enumerate(reasons) if r is None]
        if not (p.max_top_ngram_char_frac or p.max_dup_ngram_char_frac):
            todo_all = []
        for g in kernels.groups([texts[i] for i in todo_all]):  # bounded memory for long documents
            todo = todo_all[g.start:g.stop]
            sub = [texts[i] for i in todo]
            w = kernels.batch_words(sub, p.language)
            native = kernels.native()
            if native is not None:  # the same rules, per document in C
                rules = tuple([(n, frac, 0) for n, frac in sorted(p.max_top_ngram_char_frac.items())]
                              + [(n, frac, 1) for n, frac in sorted(p.max_dup_ngram_char_frac.items())])
                v, out = w.vocab, np.empty(len(sub), dtype=np.int32)
                native.repetition(w.ids, w.off, v.array("hash"), v.array("pow"), v.array("length"),
                                  np.fromiter(map(len, sub), dtype=np.int64, count=len(sub)), out, rules)
                names = [f"top_{n}_gram" if k == 0 else f"duplicated_{n}_n_grams" for n, _, k in rules]
                for j in np.flatnonzero(out >= 0):
                    reasons[todo[j]] = names[out[j]]
                continue
            size = np.array([len(t) for t in sub], dtype=np.float64)
            open_ = np.ones(len(sub), dtype=bool)
            counts = w.counts
            for n, frac in sorted(p.max_top_ngram_char_frac.items()):
                hit = open_ & (counts >= n) & (kernels.top_ngram_chars(w, n) / size > frac)
                self._mark(reasons, todo, hit, f"top_{n}_gram")
                open_ &= ~hit
            for n, frac in sorted(p.max_dup_ngram_char_frac.items()):
                if not open_.any():
                    break
                hit = open_ & (kernels.dup_ngram_chars(w, n, open_, limit=frac * size) / size > frac)
                self._mark(reasons, todo, hit, f"duplicated_{n}_n_grams")
                open_ &= ~hit
        return FilterResult(np.array([r is None for r in reasons], dtype=bool), reasons)

    @staticmethod
    def _mark(reasons, todo, hit, reason):
        for j in np.flatnonzero(hit):
            reasons[todo[j]] = reason

    def _lines(self, text: str) -> str | None:
        """The paragraph and line rules, per document."""
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
        return None
