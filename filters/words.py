"""Word splitting that gives datatrove's words, several times faster.

datatrove's heuristic filters split English text into words with a blank spaCy pipeline
(`datatrove.utils.text.split_into_words`): about 200 documents/s per core here, most of the
time of its whole Gopher/FineWeb chain. The decisions depend on those exact words (counts,
punctuation tokens, stop words, n-grams), so a plain regex split disagrees on most
documents (42% identical word lists on the demo text).

This module runs spaCy's own tokenizer algorithm (the one `Tokenizer.explain` spells out
in Python) with spaCy's own rules, loaded from the installed spaCy (and kept in a file
per spaCy version, so that a fresh worker need not import spaCy): prefix, suffix and
infix patterns, URL and token matches, and the special cases. What makes it fast:
a whitespace chunk made only of letters and not a special case is a word as it is (most
chunks); every other chunk is split once per process and remembered in one cache (read by
filters/kernels.py's vocabulary and C4's sentence count); and spaCy's regexes are only run
where they can match: the prefix regex as an anchored match when the first character can
start one, the suffix regex on the last K positions when the last character can end one
(its answer remembered by the last K+B characters, B the longest lookbehind), the infix
regex only at characters that can start an infix, the URL regex only on chunks holding
the characters every URL match consumes. Those character sets and bounds are read off
the parsed regexes (`re._parser`), so another language's rules get the same treatment,
or none where the analysis does not apply. spaCy's second pass, which re-joins
contiguous tokens that spell a special case ("s." in "km/s."), is done per chunk, longest
match first. tests/filters/test_conformance.py and test_kernels.py measure the agreement
with datatrove on real text.
"""

from __future__ import annotations

import functools
import os
import json
from pathlib import Path

CACHE_MAX = 500_000


RULES_FORMAT = 5
NATIVE_VERSION = 3  # the filters/_native.c this code is written for (its VERSION)


def _rules_file(language: str) -> Path | None:
    """Where this language's rules are kept for this spaCy version (no spaCy import)."""
    import importlib.util
    import re

    try:  # spaCy's version from its about.py (importlib.metadata scans every distribution: ~15 ms)
        spec = importlib.util.find_spec("spacy")
        about = Path(spec.origin).parent / "about.py"
        v = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", about.read_text()).group(1)
    except Exception:  # not found or not readable: no cache
        return None
    from filters.models import cache_dir

    return cache_dir() / "spacy-rules" / f"{language}-spacy{v}-f{RULES_FORMAT}.json"


def load_rules(language: str) -> dict:
    """spaCy's tokenizer rules for a language: patterns, flags, special cases and the
    sentencizer's punctuation. Read from spaCy once (importing spaCy and building a
    blank pipeline costs ~0.6 s in every fresh worker), then from a JSON file beside the
    models keyed by spaCy's version; a file that cannot be written is simply not kept."""
    path = _rules_file(language)
    if path is not None and path.is_file():
        try:
            return _from_json(json.loads(path.read_text(encoding="utf-8")))
        except Exception:  # a torn or foreign file: rebuild it
            pass
    import spacy
    from spacy.attrs import ORTH
    from spacy.pipeline import Sentencizer

    tok = spacy.blank(language).tokenizer

    def pat(f):
        p = getattr(f, "__self__", None) if f is not None else None
        return None if p is None else (p.pattern, p.flags)

    strings = tok.vocab.strings
    rules = {
        "prefix": pat(tok.prefix_search), "suffix": pat(tok.suffix_search), "infix": pat(tok.infix_finditer),
        "token_match": pat(tok.token_match), "url_match": pat(tok.url_match),
        "special": {orth: tuple(t[ORTH] if isinstance(t[ORTH], str) else strings[t[ORTH]] for t in toks)
                    for orth, toks in tok.rules.items()},
        "sentence_punct": sorted(Sentencizer.default_punct_chars),
    }
    rules["analysis"] = {key: analyse(*rules[key]) for key in ("prefix", "suffix", "infix", "url_match")
                         if rules[key] is not None}
    rules["ascii"] = ascii_tables(rules)
    if fingerprint(rules) not in COMPILED_FOR and _native() is not None:  # kept only when checked, with what
        rules["ascii_checked"] = NATIVE_VERSION if _self_check(language, rules) else False
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(rules), encoding="utf-8")
            os.replace(tmp, path)
        except (OSError, ValueError):
            pass
    return rules


