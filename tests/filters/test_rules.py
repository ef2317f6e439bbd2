"""Every rule of every filter: a document that trips exactly that rule (asserting the reason)
and one just inside the threshold that passes. Other rules are switched off with None."""

from __future__ import annotations

import pyarrow as pa
import pytest

from filters import base

WORDS = ["cat", "sat", "mat", "dog", "ran", "far", "sun", "hat", "red", "big"]

GOPHER_Q_OFF = dict(min_words=None, max_words=None, min_avg_word_length=None, max_avg_word_length=None,
                    max_symbol_word_ratio=None, max_bullet_lines_ratio=None, max_ellipsis_lines_ratio=None,
                    min_alpha_words_ratio=None, min_stop_words=None)
GOPHER_R_OFF = dict(max_dup_para_frac=None, max_dup_para_char_frac=None, max_dup_line_frac=None,
                    max_dup_line_char_frac=None, max_top_ngram_char_frac={}, max_dup_ngram_char_frac={})
FINEWEB_OFF = dict(min_line_punct_ratio=None, max_short_line_ratio=None, max_char_dup_ratio=None, max_newline_word_ratio=None)


def words(n: int, start: int = 0) -> str:
    return " ".join(WORDS[(start + i) % len(WORDS)] for i in range(n))


def reason(ftype: str, text: str, **params) -> str | None:
    f = base.build(base.parse_params({"type": ftype, **params}))
    res = f.apply(pa.RecordBatch.from_pydict({"id": ["d"], "text": [text]}))
    assert bool(res.keep[0]) == (res.reasons[0] is None)
    return res.reasons[0]


def gq(text, **p):
    return reason("gopher_quality", text, **{**GOPHER_Q_OFF, **p})


# ---------------------------------------------------------------- gopher_quality


def test_gopher_word_counts():
    assert gq(words(49), min_words=50) == "too_few_words"
    assert gq(words(50), min_words=50) is None
    assert gq(words(49) + " , . !", min_words=50) == "too_few_words"  # punctuation is not a word here
    assert gq(words(61), max_words=60) == "too_many_words"
    assert gq(words(60), max_words=60) is None


def test_gopher_average_word_length():
    assert gq(" ".join(["ab"] * 10), min_avg_word_length=3) == "avg_word_length_below_min"
    assert gq(" ".join(["ab", "abcd"] * 5), min_avg_word_length=3) is None  # exactly 3
    assert gq(" ".join(["abcdefghijk"] * 10), max_avg_word_length=10) == "avg_word_length_above_max"
    assert gq(" ".join(["abcdefghij"] * 10), max_avg_word_length=10) is None


def test_gopher_hashes_and_ellipses_per_word():
    # 50 words + 6 '#' tokens: 6/56 > 0.1; 5/55 is not
    assert gq(words(50) + " #" * 6, max_symbol_word_ratio=0.1) == "too_many_hashes"
    assert gq(words(50) + " #" * 5, max_symbol_word_ratio=0.1) is None
    assert gq(words(50) + " ..." * 6, max_symbol_word_ratio=0.1) == "too_many_ellipses"
    assert gq(words(50) + " \u2026" * 5, max_symbol_word_ratio=0.1) is None


def test_gopher_bullet_and_ellipsis_lines():
    lines = [words(6, i) for i in range(10)]
    assert gq("\n".join("- " + ln for ln in lines), max_bullet_lines_ratio=0.9) == "too_many_bullet_lines"
    assert gq("\n".join(("\u2022 " if i else "") + ln for i, ln in enumerate(lines)), max_bullet_lines_ratio=0.9) is None
    assert gq("\n".join(ln + ("..." if i < 4 else ".") for i, ln in enumerate(lines)), max_ellipsis_lines_ratio=0.3) == "too_many_ellipsis_lines"
    assert gq("\n".join(ln + ("..." if i < 3 else ".") for i, ln in enumerate(lines)), max_ellipsis_lines_ratio=0.3) is None


def test_gopher_alphabetic_words():
    assert gq(words(50) + " 123" * 13, min_alpha_words_ratio=0.8) == "too_few_alpha_words"  # 50/63
    assert gq(words(50) + " 123" * 12, min_alpha_words_ratio=0.8) is None  # 50/62


