"""C4's rules (Raffel et al. 2020) as datatrove 0.10's `C4QualityFilter` and `C4ParagraphFilter` apply them.

`c4_quality` walks the lines: lines with a word over `max_word_length` characters, without
terminal punctuation (unless `filter_no_terminal_punct: false`), with fewer than
`min_words_per_line` words, mentioning javascript, or with policy/cookie phrases are
dropped; "lorem ipsum" or a curly bracket drops the document; fewer than `min_sentences`
sentences in the lines left drops it too (`too_few_sentences`). Sentences are counted by
spaCy's sentencizer rule over our words (filters/words.py). By default the filter decides
only; with `rewrite: true` a kept document's text becomes its kept lines (stripped, citations
removed, joined by newlines), as C4 and datatrove do, and later filters, token counts and
the mixture see that text.
`c4_paragraph` (mC4): fewer than 3 lines, or fewer than 3 lines of at least 200 characters.
"""

from __future__ import annotations

import heapq
import re
from typing import Literal

import numpy as np
from pydantic import Field

from filters.base import FilterParams, FilterResult, PerDocFilter, register_filter
from filters.words import count_sentences

CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
END_PUNCTUATION = (".", "?", "!", '"', "'")
POLICY = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")


class C4QualityParams(FilterParams):
    type: Literal["c4_quality"] = "c4_quality"
    remove_citations: bool = Field(True, description="strip [1], [edit], [citation needed] from lines")
    filter_no_terminal_punct: bool = Field(True, description="drop lines not ending in . ? ! \" ' (or ending in ...)")
    min_sentences: int | None = Field(5, description="fewer sentences in the kept lines: too_few_sentences")
    min_words_per_line: int | None = Field(3, description="drop lines with fewer words")
    max_word_length: int | None = Field(1000, description="drop lines with a longer word (characters)")
    filter_lorem_ipsum: bool = Field(True, description="'lorem ipsum' in a kept line drops the document: lorem_ipsum")
    filter_javascript: bool = Field(True, description="drop lines mentioning javascript")
    filter_curly_bracket: bool = Field(True, description="'{' in a kept line drops the document: curly_bracket")
    filter_policy: bool = Field(True, description="drop lines with cookie / terms-of-use phrases")
    language: str = Field("en", description="sentence splitting language (spaCy rules)")
    rewrite: bool = Field(False, description="also replace a kept document's text by its kept lines, as C4 does")


@register_filter("c4_quality", libraries=("spacy",))
class C4Quality(PerDocFilter):
    """C4 line rules: terminal punctuation, short lines, javascript, policy lines, lorem ipsum, curly brackets, sentences."""

    Params = C4QualityParams

    def apply(self, batch):
        if not self.params.rewrite:
            return super().apply(batch)

        reasons, texts = [], []
        for text in batch.column("text").to_pylist():
            kept: list[str] = []
            r = self.check(text, kept)
            reasons.append(r)
            new = "\n".join(kept).strip() if r is None else None
            texts.append(new if new != text else None)
        return FilterResult(np.array([r is None for r in reasons], dtype=bool), reasons, texts=texts)

    def check(self, text: str, kept_lines: list[str] | None = None) -> str | None:
        p: C4QualityParams = self.params
        sentences = 0
        for line in text.splitlines():
            line = line.strip()
            words = line.split()
            if p.max_word_length is not None and max(map(len, words), default=0) > p.max_word_length:
                continue
            if p.remove_citations:
                line = CITATION.sub("", line)
            if p.filter_no_terminal_punct and (not line.endswith(END_PUNCTUATION) or line.endswith("...")):
                continue
            if p.min_words_per_line is not None and len(words) < p.min_words_per_line:
                continue
            low = line.lower()
            if p.filter_lorem_ipsum and "lorem ipsum" in low:
                return "lorem_ipsum"
            if p.filter_javascript and "javascript" in low:
                continue
            if p.filter_curly_bracket and "{" in line:
                return "curly_bracket"
            if p.filter_policy and any(x in low for x in POLICY):
                continue
            if p.min_sentences is not None and sentences < p.min_sentences:  # enough counted: the rest can't change it
                sentences += max(1, count_sentences(line, p.language))
            if kept_lines is not None:
                kept_lines.append(line)
        if p.min_sentences is not None and sentences < p.min_sentences:
            return "too_few_sentences"
        return None


class C4ParagraphParams(FilterParams):
    type: Literal["c4_paragraph"] = "c4_paragraph"
    min_paragraphs: int = Field(3, ge=1, description="fewer lines, or fewer lines this long: too_few_paragraphs")
    min_paragraph_chars: int = Field(200, ge=0, description="characters a line needs to count as a paragraph")


@register_filter("c4_paragraph")
class C4Paragraph(PerDocFilter):
    """mC4 paragraph rule: at least 3 lines of at least 200 characters."""

    Params = C4ParagraphParams

    def check(self, text: str) -> str | None:
        p: C4ParagraphParams = self.params
        lines = text.split("\n")
        if len(lines) < p.min_paragraphs or min(heapq.nlargest(p.min_paragraphs, map(len, lines))) < p.min_paragraph_chars:
            return "too_few_paragraphs"
        return None