def _from_json(rules: dict) -> dict:
    """JSON has lists where the rules have tuples."""
    out = dict(rules)
    for key in ("prefix", "suffix", "infix", "token_match", "url_match"):
        out[key] = tuple(rules[key]) if rules[key] is not None else None
    out["special"] = {k: tuple(v) for k, v in rules["special"].items()}
    out.setdefault("analysis", {})
    if out.get("ascii") is not None:
        out["ascii"] = dict(out["ascii"], after_digit=tuple(out["ascii"]["after_digit"]))
    return out


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


def ascii_tables(rules: dict) -> dict | None:
    """The character sets and lists the compiled loop needs, read off the rules' regexes
    by probing them on ASCII (None when a rule is missing): one-character prefixes and
    suffixes, the characters after which a final "." is a suffix, the quotes of the infix
    dot rule, the suffixes that follow a digit ("+", currencies, units: parsed from the
    suffix pattern's `(?<=[0-9])(?:...)` groups and each confirmed by the regex), the host
    characters of a URL and the characters every URL match consumes."""
    import re

    if any(rules.get(k) is None for k in ("prefix", "suffix", "infix", "url_match")):
        return None
    pre, suf, inf = (re.compile(*rules[k]) for k in ("prefix", "suffix", "infix"))
    printable = [chr(i) for i in range(33, 127)]

    def suffix_at(s):
        m = suf.search(s)
        return None if m is None else m.start()

    def infix_at(s):
        return [(m.start(), m.end()) for m in inf.finditer(s)]

    pre1 = "".join(c for c in printable if c not in "+." and (m := pre.match(c + "a")) and m.end() == 1)
    suf1 = "".join(c for c in printable if suffix_at("@" + c) == 1)
    dot_after = "".join(c for c in printable if suffix_at("@" + c + ".") == 2)
    q_before = {c for c in printable if not c.islower() and infix_at(c + ".A") == [(1, 2)]}
    q_after = {c for c in printable if not c.isupper() and c != "." and infix_at("a." + c) == [(1, 2)]}
    if q_before != q_after:
        return None
    after_digit = ["+"]
    for group in re.findall(r"\(\?<=\[0-9\]\)\(\?:([^()]*)\)", rules["suffix"][0]):
        for alt in group.split("|"):
            u = re.sub(r"\\(.)", r"\1", alt)
            if u and u.isascii() and u not in after_digit and suffix_at("1" + u) == 1:
                after_digit.append(u)
    need = rules.get("analysis", {}).get("url_match", {}).get("need") or []
    return {"pre1": pre1, "suf1": suf1, "dot_after": dot_after, "inf_q": "".join(sorted(q_before)),
            "after_digit": after_digit, "url_host": "".join(c for c in printable if c.isalnum() or c in "_.-"),
            "url_need": "".join(c for c in need if c.isascii())}


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
            return _LazyRx(*rules[key]), (got if got is not None else analyse(*rules[key]))

        (prefix, pi), (suffix, si), (infix, ii) = lazy("prefix"), lazy("suffix"), lazy("infix")
        url, ui = lazy("url_match")
        token_match = re.compile(*rules["token_match"]) if rules["token_match"] is not None else None
        self.prefix_search = _anchored_prefix(prefix, pi) if prefix else never.search
        self.suffix_start = _tail_suffix(suffix, si) if suffix else (lambda s: None)
        self.infix_finditer = _candidate_infix(infix, ii) if infix else never.finditer
        self.token_match_or_none = token_match.match if token_match else None
        self.url_match = _needs_literals(url, ui) if url else never.match
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


