"""The batch kernels (filters/kernels.py) against datatrove's own per-document functions.

Every count the Gopher filters decide on, computed for a whole batch at once, must equal
what datatrove computes one document at a time: the top n-gram's characters (" ".join
identity, ties to the first seen), the repeated n-grams' characters ("".join identity,
left-to-right scan that skips past a repeat), word counts. On real text (the demo's
summaries, pages and standard-library modules) and on cases built to break a shortcut.
"""

from __future__ import annotations

import gzip

import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest
from datatrove.pipeline.filters.gopher_repetition_filter import find_all_duplicate, find_top_duplicate, get_n_grams

from filters import kernels
from filters.words import splitter


@pytest.fixture(autouse=True, params=["C", "numpy"])
def native(request, monkeypatch):
    """Every test twice: with filters/_native.c's n-gram counts and with the numpy
    kernels that run where it was not built."""
    if request.param == "C":
        assert kernels.native() is not None, "filters/_native.c was not built"
    else:
        monkeypatch.setenv("CURATE_NATIVE", "0")
        assert kernels.native() is None
    return request.param


def _reference(texts: list[str]):
    words = [splitter("en").split(t) for t in texts]
    top = {n: [find_top_duplicate(get_n_grams(w, n)) if len(w) >= n else 0 for w in words] for n in (2, 3, 4)}
    dup = {n: [find_all_duplicate(w, n) if len(w) >= n else 0 for w in words] for n in range(5, 11)}
    return words, top, dup


def _check(texts: list[str]):
    words, top, dup = _reference(texts)
    w = kernels.batch_words(texts)
    assert w.counts.tolist() == [len(x) for x in words]
    for i, x in enumerate(words):
        assert [w.vocab.words[j] for j in w.ids[w.off[i]:w.off[i + 1]]] == x
    for n in top:
        assert kernels.top_ngram_chars(w, n).tolist() == top[n], n
    for n in dup:
        assert kernels.dup_ngram_chars(w, n).tolist() == dup[n], n
    return top, dup


@pytest.fixture(scope="module")
def real_text(demo_corpus) -> list[str]:
    wiki = pq.read_table(demo_corpus / "wiki" / "summaries_en.parquet", columns=["text"]).column("text").to_pylist()[:300]
    fr = pq.read_table(demo_corpus / "wiki" / "summaries_fr.parquet", columns=["text"]).column("text").to_pylist()[:100]
    code = [orjson.loads(x)["text"] for x in gzip.decompress((demo_corpus / "code" / "stdlib-00000.jsonl.gz").read_bytes()).splitlines()]
    return wiki + fr + [t for t in code if len(t) < 30000][:120]


def test_kernels_equal_datatrove_on_real_text(real_text):
    top, dup = _check(real_text)
    assert sum(v > 0 for v in dup[5]) > 50  # repeated 5-grams do occur (the scan is exercised)


def test_concatenation_identity_ties_and_document_boundaries():
    texts = [
        "ab c d e f g h i j k ab c d e f g h i j k",  # a plain repeat
        "ab c d e f x y z w a bc d e f",  # "abcdef" twice by concatenation, as datatrove joins 5-grams
        "one two one two three three one two",  # ties in the top 2-gram: the first seen wins
        "a b c d e f g h i j k l m n o p",  # nothing repeated
        "",
        "x",
        "same words in two documents same words",
        "same words in two documents same words",  # a repeat across documents counts in neither
        "a a a a a a a a a a a a a a a a a a a a a a a a",  # overlapping repeats: the scan skips
        "lot's of-punctuation, (here) and \"there\"... lot's of-punctuation, (here) and \"there\"...",
    ]
    top, dup = _check(texts)
    assert dup[5][1] == len("abcdef")  # only the concatenation repeats
    assert top[2][2] == len("one two") * 3


def test_a_batch_gives_each_document_what_it_gets_alone(real_text):
    texts = real_text[:60]
    together = kernels.batch_words(texts)
    alone = [kernels.batch_words([t]) for t in texts]
    for n in (2, 5, 8):
        t = kernels.top_ngram_chars(together, n) if n < 5 else kernels.dup_ngram_chars(together, n)
        a = [int((kernels.top_ngram_chars(x, n) if n < 5 else kernels.dup_ngram_chars(x, n))[0]) for x in alone]
        assert t.tolist() == a


