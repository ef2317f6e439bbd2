"""Words of the languages whitespace does not delimit (Chinese, Thai, Vietnamese, Japanese,
Korean), cut by the segmenter datatrove uses for each in FineWeb-2 (its
tokenizer_assignment.csv), so that Gopher's and FineWeb's word rules read the same words
(tests/filters/test_segmenters.py checks them word for word). filters/words.py's
`splitter(language)` hands these languages to `SegmentedSplitter`; the other languages'
rule-based splitting stays there. Each segmenter ships its dictionary or model in its
wheel: nothing is downloaded, and a missing package is an error naming it."""

from __future__ import annotations

CACHE_MAX = 500_000  # chunks whose words a splitter keeps (as filters/words.py's WordSplitter does)

# languages whose words whitespace does not delimit: the segmenter datatrove splits their words with (its
# tokenizer_assignment.csv: spaCy's Chinese tokenizer with jieba; its ThaiTokenizer, PyThaiNLP's newmm-safe;
# spaCy's Vietnamese tokenizer with pyvi, whose words span syllables: "Hà Nội"; spaCy's Japanese
# tokenizer (datatrove's copy), SudachiPy's split mode A; KiwiTokenizer, kiwipiepy's `sbg` model
SEGMENTERS = {"zh": "jieba", "th": "pythainlp", "vi": "pyvi", "ja": "sudachipy", "ko": "kiwipiepy"}
WHOLE_TEXT = frozenset({"th", "vi", "ja", "ko"})  # segmenters that read across spaces: a text is cut whole
PACKAGES = {"sudachipy": "sudachipy sudachidict_core", "kiwipiepy": "'kiwipiepy<0.22' 'kiwipiepy_model<0.22'"}


class SegmentedSplitter:
    """The words of a language whitespace does not delimit (SEGMENTERS): each
    whitespace-free chunk cut by the segmenter datatrove uses for the language, a cut
    made once per process and chunk (the same cache WordSplitter keeps). For Chinese,
    whitespace only separates jieba's blocks, so chunk by chunk gives the words of the whole
    text. The others read across spaces (PyThaiNLP's newmm: a word's cut depends on the
    words before it; pyvi's words span syllables; Sudachi's and Kiwi's lattices run over the
    whole text), so those texts are cut whole (`whole_text`), as datatrove cuts them
    (tests/filters/test_segmenters.py checks each word for word against datatrove's)."""

    def __init__(self, language: str):
        from spacy.pipeline import Sentencizer

        self.language = language
        self.sentence_punct = frozenset(Sentencizer.default_punct_chars)
        self.special: dict = {}
        self.cache: dict[str, tuple[str, ...]] = {}
        self._cut = _segmenter(language)
        self.whole_text = language in WHOLE_TEXT

    def split(self, text: str) -> list[str]:
        if self.whole_text:
            return [w.strip() for w in self._cut(text) if w.strip()]
        out: list[str] = []
        for chunk in text.split():
            out.extend(self.chunk_words(chunk))
        return out

    def chunk_words(self, chunk: str) -> tuple[str, ...]:
        toks = self.cache.get(chunk)
        if toks is None:
            if len(self.cache) > CACHE_MAX:
                self.cache.clear()
            toks = self.cache[chunk] = tuple(w.strip() for w in self._cut(chunk) if w.strip())
        return toks


def _segmenter(language: str):
    """text -> its words, by the language's segmenter; an error naming the package when it
    is not installed (never a download: each ships its dictionary or model in its wheel)."""
    import importlib.util

    name = SEGMENTERS[language]
    try:
        if name == "jieba":
            import logging

            import jieba

            jieba.setLogLevel(logging.WARNING)  # its dictionary-loading chatter
            tk = jieba.Tokenizer()
            return lambda chunk: tk.cut(chunk, cut_all=False)
        if name == "pyvi":
            import spacy

            if importlib.util.find_spec("pyvi") is None:  # spaCy's Vietnamese tokenizer imports it at its first text
                raise ImportError("pyvi")

            tok = spacy.blank("vi").tokenizer
            return lambda text: [t.text for t in tok(text)]
        if name == "sudachipy":
            return _sudachi()
        if name == "kiwipiepy":
            return _kiwi()
        from pythainlp.tokenize import word_tokenize

        return lambda chunk: word_tokenize(chunk, keep_whitespace=False, engine="newmm-safe")
    except ImportError:
        raise ImportError(f"splitting {language} words needs the {name} package: "
                          f"pip install {PACKAGES.get(name, name)}") from None


def _sudachi():
    """Japanese, as spaCy's Japanese tokenizer in datatrove cuts it: SudachiPy's split mode A
    (its default there) on pieces of at most 40,000 UTF-8 bytes (datatrove's
    chunk_text_on_bytes: Sudachi refuses longer input), each token's surface; the spaces
    spaCy keeps as gap tokens are stripped away, as datatrove strips them."""
    import importlib.util

    from sudachipy import dictionary, tokenizer

    if importlib.util.find_spec("sudachidict_core") is None:  # the dictionary, a package of its own
        raise ImportError("sudachidict_core")
    from datatrove.utils.word_tokenizers import chunk_text_on_bytes

    tk = dictionary.Dictionary().tokenizer(mode=tokenizer.Tokenizer.SplitMode.A)  # create() is deprecated, the same tokenizer
    return lambda text: [m.surface() for piece in chunk_text_on_bytes(text, 40000) for m in tk.tokenize(piece)]


def _kiwi():
    """Korean, as datatrove's KiwiTokenizer cuts it: kiwipiepy's `sbg` model (shipped by
    kiwipiepy_model before 0.22, which datatrove pins) over the text with runs of 20+
    digits and commas removed, each token sliced from the text as given: datatrove slices
    the original with the cleaned text's offsets, and FineWeb-2's words are those slices."""
    import re
    import warnings

    from kiwipiepy import Kiwi

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        kiwi = Kiwi(model_type="sbg")
    digits = re.compile("[0-9,]{20,}")
    return lambda text: [text[t.start:t.end] for t in kiwi.tokenize(digits.sub("", text))]