def _required_literals(seq, parser) -> frozenset[str]:
    """Characters every match of the parsed pattern `seq` must consume (a necessary
    condition only: lookarounds, classes and optional parts require nothing)."""
    need: set[str] = set()
    for op, av in seq:
        if op is parser.LITERAL:
            need.add(chr(av))
        elif op is parser.IN and len(av) == 1 and av[0][0] is parser.LITERAL:
            need.add(chr(av[0][1]))
        elif op is parser.SUBPATTERN and not (av[1] or av[2]):
            need |= _required_literals(av[3].data, parser)
        elif op is parser.ATOMIC_GROUP:
            need |= _required_literals(av.data, parser)
        elif op in (parser.MAX_REPEAT, parser.MIN_REPEAT, parser.POSSESSIVE_REPEAT) and av[0] >= 1:
            need |= _required_literals(av[2].data, parser)
        elif op is parser.BRANCH:
            alts = [_required_literals(a.data, parser) for a in av[1]]
            need |= frozenset.intersection(*alts) if alts else frozenset()
    return frozenset(need)


def _edge_items(seq, last: bool = False):
    """The characters a match of the parsed pattern `seq` can consume first (or last), as
    `re` character-set items, and whether it can match without consuming any; None when
    the pattern is beyond this simple analysis (negated sets, any-character, flags...)."""
    from re import _parser as P

    items = []
    for op, av in (list(seq)[::-1] if last else list(seq)):
        if op in (P.AT, P.ASSERT, P.ASSERT_NOT):
            continue
        if op is P.LITERAL:
            return items + [(P.LITERAL, av)], False
        if op is P.IN:
            if any(o is P.NEGATE for o, _ in av):
                return None
            return items + list(av), False
        if op is P.SUBPATTERN:
            if av[1] or av[2]:
                return None
            subs, lo = [av[3]], 1
        elif op is P.BRANCH:
            subs, lo = av[1], 1
        elif op in (P.MAX_REPEAT, P.MIN_REPEAT, P.POSSESSIVE_REPEAT):
            subs, lo = [av[2]], av[0]
        else:
            return None
        nullable = False
        for sub in subs:
            r = _edge_items(sub.data, last)
            if r is None:
                return None
            items += r[0]
            nullable |= r[1]
        if lo > 0 and not nullable:
            return items, False
    return items, True


class _LazyRx:
    """A regex compiled at its first use: spaCy's infix and URL regexes take ~20 ms to
    compile, and a worker whose text never needs them should not pay it. After the first
    call the compiled methods replace these on the instance."""

    def __init__(self, pattern: str, flags: int):
        self.pattern, self.flags = pattern, flags

    def _compile(self):
        import re

        c = re.compile(self.pattern, self.flags)
        self.match, self.search, self.finditer = c.match, c.search, c.finditer
        return c

    def match(self, *args):
        return self._compile().match(*args)

    def search(self, *args):
        return self._compile().search(*args)

    def finditer(self, *args):
        return self._compile().finditer(*args)

    def compiled_match(self):
        """The compiled regex's own `match` (for the C loop to call)."""
        return self._compile().match


def _class_source(cls) -> str:
    """A regex character class, as source, matching exactly the characters `cls` matches
    (found by running it over every code point once; only when the rules are built)."""
    pos = [m.start() for m in cls.finditer("".join(map(chr, range(0x110000))))]
    if not pos:
        return "(?!)"
    ranges, lo, prev = [], pos[0], pos[0]
    for p in pos[1:]:
        if p != prev + 1:
            ranges.append((lo, prev))
            lo = p
        prev = p
    ranges.append((lo, prev))
    return "[" + "".join(f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges) + "]"


