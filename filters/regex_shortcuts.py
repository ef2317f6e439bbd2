"""What one of spaCy's tokenizer regexes can match, read off its parse tree, and the
faster calls built from that.

Why this module: the word splitter (filters/words.py) runs spaCy's tokenizer loop, which
asks the prefix, suffix, infix and URL regexes about every chunk, and most of those
questions are answered without running the regex. `analyse` reads what decides them off a
pattern's parse tree (`re._parser`), once per spaCy version (the result is kept in the
rules file, filters/spacy_rules.py). The builders turn a regex and its analysis into a call
that answers as the regex does: the prefix regex run as an anchored match only when the
first character can start one (`anchored_prefix`); the suffix regex on the last K positions
only when the last character can end one, its answer remembered by the last K+B characters,
B the longest lookbehind (`tail_suffix`); the infix regex only at characters that can start
an infix (`candidate_infix`); the URL regex only on chunks holding the characters every URL
match consumes (`needs_literals`). `LazyRx` compiles a regex at its first use. Nothing here
knows spaCy or its files, so another language's rules get the same treatment, or none
where the analysis does not apply.
"""

from __future__ import annotations

import functools


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
    from re import _parser as P

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
                out[key] = _class_source(r[0], flags & re.UNICODE)
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


@functools.cache
def _every_code_point() -> str:
    return "".join(map(chr, range(0x110000)))


def _class_source(items, flags: int) -> str:
    """A regex character class, as source, matching exactly the characters the class of
    parse-tree `items` matches: found by running its repetition over every code point once
    (each run of matching code points is one range), only when the rules are built."""
    from re import _compiler, _parser as P

    one = P.SubPattern(P.State())
    one.append((P.IN, items))
    runs = P.SubPattern(P.State())
    runs.append((P.MAX_REPEAT, (1, P.MAXREPEAT, one)))
    ranges = [(m.start(), m.end() - 1) for m in _compiler.compile(runs, flags).finditer(_every_code_point())]
    if not ranges:
        return "(?!)"
    return "[" + "".join(f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges) + "]"


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


class LazyRx:
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


def _char_class(src: str | None):
    import re

    return None if src is None else re.compile(src)


def needs_literals(rx: LazyRx, info: dict):
    """`rx.match`, answered None at once for a text lacking a character every match
    consumes (spaCy's URL regex needs a "." in any host): most chunks are not URLs."""
    need = tuple(info["need"])

    def url_match(s: str):
        for c in need:
            if c not in s:
                return None
        return rx.match(s)

    return url_match


def anchored_prefix(rx: LazyRx, info: dict):
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


def candidate_infix(rx: LazyRx, info: dict):
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


_NO = object()


def tail_suffix(rx: LazyRx, info: dict):
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