def test_vocabulary_reset_keeps_results(real_text, monkeypatch):
    texts = real_text[:80]
    before = kernels.dup_ngram_chars(kernels.batch_words(texts), 5)
    monkeypatch.setattr(kernels, "CHUNK_CACHE_MAX", 10)  # the next batch starts a fresh vocabulary
    v = kernels.vocab("en")
    gen = v.generation
    after = kernels.dup_ngram_chars(kernels.batch_words(texts), 5)
    assert v.generation == gen + 1
    assert np.array_equal(before, after)


def test_a_fresh_worker_reads_the_rules_without_importing_spacy(tmp_path):
    import os
    import subprocess
    import sys

    code = ("import sys; from filters.words import splitter; "
            "print(repr(splitter('en').split(\"Don't split U.S. e-mail (km/s.) http://x.org ...\")), 'spacy' in sys.modules)")
    env = {**os.environ, "CURATE_CACHE_DIR": str(tmp_path)}
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert list((tmp_path / "spacy-rules").glob("en-spacy*.json"))
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert first.rsplit(" ", 1)[1].strip() == "True" and second.rsplit(" ", 1)[1].strip() == "False"
    assert first.rsplit(" ", 1)[0] == second.rsplit(" ", 1)[0]  # the same words either way


def test_limit_and_small_groups_give_the_same_answers(real_text, monkeypatch):
    texts = real_text
    size = np.array([len(t) for t in texts], dtype=np.float64)
    w = kernels.batch_words(texts)
    exact = {n: kernels.dup_ngram_chars(w, n) for n in (5, 7, 10)}
    tops = {n: kernels.top_ngram_chars(w, n) for n in (2, 4)}
    for n, frac in ((5, 0.15), (7, 0.13), (10, 0.10)):
        limit = frac * size
        got = kernels.dup_ngram_chars(w, n, limit=limit)
        over = exact[n] > limit
        assert np.array_equal(got > limit, over)  # the same threshold decisions
        assert np.array_equal(got[over], exact[n][over])  # exact where it matters
    monkeypatch.setattr(kernels, "GROUP_KEYS", 1000)  # many pre-pass groups, some one document long
    w = kernels.batch_words(texts)
    assert all(np.array_equal(kernels.dup_ngram_chars(w, n), exact[n]) for n in exact)
    assert all(np.array_equal(kernels.top_ngram_chars(w, n), tops[n]) for n in tops)


def test_filters_decide_the_same_group_by_group(real_text, monkeypatch):
    """A batch of long documents runs through the kernels in groups of bounded size
    (bounded memory); the decisions do not depend on the grouping."""
    import pyarrow as pa

    from filters import base

    batch = pa.RecordBatch.from_pydict({"id": [str(i) for i in range(len(real_text))], "text": real_text})
    names = ["gopher_quality", "gopher_repetition", "fineweb_quality"]
    whole = {n: base.build(base.parse_params({"type": n})).apply(batch).reasons for n in names}
    assert len(kernels.groups(real_text)) == 1
    monkeypatch.setattr(kernels, "GROUP_CHARS", 20_000)  # most groups a few documents, long ones alone
    assert len(kernels.groups(real_text)) > 20
    kernels.vocab("en").memo.clear()
    for n in names:
        assert base.build(base.parse_params({"type": n})).apply(batch).reasons == whole[n], n


def test_texts_without_words_in_a_fresh_vocabulary(monkeypatch):
    """A new worker's first group may hold only whitespace: no words, an empty vocabulary
    (the per-word arrays are empty, not missing)."""
    import pyarrow as pa

    from filters import base

    monkeypatch.setattr(kernels, "_VOCABS", {})
    batch = pa.RecordBatch.from_pydict({"id": ["a", "b"], "text": ["   ", " \t "]})
    rep = base.build(base.parse_params({"type": "gopher_repetition"})).apply(batch)
    assert rep.keep.tolist() == [True, True]  # nothing repeats
    quality = base.build(base.parse_params({"type": "gopher_quality"})).apply(batch)
    assert list(quality.reasons) == ["too_few_words", "too_few_words"]
    assert kernels.top_ngram_chars(kernels.batch_words(["  "]), 2).tolist() == [0]