def test_gopher_stop_words():
    assert gq(words(20) + " the the the", min_stop_words=2) == "too_few_stop_words"
    assert gq(words(20) + " the and", min_stop_words=2) is None
    assert gq(words(20) + " The And", min_stop_words=2) == "too_few_stop_words"  # case-sensitive, as datatrove


def test_gopher_defaults_keep_real_prose(wiki_texts):
    prose = next(t for t in wiki_texts if len(t.split()) > 80)
    assert reason("gopher_quality", prose) is None


# ---------------------------------------------------------------- gopher_repetition


def gr(text, **p):
    return reason("gopher_repetition", text, **{**GOPHER_R_OFF, **p})


def test_repetition_paragraphs():
    paras = [words(8, i) for i in range(10)]
    four_dups = paras[:6] + [paras[0]] * 4  # 4 of 10 repeat
    three_dups = paras[:7] + [paras[0]] * 3
    assert gr("\n\n".join(four_dups), max_dup_para_frac=0.3) == "dup_para_frac"
    assert gr("\n\n".join(three_dups), max_dup_para_frac=0.3) is None
    text = "\n\n".join(paras[:4] + [paras[0]])  # one repeated paragraph of five: its chars / all chars
    frac = len(paras[0]) / len(text)
    assert gr(text, max_dup_para_char_frac=frac - 0.001) == "dup_para_char_frac"
    assert gr(text, max_dup_para_char_frac=frac) is None


def test_repetition_lines():
    lines = [words(8, i) for i in range(10)]
    assert gr("\n".join(lines[:6] + [lines[0]] * 4), max_dup_line_frac=0.3) == "dup_line_frac"
    assert gr("\n".join(lines[:7] + [lines[0]] * 3), max_dup_line_frac=0.3) is None
    text = "\n".join(lines[:4] + [lines[1]])
    frac = len(lines[1]) / len(text)
    assert gr(text, max_dup_line_char_frac=frac - 0.001) == "dup_line_char_frac"
    assert gr(text, max_dup_line_char_frac=frac) is None


def test_repetition_top_ngrams():
    text = " ".join(f"w{i}" for i in range(30)) + " buy now" * 6
    frac = len("buy now") * 6 / len(text)
    assert gr(text, max_top_ngram_char_frac={2: frac - 0.001}) == "top_2_gram"
    assert gr(text, max_top_ngram_char_frac={2: frac}) is None


def test_repetition_duplicated_ngrams():
    phrase = "alpha beta gamma delta epsilon"
    text = " ".join(f"w{i}" for i in range(40)) + " " + phrase + " " + phrase
    frac = len(phrase.replace(" ", "")) / len(text)  # the repeat's n-gram, joined without spaces
    assert gr(text, max_dup_ngram_char_frac={5: frac - 0.001}) == "duplicated_5_n_grams"
    assert gr(text, max_dup_ngram_char_frac={5: frac}) is None
    assert gr("") == "empty"


# ---------------------------------------------------------------- fineweb_quality


def fw(text, **p):
    return reason("fineweb_quality", text, **{**FINEWEB_OFF, **p})


def test_fineweb_line_punctuation():
    long = [words(8, i) for i in range(9)]
    assert fw("\n".join(long[:8] + [long[8] + "."]), min_line_punct_ratio=0.12) == "line_punct_ratio"  # 1/9
    assert fw("\n".join(long[:7] + [long[7] + "."]), min_line_punct_ratio=0.12) is None  # 1/8
    assert fw("\n".join(long), min_line_punct_ratio=0.12, line_punct_exclude_zero=True) is None


def test_fineweb_short_lines():
    assert fw("short one\nshort two\nshort three", max_short_line_ratio=0.67) == "short_line_ratio"
    assert fw("short one\nshort two\n" + "x" * 31, max_short_line_ratio=0.67) is None  # 2/3 is not above 0.67


def test_fineweb_duplicate_line_chars():
    lines = [words(8, i) for i in range(10)]
    text = "\n".join(lines + [lines[0]])
    frac = len(lines[0]) / (len(text) - text.count("\n"))
    assert fw(text, max_char_dup_ratio=frac - 0.001) == "char_dup_ratio"
    assert fw(text, max_char_dup_ratio=frac) is None


def test_fineweb_list_like_pages():
    items = "\n".join(f"item {i}" for i in range(10))  # 9 newlines, 20 words
    assert fw(items, max_newline_word_ratio=0.3) == "list_ratio"  # 9/20 = 0.45
    assert fw(items, max_newline_word_ratio=0.45) is None
    assert fw("\n \n") == "empty"


