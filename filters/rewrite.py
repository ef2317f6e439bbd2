"""Rewriters: filters that change a document's text, counting what they change.

A rewriter sits in a source's `filters:` chain like any filter; the filter step hands its
new text to the filters after it, and the dedup hashes, token counts, classifiers and the
mixture all see the rewritten text (pipeline/steps/filter.py). Every rewriter reports per
row what it changed (`FilterResult.changes`: documents touched, spans, characters removed
or replaced, per kind), which the ledger sums per stage; a document a rewriter empties is
removed (`emptied_by_rewrite`).

    ftfy           mojibake and Unicode repair with the ftfy library (its options), and
                   NFC/NFKC normalisation: byte-identical to ftfy.fix_text with the same options
    regex_replace  a pattern and a replacement (re.sub)
    line_remover   DCLM/RefinedWeb line rules, each switchable: mostly upper-case lines,
                   digit-only lines, counters ("12 likes"), citation brackets, URL-only lines,
                   lines repeated within the page, short lines at the page's start or end;
                   optionally drop a document that loses more than a share of its characters
"""

from __future__ import annotations

import re
from typing import Literal

import numpy as np
from pydantic import Field

from filters.base import Filter, FilterParams, FilterResult, RegexPattern, register_filter


def _result(olds: list[str], news: list[str | None], changes: dict[str, list[int]], reasons=None) -> FilterResult:
    """keep every row (or by `reasons`), new text where it changed, per-row change counts."""
    n = len(olds)
    reasons = reasons or [None] * n
    keep = np.array([r is None for r in reasons], bool)
    return FilterResult(keep, reasons, texts=[t if t is not None and t != o else None for o, t in zip(olds, news, strict=True)],
                        changes={k: np.asarray(v, np.int64) for k, v in changes.items()})


# ---------------------------------------------------------------- ftfy


class FtfyParams(FilterParams):
    type: Literal["ftfy"] = "ftfy"
    unescape_html: Literal["auto"] | bool = Field("auto", description="decode HTML entities (auto: unless the text looks like HTML)")
    remove_terminal_escapes: bool = Field(True, description="remove ANSI terminal escapes")
    fix_encoding: bool = Field(True, description="undo mojibake (UTF-8 decoded as Latin-1, Windows-1252, ...)")
    restore_byte_a0: bool = Field(True, description="allow a space for a lost 0xA0 byte when fixing encoding")
    replace_lossy_sequences: bool = Field(True, description="replace unrecoverable mojibake with U+FFFD")
    decode_inconsistent_utf8: bool = Field(True, description="fix UTF-8 mojibake inside otherwise correct text")
    fix_c1_controls: bool = Field(True, description="C1 control characters as Windows-1252")
    fix_latin_ligatures: bool = Field(True, description="ﬁ -> fi")
    fix_character_width: bool = Field(True, description="fullwidth Latin and halfwidth katakana to their normal width")
    uncurl_quotes: bool = Field(True, description="curly quotes to straight quotes")
    fix_line_breaks: bool = Field(True, description="CRLF, CR and Unicode line breaks to \\n")
    fix_surrogates: bool = Field(True, description="UTF-16 surrogate pairs to their characters")
    remove_control_chars: bool = Field(True, description="remove control characters that have no use in text")
    normalization: Literal["NFC", "NFKC", "NFD", "NFKD"] | None = Field("NFC", description="Unicode normalisation (null: none)")
    max_decode_length: int = Field(1_000_000, ge=1, description="longest text segment ftfy tries to re-decode")


