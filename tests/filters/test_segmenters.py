"""Words of languages whitespace does not delimit (Chinese, Thai, Vietnamese, Japanese,
Korean): Curate's splitter against datatrove's own word tokenizers (spaCy's Chinese
tokenizer with jieba; PyThaiNLP's newmm-safe; spaCy's Vietnamese tokenizer with pyvi;
spaCy's Japanese tokenizer with SudachiPy; kiwipiepy's Kiwi), word for word, on prose written for these tests (data/segmented_prose.json),
and the kernels' word ids built from the same splits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from filters import kernels, segmenters, words

PROSE = json.loads((Path(__file__).parent / "data" / "segmented_prose.json").read_text())


LANGUAGES = [("zh", "cmn_Hani"), ("th", "tha_Thai"), ("vi", "vie_Latn"), ("ja", "jpn_Jpan"), ("ko", "kor_Hang")]


@pytest.mark.parametrize("language,code", LANGUAGES)
def test_words_are_datatroves_word_for_word(language, code):
    from datatrove.utils.word_tokenizers import load_word_tokenizer

    theirs = load_word_tokenizer(code)  # the tokenizer FineWeb-2's config of the language names
    texts = PROSE[language] + ["\n\n".join(PROSE[language][:3])]  # one text of several paragraphs too
    for text in texts:
        assert words.splitter(language).split(text) == theirs.word_tokenize(text), text[:40]
    # the kernels (Gopher's rules) see the same words: the batch's ids spell them back
    w = kernels.batch_words(texts, language)
    vocab = w.vocab.words
    for i, text in enumerate(texts):
        got = [vocab[j] for j in w.ids[w.off[i]:w.off[i + 1]].tolist()]
        assert got == theirs.word_tokenize(text)
    assert max(len(x) for t in texts for x in words.splitter(language).split(t)) < 20  # words, not whole sentences (a paragraph is 60-150 characters)


def test_japanese_past_sudachis_input_limit_and_koreans_long_numbers_are_cut_as_datatrove_cuts_them():
    """Sudachi refuses input past about 49 KB: a Japanese text of 75 KB is cut into pieces
    of at most 40,000 UTF-8 bytes, at the places datatrove cuts it. Kiwi drops runs of 20+
    digits and commas first, and datatrove slices the words from the text as given with the
    cleaned text's offsets: FineWeb-2's Korean words are those slices, and so are ours."""
    from datatrove.utils.word_tokenizers import load_word_tokenizer

    long_ja = "\n".join(PROSE["ja"] * 50)
    assert len(long_ja.encode()) > 70_000
    assert words.splitter("ja").split(long_ja) == load_word_tokenizer("jpn_Jpan").word_tokenize(long_ja)
    ko = PROSE["ko"][0] + " 전화번호 1234567890,1234567890,123 입니다. " + PROSE["ko"][1]
    got = words.splitter("ko").split(ko)
    assert got == load_word_tokenizer("kor_Hang").word_tokenize(ko)
    assert len(got) > 30


def test_a_missing_segmenter_is_an_error_naming_the_package(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_jieba(name, *a, **k):
        if name == "jieba":
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_jieba)
    with pytest.raises(ImportError, match="pip install jieba"):
        segmenters._segmenter("zh")


@pytest.mark.parametrize("language", [lang for lang, _ in LANGUAGES])
def test_routed_filters_decide_as_datatrove_with_fineweb2s_parameters(language):
    """Documents of 1-6 paragraphs (some repeated, some joined by single newlines), routed by
    their language to FineWeb-2's thresholds (`per_language: fineweb2`): every decision of
    Gopher repetition, FineWeb quality and Gopher quality is datatrove's given the same
    parameters and FineWeb-2's word tokenizer for the language."""
    import random

    import pyarrow as pa
    from datatrove.data import Document

    from filters import base, fineweb2

    rng = random.Random(7)
    paras = PROSE[language]
    texts = []
    for _ in range(60):
        picked = [rng.choice(paras) for _ in range(rng.randint(1, 6))]
        if rng.random() < 0.3:
            picked += picked[: rng.randint(1, len(picked))]  # repeated paragraphs
        texts.append(("\n" if rng.random() < 0.3 else "\n\n").join(picked))
    batch = pa.RecordBatch.from_pydict({"id": [str(i) for i in range(len(texts))], "text": texts})
    langs = pa.array([language] * len(texts), pa.string())
    removed = {}
    for t in ("gopher_repetition", "fineweb_quality", "gopher_quality"):
        got = base.build(base.parse_params({"type": t, "per_language": "fineweb2"})).apply(batch, langs)
        dt = fineweb2.datatrove_filter(t, language)
        theirs = []
        for i, text in enumerate(texts):
            r = dt.filter(Document(text=text, id=str(i)))
            theirs.append(r if isinstance(r, bool) else bool(r[0]))
        assert got.keep.tolist() == theirs, t
        removed[t] = theirs.count(False)
    print(f"\n{language}: removed of {len(texts)} by FineWeb-2's thresholds: {removed}")
    assert removed["gopher_repetition"] > 0  # the repeated paragraphs are caught: the rules did read words