# ---------------------------------------------------------------- c4_quality


def c4(text, **p):
    return reason("c4_quality", text, **p)


S = "The cat sat on the mat."


def test_c4_sentences_and_line_rules():
    assert c4(" ".join([S] * 4)) == "too_few_sentences"
    assert c4(" ".join([S] * 5)) is None
    five_lines = [S] * 5
    assert c4("\n".join(five_lines[:4] + ["The javascript cat sat."])) == "too_few_sentences"  # javascript line dropped
    assert c4("\n".join(five_lines[:4] + ["We use cookies here."])) == "too_few_sentences"  # policy line dropped
    assert c4("\n".join(five_lines[:4] + ["The cat sat on the mat"])) == "too_few_sentences"  # no terminal punctuation
    assert c4("\n".join(five_lines[:4] + ["Cat sat."])) == "too_few_sentences"  # fewer than 3 words
    assert c4("\n".join(five_lines[:4] + ["The cat " + "a" * 1001 + "."])) == "too_few_sentences"  # a word over 1000 chars
    assert c4("\n".join(five_lines[:4] + ["The cat sat on the mat.[1]"])) is None  # citation removed first
    assert c4("\n".join(five_lines[:4] + ["The cat sat on the mat"]), filter_no_terminal_punct=False) is None
    assert c4(" ".join([S] * 4), min_sentences=None) is None


def test_c4_document_rules():
    assert c4("\n".join([S] * 5 + ["Lorem ipsum dolor sit amet."])) == "lorem_ipsum"
    assert c4("\n".join([S] * 5 + ["The set {a, b} is small."])) == "curly_bracket"
    assert c4("\n".join([S] * 5 + ["The set {a, b} is small."]), filter_curly_bracket=False) is None
    assert c4("\n".join([S] * 5 + ["lorem ipsum without an end"])) is None  # that line is dropped before the check


# ---------------------------------------------------------------- c4_paragraph, regex, url, adapters


def test_c4_paragraph():
    para = "p" * 200
    assert reason("c4_paragraph", "\n".join([para, para])) == "too_few_paragraphs"
    assert reason("c4_paragraph", "\n".join([para, para, "p" * 199, "short"])) == "too_few_paragraphs"
    assert reason("c4_paragraph", "\n".join([para, para, para])) is None


def test_regex():
    assert reason("regex", "Buy CHEAP pills", pattern=r"cheap\s+pills", ignore_case=True, reason="spam") == "spam"
    assert reason("regex", "Buy CHEAP pills", pattern=r"cheap\s+pills") is None


def test_url_blocklist(tmp_path):
    bl = tmp_path / "block.txt"
    bl.write_text("# spam domains\nbad.example\nsubstring:/casino/\n")
    f = base.build(base.parse_params({"type": "url", "blocklist": str(bl)}))
    metas = ['{"url": "https://www.bad.example/x"}', '{"url": "https://ok.example/casino/1"}',
             '{"url": "https://example/bad.example"}', '{"url": "https://notbad.example/"}', None]
    res = f.apply(pa.RecordBatch.from_pydict({"id": list("abcde"), "text": ["t"] * 5, "metadata": metas}))
    assert res.reasons == ["blocked_domain", "blocked_substring", None, None, None]


def test_datatrove_adapter_keeps_its_reasons():
    text = "hello #### world"
    assert reason("datatrove", text, **{"class": "RegexFilter", "args": {"regex_exp": "#{3,}"}}) == "removed"
    assert reason("datatrove", "x", **{"class": "datatrove.pipeline.filters.GopherQualityFilter"}) == "gopher_short_doc"


def test_python_adapter_document_and_batch_modes():
    assert reason("python", "has 42 digits", callable="tests.filters.user_rules:no_digits") == "has_digits"
    assert reason("python", "no digits here", callable="tests.filters.user_rules:no_digits") is None
    assert reason("python", "tiny", callable="tests.filters.user_rules:min_len", mode="batch", args={"n": 5}) == "shorter_than_5"
    with pytest.raises(ValueError, match="cannot import 'tests.filters.user_rules:nope'"):
        reason("python", "x", callable="tests.filters.user_rules:nope")
