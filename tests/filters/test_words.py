"""filters/words.py against spaCy's own tokenizer, chunk by chunk.

The splitter runs spaCy's algorithm with shortcuts read off spaCy's regexes (where a
prefix, suffix, infix or URL can match at all; the suffix answer remembered by a chunk's
last characters; regexes compiled at first use). Each shortcut must give spaCy's tokens
exactly, so the oracle here is spaCy itself, on real chunks of the demo's text and on
random chunks built from the characters its rules care about.

Known difference, older than these shortcuts: runs of emoticons glued together (":):)")
are re-joined by spaCy's special-case matcher differently from the longest-first merge
here; the random pieces leave emoticons out for that reason (none occurred in the
conformance corpora).
"""

from __future__ import annotations

import gzip
import random

import orjson
import pyarrow.parquet as pq
import pytest

from filters.words import WordSplitter

PIECES = list(".,;:!?()[]{}\"'`-_/\\@#$%^&*+=<>|~…—–’“”«»°²0123456789aAbBzZéßхЯ中") + [
    "...", "'s", "n't", "km", "kg", "mph", "U.S.", "e.g.", "http://", "www.", ".com", ".org", "10", "192.168.", "a.m.",
    "Mr.", "can", "do", "self", "foo_bar", "x86", "C++", "__init__", "..", "--", "'ll", "'re"]


@pytest.fixture(scope="module")
def spacy_tokenizer():
    import spacy

    return spacy.blank("en").tokenizer


def _same(chunks, splitter, tok):
    bad = [(c, splitter.split(c), [t.text for t in tok(c)]) for c in chunks]
    return [b for b in bad if b[1] != b[2]]


def test_random_chunks_split_as_spacy_does(spacy_tokenizer):
    rng = random.Random(11)
    chunks = {"".join(rng.choice(PIECES) for _ in range(rng.randint(1, 10))) for _ in range(30000)}
    bad = _same(sorted(chunks), WordSplitter("en"), spacy_tokenizer)
    assert not bad, bad[:5]


def test_real_chunks_split_as_spacy_does(spacy_tokenizer, demo_corpus):
    texts = pq.read_table(demo_corpus / "wiki" / "summaries_fr.parquet", columns=["text"]).column("text").to_pylist()[:300]
    texts += [orjson.loads(x)["text"] for x in
              gzip.decompress((demo_corpus / "code" / "stdlib-00001.jsonl.gz").read_bytes()).splitlines()[:60]]
    chunks = sorted({c for t in texts for c in t.split() if not c.isalpha()})
    assert len(chunks) > 5000
    bad = _same(chunks, WordSplitter("en"), spacy_tokenizer)
    assert not bad, bad[:5]


# ---------------------------------------------------------------- the compiled loop
# filters/_native.c runs the same loop over ASCII chunks in C, with tables probed from
# spaCy's regexes. The tests above already go through it (WordSplitter uses it when
# built); here it is compared with the Python loop on many more chunks than spaCy can
# tokenize in a test's time, including every short string of the characters its rules
# look at.

ASCII_PIECES = list(".,;:!?()[]{}\"'`-_/\\@#$%^&*+=<>|~0123456789aAbBzZsSUCKMGTkmgt") + [
    "...", "'s", "'S", "n't", "km", "kg", "mph", "U.S.", "e.g.", "i.e.", "vs.", "http://", "https://", "www.", ".com",
    ".org", "10", "192.168.", "127.0.0.1", "1.2.3.4", ":8080", "a.m.", "Mr.", "can", "do", "self", "foo_bar", "x86",
    "C++", "__init__", "..", "--", "---", "'ll", "'re", "US$", "C$", "A$", "m/s", "km/h", "hPa", "mbar", "://", "@",
    "a-b", ":)", ":-)", "<3", "(:", "o.O"]


def test_the_compiled_loop_is_built_and_used_for_english():
    from filters.words import COMPILED_FOR, NATIVE_VERSION, _native, fingerprint, load_rules

    assert _native() is not None, "filters/_native.c was not built, or is stale: is a C compiler installed? (make setup builds it)"
    rules = load_rules("en")
    assert fingerprint(rules) in COMPILED_FOR or rules.get("ascii_checked") == NATIVE_VERSION, \
        "spaCy's English rules changed and the compiled loop failed its check: see filters/_native.c"
    w = WordSplitter("en")
    assert w.chunk_words("(self.x,") == ("(", "self.x", ",")
    assert w.compiled is not None
    assert w.compiled.split("naïve,") is None  # not ASCII: the Python loop
    assert w.chunk_words("naïve,") == ("naïve", ",")


def test_compiled_loop_gives_the_python_loop_words():
    import itertools

    w = WordSplitter("en")
    w.chunk_words("a,b")
    rng = random.Random(5)
    chunks = {"".join(rng.choice(ASCII_PIECES) for _ in range(rng.randint(1, 9))) for _ in range(60000)}
    small = ".,;:!?()[]\"'`-/@$%^*+=<>~0aAsSK#_"
    for n in (1, 2, 3):
        chunks.update("".join(t) for t in itertools.product(small, repeat=n))
    chunks = sorted(chunks)
    bad = [(c, w.split_chunk(c), w.compiled.split(c)) for c in chunks]
    bad = [b for b in bad if b[1] != b[2]]
    assert not bad, bad[:5]


def test_compiled_loop_on_real_code_and_docs(demo_corpus):
    w = WordSplitter("en")
    w.chunk_words("a,b")
    texts = [orjson.loads(x)["text"] for f in sorted((demo_corpus / "code").glob("*.jsonl.gz"))[:2]
             for x in gzip.decompress(f.read_bytes()).splitlines()]
    chunks = sorted({c for t in texts for c in t.split() if c.isascii() and not c.isalpha()})
    assert len(chunks) > 20000
    bad = [(c, w.split_chunk(c), w.compiled.split(c)) for c in chunks]
    bad = [b for b in bad if b[1] != b[2]]
    assert not bad, bad[:5]


def test_rules_it_was_not_tested_against_need_the_self_check():
    """Another spaCy's rules: the compiled loop is used only if it gives the Python loop's
    words on the check's chunks. An infix rule its structure does not know ("@" between
    letters) fails the check, and the splitter keeps to the Python loop (spaCy's words)."""
    from filters.regex_shortcuts import analyse
    from filters.spacy_rules import ascii_tables
    from filters.words import _self_check, load_rules

    rules = dict(load_rules("en"))
    assert _self_check("en", rules)  # the rules it knows pass too
    pattern, flags = rules["infix"]
    rules["infix"] = (pattern + r"|(?<=[a-z])@(?=[a-z])", flags)
    rules["analysis"] = dict(rules["analysis"], infix=analyse(*rules["infix"]))
    rules["ascii"] = ascii_tables(rules)
    assert not _self_check("en", rules)
    w = WordSplitter("en", rules=rules)  # the fingerprint unknown, no passed check recorded
    assert w.chunk_words("user@example") == ("user", "@", "example")
    assert w.compiled is None
