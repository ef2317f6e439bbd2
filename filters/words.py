"""Word splitting that gives datatrove's words, several times faster.

datatrove's heuristic filters split English text into words with a blank spaCy pipeline
(`datatrove.utils.text.split_into_words`): about 200 documents/s per core here, most of the
time of its whole Gopher/FineWeb chain. The decisions depend on those exact words (counts,
punctuation tokens, stop words, n-grams), so a plain regex split disagrees on most
documents (42% identical word lists on the demo text).

This module runs spaCy's own tokenizer algorithm (the one `Tokenizer.explain` spells out
in Python) with spaCy's own rules, loaded from the installed spaCy and kept in a file per
spaCy version, so that a fresh worker need not import spaCy (filters/spacy_rules.py):
prefix, suffix and infix patterns, URL and token matches, and the special cases. What
makes it fast: a whitespace chunk made only of letters and not a special case is a word as
it is (most chunks); every other chunk is split once per process and remembered in one
cache (read by filters/kernels.py's vocabulary and C4's sentence count); spaCy's regexes
are only run where they can match, as read off the parsed regexes
(filters/regex_shortcuts.py); and ASCII chunks are split by the compiled loop
(filters/_native.c) for the rules it was tested against (`COMPILED_FOR`) or that passed its
self-check when their rules file was built (`load_rules`, here because the check splits
with `WordSplitter`). spaCy's second pass, which re-joins contiguous tokens that spell a
special case ("s." in "km/s."), is done per chunk, longest match first.
tests/filters/test_conformance.py and test_kernels.py measure the agreement with datatrove
on real text. Languages whitespace does not delimit go to their segmenters
(filters/segmenters.py).
"""

from __future__ import annotations

import functools
import json
import os

from filters.regex_shortcuts import LazyRx, analyse, anchored_prefix, candidate_infix, needs_literals, tail_suffix
from filters.segmenters import SEGMENTERS, SegmentedSplitter
from filters.spacy_rules import read_rules, rules_file, rules_from_spacy, save_rules

CACHE_MAX = 500_000

NATIVE_VERSION = 4  # the filters/_native.c this code is written for (its VERSION)


def load_rules(language: str) -> dict:
    """spaCy's tokenizer rules for a language (filters/spacy_rules.py): read from spaCy
    once (importing spaCy and building a blank pipeline costs ~0.6 s in every fresh
    worker), then from a JSON file beside the models keyed by spaCy's version. Rules the
    compiled loop was not tested against are self-checked when the file is built, and the
    outcome is kept in it; a file that cannot be written is simply not kept."""
    path = rules_file(language)
    rules = read_rules(path)
    if rules is not None:
        return rules
    rules = rules_from_spacy(language)
    if fingerprint(rules) not in COMPILED_FOR and _native() is not None:  # kept only when checked, with what
        rules["ascii_checked"] = NATIVE_VERSION if _self_check(language, rules) else False
    save_rules(path, rules)
    return rules


# The rules the compiled loop (filters/_native.c) reproduces for ASCII chunks: spaCy's
# base prefixes and suffixes with its English infixes and URL pattern, as spaCy 3.8
# builds them (`fingerprint`); tests/filters/test_words.py checks the compiled loop
# against spaCy itself. Other rules (another language, another spaCy) use it only if it
# passes `_self_check` when their rules file is built; else the Python loop.
COMPILED_FOR = frozenset({
    "2a013ff093f1d182",  # spaCy 3.8.x, English
})


def fingerprint(rules: dict) -> str:
    """A short hash of a rule set's patterns (not its special cases, which the compiled
    loop is given)."""
    import hashlib

    key = json.dumps([rules[k] for k in ("prefix", "suffix", "infix", "token_match", "url_match")])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _native():
    """The compiled module, or None where it was not built (no C compiler at install) or
    `CURATE_NATIVE=0` turns it off (to compare, or to rule it out)."""
    if os.environ.get("CURATE_NATIVE", "1") == "0":
        return None
    try:
        from filters import _native as mod
    except ImportError:
        return None
    return mod if getattr(mod, "VERSION", None) == NATIVE_VERSION else None  # a stale build: not used