def analyse(pattern: str, flags: int) -> dict:
    """What the shortcuts need to know of one of spaCy's regexes, read off its parse tree
    (`re._parser`) once per spaCy version and kept with the rules:

    - `anchored`: every alternative starts with `^` (then `match` is `search`);
    - `first` / `last`: a character class (as source) of the characters every match
      starts / ends with, or None;
    - `k`: the longest alternative when all are bounded but a run of one repeated
      character (`\\.\\.+$`), else None; `behind`: the longest lookbehind, or None;
    - `need`: characters every match consumes.
    Anything the analysis does not understand turns its shortcut off."""
    import re
    from re import _compiler, _parser as P

    out = {"anchored": False, "first": None, "last": None, "k": None, "behind": None, "need": []}
    if flags & (re.IGNORECASE | re.VERBOSE):
        return out
    try:
        tree = P.parse(pattern, flags)
        alts = tree.data[0][1][1] if len(tree.data) == 1 and tree.data[0][0] is P.BRANCH else [tree]
        out["anchored"] = not flags & re.MULTILINE and all(
            a.data and a.data[0][0] is P.AT and a.data[0][1] is P.AT_BEGINNING for a in alts)
        for key, last in (("first", False), ("last", True)):
            r = _edge_items(tree.data, last)
            if r is not None and not r[1]:
                sub = P.SubPattern(P.State())
                sub.append((P.IN, r[0]))
                out[key] = _class_source(_compiler.compile(sub, flags & re.UNICODE))
        width, ok = 0, True
        for a in alts:
            hi = a.getwidth()[1]
            if hi < P.MAXREPEAT:
                width = max(width, hi)
                continue
            d = a.data  # allowed unbounded: one literal, then the same literal repeated, then $
            ok = ok and (len(d) == 3 and d[0][0] is P.LITERAL and d[1][0] is P.MAX_REPEAT
                         and list(d[1][1][2].data) == [d[0]] and d[2] == (P.AT, P.AT_END))
        out["k"] = max(width, 2) if ok else None
        out["behind"] = _lookbehind(tree.data, P)
        out["need"] = sorted(_required_literals(tree.data, P))
    except Exception:  # private API of `re`: any surprise means no shortcut
        return {"anchored": False, "first": None, "last": None, "k": None, "behind": None, "need": []}
    return out


def _char_class(src: str | None):
    import re

    return None if src is None else re.compile(src)


def _needs_literals(rx: _LazyRx, info: dict):
    """`rx.match`, answered None at once for a text lacking a character every match
    consumes (spaCy's URL regex needs a "." in any host): most chunks are not URLs."""
    need = tuple(info["need"])

    def url_match(s: str):
        for c in need:
            if c not in s:
                return None
        return rx.match(s)

    return url_match


def _anchored_prefix(rx: _LazyRx, info: dict):
    """spaCy's prefix regex is an alternation of `^...` patterns: `match` gives what
    `search` gives, without trying every later position of the chunk; a chunk whose first
    character starts no alternative is answered without running it."""
    if not info["anchored"]:
        return lambda s: rx.search(s)
    first = _char_class(info["first"])
    if first is None:
        return lambda s: rx.match(s)
    first_match = first.match

    def prefix_match(s: str):
        return rx.match(s) if first_match(s) else None

    return prefix_match


def _candidate_infix(rx: _LazyRx, info: dict):
    """spaCy's infix regex, tried only where a match can start (a character some
    alternative consumes first): the same matches as `finditer`, which tries every
    position of the chunk against every alternative."""
    first = _char_class(info["first"])
    if first is None:
        return lambda s: rx.finditer(s)
    candidates = first.finditer

    def infix_finditer(s: str):
        out, end = [], 0
        for c in candidates(s):
            p = c.start()
            if p >= end:
                m = rx.match(s, p)
                if m is not None:
                    out.append(m)
                    end = m.end()
        return out

    return infix_finditer