@register_filter("ftfy", libraries=("ftfy",))
class Ftfy(Filter):
    """Unicode repair with ftfy.fix_text (mojibake, HTML entities, control characters, quotes, normalisation)."""

    Params = FtfyParams
    requires = (("ftfy", "ftfy"),)

    def __init__(self, params: FtfyParams):
        super().__init__(params)
        import ftfy

        opts = params.model_dump(exclude={"type"})
        self._fix = ftfy.fix_text
        self._config = ftfy.TextFixerConfig(**opts)  # explain as ftfy's default: fix_text is ~20% slower with explain=False

    def apply(self, batch) -> FilterResult:
        olds = batch.column("text").to_pylist()
        news, touched, delta = [], [], []
        for t in olds:
            new = self._fix(t, self._config)
            news.append(new)
            touched.append(int(new != t))
            delta.append(abs(len(t) - len(new)) if new != t else 0)
        return _result(olds, news, {"docs_changed": touched, "chars_length_delta": delta,
                                    "chars_changed": [_changed_chars(o, t) for o, t in zip(olds, news, strict=True)]})


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix, by bisection over slice comparisons (C speed,
    log n of them, instead of a loop per character)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _changed_chars(old: str, new: str) -> int:
    """Characters of `old` outside its common prefix and suffix with `new` (0 if equal)."""
    if old == new:
        return 0
    pre = common_prefix(old, new)
    suf = common_prefix(old[pre:][::-1], new[pre:][::-1])
    return len(old) - pre - suf


# ---------------------------------------------------------------- regex_replace


class RegexReplaceParams(FilterParams):
    type: Literal["regex_replace"] = "regex_replace"
    pattern: RegexPattern = Field(description="a Python regular expression")
    replacement: str = Field("", description="what each match becomes (re.sub syntax: \\1 for a group)")
    ignore_case: bool = Field(False, description="match without regard to case")
    multiline: bool = Field(True, description="^ and $ match at every line")


@register_filter("regex_replace")
class RegexReplace(Filter):
    """Replace every match of a pattern (re.sub); counts the matches and the characters they covered."""

    Params = RegexReplaceParams

    def __init__(self, params: RegexReplaceParams):
        super().__init__(params)
        flags = (re.IGNORECASE if params.ignore_case else 0) | (re.MULTILINE if params.multiline else 0)
        self._rx = re.compile(params.pattern, flags)

    def apply(self, batch) -> FilterResult:
        olds = batch.column("text").to_pylist()
        news, spans, chars = [], [], []
        for t in olds:
            covered = [0]

            def sub(m, covered=covered):
                covered[0] += m.end() - m.start()
                return m.expand(self.params.replacement)

            new, k = self._rx.subn(sub, t)
            news.append(new)
            spans.append(k)
            chars.append(covered[0])
        return _result(olds, news, {"spans": spans, "chars_replaced": chars})


# ---------------------------------------------------------------- line_remover

COUNTER = re.compile(r"^\W*\d[\d,.]*\s*[kKmMbB]?\s+(?:likes?|shares?|comments?|retweets?|reposts?|quotes?|replies|reply|views?|"
                     r"followers?|following|votes?|upvotes?|downvotes?|points?|reactions?|bookmarks?|favorites?|"
                     r"favourites?|subscribers?|answers?|downloads?|stars?|forks?|watching)\W*$", re.IGNORECASE)
CITATION = re.compile(r"\[\d+(?:[,–-]\s*\d+)*]|\[(?:citation needed|edit|clarification needed|who\?|when\?|dubious)]",
                      re.IGNORECASE)
URL_ONLY = re.compile(r"^\W*(?:https?://|www\.)\S+\W*$", re.IGNORECASE)
RULES = ("upper_lines", "numeric_lines", "counter_lines", "url_lines", "repeated_lines", "edge_lines", "citations")


