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