def _self_check(language: str, rules: dict, n: int = 20_000) -> bool:
    """For rules the compiled loop was not tested against (another spaCy version or
    language): whether it gives the Python loop's words on `n` random chunks of the ASCII
    characters and pieces the rules look at and on every string of one or two of those
    characters (run once, when the rules are read from spaCy, ~0.3 s; kept in the rules
    file). False without the compiled module or the tables."""
    import itertools
    import random

    if _native() is None or rules.get("ascii") is None:
        return False
    w = WordSplitter(language, rules=rules, compiled=True)
    w.chunk_words("a,b")  # builds the compiled loop
    if w.compiled is None:
        return False
    chars = [chr(i) for i in range(33, 127)]
    pieces = chars + ["...", "'s", "n't", "km/h", "US$", "http://", "www.", ".com", "127.0.0.1", "e.g.", "a.m.", "--", ":)"]
    rng = random.Random(0)
    chunks = {"".join(rng.choice(pieces) for _ in range(rng.randint(1, 8))) for _ in range(n)}
    chunks.update("".join(t) for k in (1, 2) for t in itertools.product(chars, repeat=k))
    return all(w.compiled.split(c) == w.split_chunk(c) for c in chunks)


class WordSplitter:
    def __init__(self, language: str = "en", rules: dict | None = None, compiled: bool | None = None):
        import re

        rules = load_rules(language) if rules is None else rules
        never = re.compile("a^")
        info = rules.get("analysis", {})

        def lazy(key):
            if rules[key] is None:
                return None, None
            got = info.get(key)
            return LazyRx(*rules[key]), (got if got is not None else analyse(*rules[key]))

        (prefix, pi), (suffix, si), (infix, ii) = lazy("prefix"), lazy("suffix"), lazy("infix")
        url, ui = lazy("url_match")
        token_match = re.compile(*rules["token_match"]) if rules["token_match"] is not None else None
        self.prefix_search = anchored_prefix(prefix, pi) if prefix else never.search
        self.suffix_start = tail_suffix(suffix, si) if suffix else (lambda s: None)
        self.infix_finditer = candidate_infix(infix, ii) if infix else never.finditer
        self.token_match_or_none = token_match.match if token_match else None
        self.url_match = needs_literals(url, ui) if url else never.match
        self.special: dict[str, tuple[str, ...]] = dict(rules["special"])
        # a chunk has no whitespace and no empty piece, so its tokens need stripping only
        # if a special case a chunk can be (a key without whitespace) expands to something
        # with whitespace or to nothing (spaCy's whitespace keys never meet a chunk)
        self.strip_tokens = any(not t or t != t.strip() for k, v in self.special.items() if k == "".join(k.split()) for t in v)
        self.sentence_punct = frozenset(rules["sentence_punct"])
        # every prefix of a special case: a merge of tokens i..j needs tokens[i] among them
        self.special_prefixes = frozenset(k[:i] for k in self.special for i in range(1, len(k) + 1))
        self.cache: dict[str, tuple[str, ...]] = {}
        self.compiled = None  # the C loop for ASCII chunks, where it applies (made at first use)
        self._ascii = rules.get("ascii") if not self.strip_tokens and token_match is None else None
        self._url = url
        if compiled is None:  # rules it was tested against, or that passed the check when they were read from spaCy
            compiled = fingerprint(rules) in COMPILED_FOR or rules.get("ascii_checked") == NATIVE_VERSION
        if self._ascii is None or not compiled or _native() is None:
            self._split = self.split_chunk
        else:
            self._split = self._first_split

    def split(self, text: str) -> list[str]:
        out: list[str] = []
        for chunk in text.split():
            out.extend(self.chunk_words(chunk))
        return out

    def chunk_words(self, chunk: str) -> tuple[str, ...]:
        """One whitespace-free chunk's words: itself when it is letters only and not a
        special case, else spaCy's split, made once per process (the one cache of splits:
        filters/kernels.py's vocabulary and C4's sentence count both read it)."""
        if chunk.isalpha() and chunk not in self.special:
            return (chunk,)
        cache = self.cache
        toks = cache.get(chunk)
        if toks is None:
            if len(cache) > CACHE_MAX:
                cache.clear()
            toks = cache[chunk] = self._split(chunk)
        return toks

    def _first_split(self, chunk: str) -> tuple[str, ...]:
        """Make the compiled loop at the first chunk that needs a split (building it
        compiles the URL regex), then split with it from then on."""
        t = self._ascii
        self.compiled = _native().Splitter(
            t["pre1"], t["suf1"], t["dot_after"], t["inf_q"], t["url_host"], t["url_need"],
            tuple(u.encode() for u in t["after_digit"]), self.special, self.special_prefixes,
            self._url.compiled_match())
        c_split, py_split = self.compiled.split, self.split_chunk

        def split(chunk: str) -> tuple[str, ...]:
            toks = c_split(chunk)
            return py_split(chunk) if toks is None else toks

        self._split = split
        return split(chunk)

    def split_chunk(self, substring: str) -> tuple[str, ...]:
        """spaCy's affix / special-case / infix loop for one whitespace-free chunk.

        The same steps as `Tokenizer.explain`; a search result is reused while the
        substring it was made on has not changed (spaCy's loop asks again)."""
        special, prefix_search, suffix_start = self.special, self.prefix_search, self.suffix_start
        token_match = self.token_match_or_none
        tokens: list[str] = []
        suffixes: list[str] = []
        while substring:
            if substring in special:
                tokens.extend(special[substring])
                break
            pm = prefix_search(substring)
            ss = None if pm else suffix_start(substring)
            while pm or ss is not None:
                if token_match is not None and token_match(substring):
                    tokens.append(substring)
                    substring = ""
                    break
                if substring in special:
                    tokens.extend(special[substring])
                    substring = ""
                    break
                if pm:
                    split = pm.end()
                    if split == 0:
                        break
                    tokens.append(substring[:split])
                    substring = substring[split:]
                    if substring in special:
                        pm = prefix_search(substring)
                        ss = None if pm else suffix_start(substring)
                        continue
                    ss = suffix_start(substring)
                if ss is not None:
                    if ss == len(substring):
                        break
                    suffixes.append(substring[ss:])
                    substring = substring[:ss]
                pm = prefix_search(substring)
                ss = None if pm else suffix_start(substring)
            if not substring:
                break
            if (token_match is not None and token_match(substring)) or self.url_match(substring):
                tokens.append(substring)
            elif substring in special:
                tokens.extend(special[substring])
            else:
                offset = 0
                for match in self.infix_finditer(substring):
                    start = match.start()
                    if offset == 0 and start == 0:
                        continue
                    if offset < start:
                        tokens.append(substring[offset:start])
                    end = match.end()
                    if end > start:
                        tokens.append(substring[start:end])
                    offset = end
                if offset < len(substring):
                    tokens.append(substring[offset:])
            break
        if suffixes:
            tokens.extend(reversed(suffixes))
        if len(tokens) > 1:
            tokens = self._merge_specials(tokens)
        if self.strip_tokens:
            return tuple(t for t in (x.strip() for x in tokens) if t)
        return tuple(tokens)

    def _merge_specials(self, tokens: list[str]) -> list[str]:
        """spaCy's second pass: contiguous tokens that together spell a special case
        (`s` + `.` in "km/s.") become that special case; the longest match wins."""
        if len(tokens) < 2 or self.special_prefixes.isdisjoint(tokens):  # most chunks: no token starts one
            return tokens
        out, i, n, prefixes = [], 0, len(tokens), self.special_prefixes
        while i < n:
            if tokens[i] not in prefixes:
                out.append(tokens[i])
                i += 1
                continue
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
def splitter(language: str = "en") -> WordSplitter | SegmentedSplitter:
    """One splitter per language per worker process (compiling spaCy's rules takes ~0.05 s)."""
    if language in SEGMENTERS:
        return SegmentedSplitter(language)
    return WordSplitter(language)


@functools.lru_cache(maxsize=100_000)
def _is_punct(token: str) -> bool:
    import unicodedata

    return all(unicodedata.category(c).startswith("P") for c in token)


def count_sentences(text: str, language: str = "en") -> int:
    """spaCy's rule-based sentencizer (what datatrove's split_into_sentences runs), over our
    words: a sentence starts at a non-punctuation token that follows a sentence-final mark."""
    ends = splitter(language).sentence_punct
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