class LineRemoverParams(FilterParams):
    type: Literal["line_remover"] = "line_remover"
    max_upper_ratio: float | None = Field(0.5, ge=0, le=1, description="drop a line whose letters are more than this share "
                                          "upper case (RefinedWeb: 'mostly upper case'); null: off")
    min_upper_letters: int = Field(4, ge=1, description="... only lines with at least this many letters (so 'OK' or 'USA' stay)")
    remove_numeric_lines: bool = Field(True, description="drop lines of digits, punctuation and spaces only (RefinedWeb)")
    remove_counters: bool = Field(True, description="drop counter lines: '12 likes', '3 comments', '1.2k views' (RefinedWeb)")
    remove_citations: bool = Field(True, description="cut [1], [2-4], [citation needed], [edit] out of lines (DCLM)")
    remove_url_lines: bool = Field(True, description="drop lines that are only a URL")
    remove_repeated_lines: bool = Field(False, description="drop a line's second and later occurrences in the page "
                                        "(compared stripped and lower-cased, as DCLM)")
    min_edge_words: int | None = Field(None, ge=1, description="drop lines with fewer words at the page's start and end "
                                       "(navigation, footers), up to the first and after the last longer line; null: off")
    max_removed_fraction: float | None = Field(None, gt=0, le=1, description="drop the document when the rules remove more "
                                               "than this share of its characters (RefinedWeb: 0.05); null: off")


@register_filter("line_remover")
class LineRemover(Filter):
    """RefinedWeb / DCLM line rules: upper-case, numeric, counter, URL-only, repeated and edge lines; citation brackets."""

    Params = LineRemoverParams

    def apply(self, batch) -> FilterResult:
        olds = batch.column("text").to_pylist()
        news, reasons = [], []
        counts = {k: [] for k in (*RULES, "chars_removed")}
        for t in olds:
            new, c = self.rewrite(t)
            news.append(new)
            for k in counts:
                counts[k].append(c.get(k, 0))
            limit = self.params.max_removed_fraction
            reasons.append(f"too_many_lines_removed ({c['chars_removed'] / len(t):.2f} of chars)"
                           if limit is not None and t and c["chars_removed"] > limit * len(t) else None)
        return _result(olds, news, counts, reasons)

    def rewrite(self, text: str) -> tuple[str, dict[str, int]]:
        """The text without the lines the rules remove, and counts per rule."""
        p = self.params
        lines = text.split("\n")
        drop: list[str | None] = [None] * len(lines)  # the rule that removes each line
        seen: set[str] = set()
        c = dict.fromkeys(RULES, 0)
        for i, line in enumerate(lines):
            s = line.strip()
            if not s:
                continue
            if p.remove_url_lines and URL_ONLY.match(s):
                drop[i] = "url_lines"
            elif p.remove_counters and COUNTER.match(s):
                drop[i] = "counter_lines"
            elif p.remove_numeric_lines and not any(ch.isalpha() for ch in s) and any(ch.isdigit() for ch in s):
                drop[i] = "numeric_lines"
            elif p.max_upper_ratio is not None and _upper_ratio(s, p.min_upper_letters) > p.max_upper_ratio:
                drop[i] = "upper_lines"
            elif p.remove_repeated_lines:  # DCLM's within-page dedup: stripped, lower-cased
                key = s.lower()
                if key in seen:
                    drop[i] = "repeated_lines"
                seen.add(key)
        if p.min_edge_words is not None:
            words = [len(line.split()) for line in lines]
            long = [i for i, w in enumerate(words) if w >= p.min_edge_words and drop[i] is None]
            first, last = (long[0], long[-1]) if long else (len(lines), -1)
            for i, w in enumerate(words):
                if drop[i] is None and w and (i < first or i > last):
                    drop[i] = "edge_lines"
        out = []
        for i, line in enumerate(lines):
            if drop[i] is not None:
                c[drop[i]] += 1
                continue
            if p.remove_citations:
                line, k = CITATION.subn("", line)
                c["citations"] += k
            out.append(line)
        new = "\n".join(out)
        c["chars_removed"] = len(text) - len(new)
        return new, c


def _upper_ratio(line: str, min_letters: int) -> float:
    letters = [ch for ch in line if ch.isalpha()]
    if len(letters) < min_letters:
        return 0.0
    return sum(ch.isupper() for ch in letters) / len(letters)
