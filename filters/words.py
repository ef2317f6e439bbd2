"""Word splitting that gives datatrove's words, several times faster.

datatrove's heuristic filters split English text into words with a blank spaCy pipeline
(`datatrove.utils.text.split_into_words`): about 200 documents/s per core here, most of the
time of its whole Gopher/FineWeb chain. The decisions depend on those exact words (counts,
punctuation tokens, stop words, n-grams), so a plain regex split disagrees on most
documents (42% identical word lists on the demo text).

This module runs spaCy's own tokenizer algorithm (the one `Tokenizer.explain` spells out
in Python) with spaCy's own rules, loaded from the installed spaCy: prefix, suffix and
infix patterns, URL and token matches, and the special cases. Two things make it fast:
a whitespace chunk made only of letters and not a special case is a word as it is (most
chunks), and every other chunk's split is cached (the same "word," recurs constantly).
spaCy's second pass, which re-joins contiguous tokens that spell a special case ("s." in
"km/s."), is done per chunk, longest match first. tests/filters/test_words.py measures
the agreement with datatrove on real text.
"""

from __future__ import annotations

import functools

CACHE_MAX = 500_000


class WordSplitter:
    def __init__(self, language: str = "en"):
        import spacy

        tok = spacy.blank(language).tokenizer
        never = __import__("re").compile("a^")
        self.prefix_search = tok.prefix_search or never.search
        self.suffix_search = tok.suffix_search or never.search
        self.infix_finditer = tok.infix_finditer or never.finditer
        self.token_match = tok.token_match or never.match
        self.url_match = tok.url_match or never.match
        from spacy.attrs import ORTH

        strings = tok.vocab.strings
        self.special: dict[str, tuple[str, ...]] = {}
        for orth, toks in tok.rules.items():
            self.special[orth] = tuple(t[ORTH] if isinstance(t[ORTH], str) else strings[t[ORTH]] for t in toks)
        self.cache: dict[str, tuple[str, ...]] = {}

    def split(self, text: str) -> list[str]:
        out: list[str] = []
        cache, special = self.cache, self.special
        for chunk in text.split():
            if chunk.isalpha() and chunk not in special:
                out.append(chunk)
                continue
            toks = cache.get(chunk)
            if toks is None:
                if len(cache) > CACHE_MAX:
                    cache.clear()
                toks = cache[chunk] = self._split_chunk(chunk)
            out.extend(toks)
        return out

    def _split_chunk(self, substring: str) -> tuple[str, ...]:
        """spaCy's affix / special-case / infix loop for one whitespace-free chunk."""
        special, prefix_search, suffix_search = self.special, self.prefix_search, self.suffix_search
        tokens: list[str] = []
        suffixes: list[str] = []
        while substring:
            if substring in special:
                tokens.extend(special[substring])
                substring = ""
                continue
            while prefix_search(substring) or suffix_search(substring):
                if self.token_match(substring):
                    tokens.append(substring)
                    substring = ""
                    break
                if substring in special:
                    tokens.extend(special[substring])
                    substring = ""
                    break
                m = prefix_search(substring)
                if m:
                    split = m.end()
                    if split == 0:
                        break
                    tokens.append(substring[:split])
                    substring = substring[split:]
                    if substring in special:
                        continue
                m = suffix_search(substring)
                if m:
                    split = m.start()
                    if split == len(substring):
                        break
                    suffixes.append(substring[split:])
                    substring = substring[:split]
            if not substring:
                continue
            if self.token_match(substring) or self.url_match(substring):
                tokens.append(substring)
            elif substring in special:
                tokens.extend(special[substring])
            else:
                offset = 0
                for match in self.infix_finditer(substring):
                    if offset == 0 and match.start() == 0:
                        continue
                    if substring[offset : match.start()]:
                        tokens.append(substring[offset : match.start()])
                    if match.end() > match.start():
                        tokens.append(substring[match.start() : match.end()])
                    offset = match.end()
                if substring[offset:]:
                    tokens.append(substring[offset:])
            substring = ""
        tokens.extend(reversed(suffixes))
        return tuple(t for t in (x.strip() for x in self._merge_specials(tokens)) if t)

    def _merge_specials(self, tokens: list[str]) -> list[str]:
        """spaCy's second pass: contiguous tokens that together spell a special case
        (`s` + `.` in "km/s.") become that special case; the longest match wins."""
        if len(tokens) < 2:
            return tokens
        out, i, n = [], 0, len(tokens)
        while i < n:
            for j in range(min(n, i + 4), i + 1, -1):
                joined = "".join(tokens[i:j])
                if joined in self.special:
                    out.extend(self.special[joined])
                    i = j
                    break
            else:
                out.append(tokens[i])
                i += 1
        return out


@functools.lru_cache(maxsize=8)
def splitter(language: str = "en") -> WordSplitter:
    """One splitter per language per worker process (loading spaCy's rules takes ~0.3 s)."""
    return WordSplitter(language)


@functools.lru_cache(maxsize=1100)
def split_into_words(text: str, language: str = "en") -> list[str]:
    """Cached so that the filters of a chain share a document's words: the filter step runs
    each filter over a batch of 1,024 documents before the next, so the cache holds a
    batch (about 25 MB of words). Callers must not mutate the returned list."""
    return splitter(language).split(text)


@functools.lru_cache(maxsize=1)
def _sentence_chars() -> frozenset[str]:
    from spacy.pipeline import Sentencizer

    return frozenset(Sentencizer.default_punct_chars)


@functools.lru_cache(maxsize=100_000)
def _is_punct(token: str) -> bool:
    import unicodedata

    return all(unicodedata.category(c).startswith("P") for c in token)


def count_sentences(text: str, language: str = "en") -> int:
    """spaCy's rule-based sentencizer (what datatrove's split_into_sentences runs), over our
    words: a sentence starts at a non-punctuation token that follows a sentence-final mark."""
    ends = _sentence_chars()
    n, seen_end = 0, False
    for i, tok in enumerate(splitter(language).split(text)):
        if i == 0:
            n = 1
        in_ends = tok in ends
        if seen_end and not in_ends and not _is_punct(tok):
            n += 1
            seen_end = False
        elif in_ends:
            seen_end = True
    return n