class _Pos:
    def __init__(self, p: int):
        self.p = p

    def start(self) -> int:
        return self.p


def _lookbehind(seq, parser) -> int | None:
    """The most characters before a match position that the pattern can look at
    (lookbehinds, word boundaries); None if unbounded or anchored at the string start."""
    most = 0
    for op, av in seq:
        if op in (parser.ASSERT, parser.ASSERT_NOT):
            direction, sub = av
            if direction < 0:
                hi = sub.getwidth()[1]
                if hi >= parser.MAXREPEAT:
                    return None
                most = max(most, hi)
            inner = _lookbehind(sub.data, parser)
            if inner is None:
                return None
            most = max(most, inner)
        elif op is parser.AT:
            if av in (parser.AT_BOUNDARY, parser.AT_NON_BOUNDARY, parser.AT_UNI_BOUNDARY, parser.AT_UNI_NON_BOUNDARY,
                      parser.AT_LOC_BOUNDARY, parser.AT_LOC_NON_BOUNDARY):
                most = max(most, 1)
            elif av not in (parser.AT_END, parser.AT_END_STRING):
                return None
        elif op in (parser.GROUPREF, parser.GROUPREF_EXISTS):
            return None
        else:
            subs = []
            if op is parser.SUBPATTERN:
                subs = [av[3]]
            elif op is parser.BRANCH:
                subs = av[1]
            elif op in (parser.MAX_REPEAT, parser.MIN_REPEAT, parser.POSSESSIVE_REPEAT):
                subs = [av[2]]
            elif op is parser.ATOMIC_GROUP:
                subs = [av]
            for sub in subs:
                inner = _lookbehind(sub.data, parser)
                if inner is None:
                    return None
                most = max(most, inner)
    return most


_NO = object()


def _tail_suffix(rx: _LazyRx, info: dict):
    """`start(s)`: where spaCy's suffix regex matches at the end of `s` (None: nowhere).

    The regex is an alternation of `...$` patterns, all at most K characters long but
    `\\.\\.+$`. Trying the last K positions (lookbehinds still see the characters
    before) finds what a search from 0 finds, unless the match starts at `len - K`
    itself, where a longer run of dots may start earlier: then the full search decides.
    A chunk whose last character ends no alternative, and positions whose character
    starts none, are skipped. The answer for the last K positions depends only on the
    last K + B characters (B: the longest lookbehind), which recur across chunks ("ing),"):
    it is remembered by them. Any other shape of regex: the plain search."""

    def plain(s: str):
        m = rx.search(s)
        return None if m is None else m.start()

    k, behind = info["k"], info["behind"]
    if k is None:
        return plain
    first, last = _char_class(info["first"]), _char_class(info["last"])
    first_search = first.search if first is not None else (lambda s, p: _Pos(p) if p < len(s) else None)
    last_match = last.match if last is not None else (lambda s, p: True)
    window = k + (behind or 0)
    cache: dict[str, int | None] = {}

    def from_end(key: str) -> int | None:
        """Characters from the end of `key` to the first match in its last k positions."""
        p = max(0, len(key) - k)
        while True:
            c = first_search(key, p)
            if c is None:
                return None
            p = c.start()
            if rx.match(key, p) is not None:
                return len(key) - p
            p += 1

    def start(s: str) -> int | None:
        n = len(s)
        if not n or not last_match(s, n - 1):
            return None
        if behind is None:
            off = from_end(s)
        else:
            key = s[-window:]
            off = cache.get(key, _NO)
            if off is _NO:
                if len(cache) > 200_000:
                    cache.clear()
                off = cache[key] = from_end(key)
        if off is None:
            return None
        if off == k and n > k:  # a run of dots may start before the last k positions
            return plain(s)
        return n - off

    return start


@functools.lru_cache(maxsize=8)
def splitter(language: str = "en") -> WordSplitter:
    """One splitter per language per worker process (compiling spaCy's rules takes ~0.05 s)."""
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
