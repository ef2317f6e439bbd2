"""Dedup keys on real text: normalisation against datatrove, shingles and Jaccard against
plain Python sets, MinHash estimates against true Jaccard, paragraph spans."""

from __future__ import annotations

import random
import re

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline.shards import text as T

OPTION_SETS = [["whitespace", "case"], ["whitespace", "case", "punctuation", "digits"], ["punctuation"], ["digits", "whitespace"]]


@pytest.fixture(scope="module")
def real_texts(demo_corpus) -> list[str]:
    out = []
    for lang in ("en", "fr", "es"):
        out += pq.read_table(demo_corpus / "wiki" / f"summaries_{lang}.parquet", columns=["text"]).column("text").to_pylist()[:700]
    out += ["  Tabs\tand\u00a0non-breaking\u2003spaces , « quotes » — 1,000.5 apples; ٣٤ ", "", "...", "1 2 3"]
    return out


@pytest.mark.parametrize("options", OPTION_SETS, ids=["+".join(o) for o in OPTION_SETS])
def test_normalize_agrees_with_datatrove_simplify_text(real_texts, options):
    from datatrove.utils.text import TextNormConfig, simplify_text

    cfg = TextNormConfig(lowercase="case" in options, norm_whitespace="whitespace" in options,
                         remove_punctuation="punctuation" in options, norm_unicode_diacritics=False,
                         norm_numbers="digits" in options)
    bad = [t for t in real_texts if T.normalize(t, options) != simplify_text(t, cfg).encode()]
    assert not bad, f"{len(bad)}/{len(real_texts)} differ, e.g. {bad[0][:120]!r}"


def _naive_words(t: str) -> list[str]:
    """fold's rules, written plainly: lowercase, datatrove's punctuation and all whitespace
    to spaces, ASCII digit runs to 0, split."""
    from datatrove.utils.text import PUNCTUATION

    t = "".join(" " if c in PUNCTUATION or c.isspace() else c for c in t.lower())
    return re.sub("[0-9]+", "0", t).split()


def _naive_shingles(t: str, n: int) -> set:
    w = _naive_words(t)
    if not w:
        return set()
    return {tuple(w[i : i + n]) for i in range(max(1, len(w) - n + 1))}


def test_shingle_sets_and_jaccard_match_python_sets(real_texts):
    rng = random.Random(0)
    texts = real_texts[:700] + real_texts[-300:]
    h, d = T.shingles(texts, 5)
    for i, t in enumerate(texts):
        assert len(np.unique(h[d == i])) == len(_naive_shingles(t, 5)), t[:200]
    for _ in range(200):
        a, b = rng.choice(texts), rng.choice(texts)
        if rng.random() < 0.7 and a.split():  # an edited copy of a, for Jaccards across the range
            words = a.split()
            for _ in range(rng.randint(0, 20)):
                words[rng.randrange(len(words))] = "zz%d" % rng.randint(0, 99)
            b = "  ".join(words)  # extra spaces do not change the shingles
        sa, sb = _naive_shingles(a, 5), _naive_shingles(b, 5)
        want = len(sa & sb) / len(sa | sb) if sa | sb else 1.0
        assert T.jaccard(T.shingle_set(a, 5), T.shingle_set(b, 5)) == pytest.approx(want)


def test_the_listed_wide_spaces_are_every_non_ascii_space():
    import sys

    assert T.WIDE_SPACES == tuple(i for i in range(128, sys.maxunicode + 1) if chr(i).isspace())


@pytest.mark.parametrize("n,min_words", [(5, 0), (1, 0), (3, 4), (13, 13)])
def test_compiled_shingles_are_the_numpy_values(real_texts, monkeypatch, n, min_words):
    """filters/_native.c's one pass gives the numpy path's hashes and documents exactly
    (stored signatures and every dedup decision depend on them)."""
    from filters.kernels import native

    assert native() is not None, "filters/_native.c is not built: run make setup"
    texts = real_texts + ["a", "a b", "\x00x y", "  ", "one two three four five six", "x" * 5, "é" * 3]
    h1, d1 = T.shingles(texts, n, min_words=min_words)
    monkeypatch.setenv("CURATE_NATIVE", "0")
    h0, d0 = T.shingles(texts, n, min_words=min_words)
    assert len(h0) > len(texts) // 2 and np.array_equal(h0, h1) and np.array_equal(d0, d1)


def test_minhash_estimates_jaccard(real_texts):
    rng = random.Random(1)
    a_, b_ = T.permutations(256, 0)
    errs = []
    for x in real_texts[:150]:
        words = x.split()
        for _ in range(rng.randint(1, max(1, len(words) // 8))):
            words[rng.randrange(len(words))] = "qq%d" % rng.randint(0, 999)
        y = " ".join(words)
        h, d = T.shingles([x, y], 5)
        sig, which = T.minhash(h, d, 2, a_, b_)
        if len(which) < 2:
            continue
        est = float((sig[0] == sig[1]).mean())
        errs.append(est - T.jaccard(T.shingle_set(x, 5), T.shingle_set(y, 5)))
    errs = np.array(errs)
    # 256 permutations: the standard error of an estimate is at most 1/32
    assert abs(errs.mean()) < 0.01 and np.abs(errs).max() < 0.15, (errs.mean(), np.abs(errs).max())


def test_identical_signatures_share_every_bucket_and_short_texts_get_one_shingle():
    a, b = T.permutations(112, 3)
    h, d = T.shingles(["One, two!", "", "one two", "three four five six seven eight"], 5)
    assert sorted(set(d.tolist())) == [0, 2, 3] and (d == 0).sum() == 1 and (d == 3).sum() == 2
    sig, which = T.minhash(h, d, 4, a, b)
    bk = T.band_buckets(sig, 14, 8)
    assert which.tolist() == [0, 2, 3] and (bk[0] == bk[1]).all() and not (bk[0] == bk[2]).any()


def test_segments_cover_the_text_with_their_separators():
    t = "First para.\n\nSecond para\nstill second.\n \n\nThird."
    spans = T.segments(t, "paragraph")
    assert "".join(t[s:e] for s, e in spans) == t
    assert [t[s:e].strip() for s, e in spans] == ["First para.", "Second para\nstill second.", "Third."]
    assert [t[s:e].strip() for s, e in T.segments(t, "line")] == ["First para.", "", "Second para", "still second.", "", "", "Third."]


def test_shingle_sets_in_batches_are_each_texts_own_set(real_texts):
    texts = real_texts[:300] + ["", "a", "a b c", "...", "x " * 5000]
    for chunk in (1 << 20, 2000, 1):  # one batch, several, one text a batch
        got = T.shingle_sets(texts, 5, chunk_bytes=chunk)
        assert len(got) == len(texts)
        assert all(np.array_equal(g, T.shingle_set(t, 5)) for g, t in zip(got, texts))
