"""spaCy's tokenizer rules, read from the installed spaCy once and kept in a file per
spaCy version.

Why this module: importing spaCy and building a blank pipeline costs ~0.6 s in every
fresh worker, and the word splitter (filters/words.py) needs only its rules: the prefix,
suffix, infix, token-match and URL patterns, the special cases and the sentencizer's
punctuation. `rules_from_spacy` reads them, with what is read off them once: each regex's
analysis (filters/regex_shortcuts.py) and the ASCII tables the compiled loop
(filters/_native.c) is given (`ascii_tables`, probed from the regexes). `rules_file`,
`read_rules` and `save_rules` keep them as JSON beside the models, keyed by spaCy's version
and RULES_FORMAT; the file holds data only (no module or function names). Putting these
together, with the compiled loop's self-check when a file is built, is filters/words.py's
`load_rules` (the check splits words, so it lives with the splitter).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from filters.regex_shortcuts import analyse

RULES_FORMAT = 5


def rules_file(language: str) -> Path | None:
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


def read_rules(path: Path | None) -> dict | None:
    """The rules kept at `path`, or None (no file, or a torn or foreign one: rebuild it)."""
    if path is not None and path.is_file():
        try:
            return _from_json(json.loads(path.read_text(encoding="utf-8")))
        except Exception:
            pass
    return None


def rules_from_spacy(language: str) -> dict:
    """spaCy's tokenizer rules for a language: patterns, flags, special cases and the
    sentencizer's punctuation, with each regex's analysis and the compiled loop's ASCII
    tables (imports spaCy)."""
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
    return rules


def save_rules(path: Path | None, rules: dict) -> None:
    """Keep `rules` at `path` (written whole, then renamed); a file that cannot be written
    is simply not kept."""
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(rules), encoding="utf-8")
            os.replace(tmp, path)
        except (OSError, ValueError):
            pass


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
