"""`per_language: fineweb2`: FineWeb-2's per-language thresholds, shipped as data.

FineWeb-2 (huggingface/fineweb-2, Apache-2.0) filters each language with thresholds fitted
for it, one `configs/<lang>_<script>.yml` per language: Gopher repetition (`dup_line_frac`,
`top_n_grams`, `dup_n_grams`), FineWeb quality (`line_punct_thr`, `new_line_ratio`), Gopher
quality (`min_avg_word_length`, `max_avg_word_length`, `max_non_alpha_words_ratio`,
`stopwords`) and the language ID score (`language_score`), applied by datatrove's filters
as its `fineweb-2-pipeline.py` calls them (with the other rules it switches off). The
table here (filters/data/fineweb2.json, written by `python -m bench.fineweb2_table REPO`) keeps
those fields for the languages lid.176 names, keyed by lid.176's code (`fr`), or code and
script for a language FineWeb-2 writes in two (`sr` Cyrillic, `sr_Latn`), with the word
splitting language datatrove assigns (its tokenizer_assignment.csv). Only languages whose
words Curate splits as datatrove does offline are kept: spaCy's rule-based tokenizer, and
Chinese (jieba), Thai (PyThaiNLP), Vietnamese (pyvi), Japanese (SudachiPy) and Korean
(Kiwi) by the same segmenters (filters/segmenters.py SEGMENTERS).

`params(type, entry)` turns a language's entry into one filter type's parameters, as
FineWeb-2's pipeline passes them to datatrove's filters.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

DATA = Path(__file__).parent / "data" / "fineweb2.json"
SOURCE = "huggingface/fineweb-2 configs/*.yml (Apache-2.0), commit d0defb24f193bb9a5a11b8b14524a03c4858e1b6"


@functools.lru_cache(maxsize=1)
def table() -> dict[str, dict]:
    return json.loads(DATA.read_text())["languages"]


def params(type_name: str, e: dict) -> dict:
    """One language's entry as parameters of a filter type (FineWeb-2's pipeline's calls)."""
    if type_name == "gopher_quality":
        return {"min_avg_word_length": e["min_avg_word_length"], "max_avg_word_length": e["max_avg_word_length"],
                "min_alpha_words_ratio": e["max_non_alpha_words_ratio"], "stop_words": e["stopwords"],
                "min_stop_words": 2, "language": e["words"]}
    if type_name == "gopher_repetition":
        return {"max_dup_para_frac": None, "max_dup_para_char_frac": None, "max_dup_line_char_frac": None,
                "max_dup_line_frac": e["dup_line_frac"], "max_top_ngram_char_frac": dict(e["top_n_grams"]),
                "max_dup_ngram_char_frac": dict(e["dup_n_grams"]), "language": e["words"]}
    if type_name == "fineweb_quality":
        return {"min_line_punct_ratio": e["line_punct_thr"], "max_newline_word_ratio": e["new_line_ratio"],
                "max_char_dup_ratio": 0.1, "max_short_line_ratio": None, "language": e["words"]}
    if type_name == "language":
        return {"min_score": e["language_score"]}
    raise KeyError(type_name)


TYPES = ("gopher_quality", "gopher_repetition", "fineweb_quality", "language")


def datatrove_filter(type_name: str, lang: str):
    """datatrove's own filter with FineWeb-2's parameters for `lang` (a key of `table()`), as
    fineweb-2-pipeline.py builds it, its word tokenizer included: the oracle the routed
    filters are checked against (tests/filters/test_segmenters.py, bench/languages.py)."""
    from datatrove.pipeline import filters as dt

    e = table()[lang]
    code = e["fineweb2"]
    if type_name == "gopher_repetition":
        return dt.GopherRepetitionFilter(language=code, dup_para_frac=0, dup_line_char_frac=0, dup_para_char_frac=0,
                                         dup_line_frac=e["dup_line_frac"], top_n_grams=[tuple(x) for x in e["top_n_grams"]],
                                         dup_n_grams=[tuple(x) for x in e["dup_n_grams"]])
    if type_name == "fineweb_quality":
        return dt.FineWebQualityFilter(language=code, short_line_thr=999, char_duplicates_ratio=0.1,
                                       line_punct_thr=e["line_punct_thr"], new_line_ratio=e["new_line_ratio"])
    if type_name == "gopher_quality":
        return dt.GopherQualityFilter(language=code, max_avg_word_length=e["max_avg_word_length"],
                                      min_avg_word_length=e["min_avg_word_length"], stop_words=e["stopwords"],
                                      max_non_alpha_words_ratio=e["max_non_alpha_words_ratio"], min_stop_words=2)
    raise KeyError(type_name)
