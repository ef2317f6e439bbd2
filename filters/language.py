"""Language ID with fastText's lid.176, offline, as datatrove's `LanguageFilter` decides.

The model loads once per worker process. A document is kept when one of `languages`
scores above `min_score` (all 176 labels are scored, newlines read as spaces, as
datatrove does); with `languages: null`, when the best language does. Every document the
filter sees gets the score columns `lang` and `lang_score` (the best label), kept or not.
Reasons: `wrong_language:<best>` or, when the best language is wanted but scores too
low, `low_language_score`. The texts go to fastText's C++ batch call in one list
(bench/lid.py: within a few percent of fastText's own tightest loop); `max_chars` reads
only a prefix of each document (off by default; its agreement is in bench/RESULTS.md).

One difference from datatrove: lid.176 shares Norwegian's probability between its two
written standards, `no` (Bokmål) and `nn` (Nynorsk), and often Danish; a Bokmål page
scores ~0.8 for `no` where an English one scores ~0.95 for `en`. The standards of one
language (SIBLINGS) score together: `lang` is the more likely of them and `lang_score`
their sum, so a threshold means the same for Norwegian as for other languages (FineWeb-2's
0.813 for Bokmål kept 5 of 8 Bokmål paragraphs by their `no` score alone; tests/filters
/test_routing.py). No other label's scores change.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
from pydantic import Field

from filters import models
from filters.base import Filter, FilterParams, FilterResult, register_filter


class LanguageParams(FilterParams):
    type: Literal["language"] = "language"
    languages: list[str] | None = Field(None, description="ISO 639 codes to keep, e.g. [en]; null keeps any language")
    min_score: float = Field(0.65, ge=0, le=1, description="a wanted language must score above this")
    model: str | None = Field(None, description="a fastText LID model file; default lid.176.ftz from `curate fetch-models`",
                              json_schema_extra={"is_path": True})
    label_only: bool = Field(False, description="only add lang / lang_score, never drop")
    max_chars: int | None = Field(None, ge=1, description="identify the language from the first this many characters "
                                  "only (faster on long documents; null: the whole text, as datatrove)")


# lid.176 labels that are written standards of one language: each scores with the others
SIBLINGS = {"no": ("nn",), "nn": ("no",)}
TOP_K = 4  # labels the top-label path asks for: enough to sum a label's siblings


def grouped(labels: list[str], probs) -> dict[str, float]:
    """label -> its probability, the standards of one language (SIBLINGS) summed."""
    scores = {lab: float(s) for lab, s in zip(labels, probs)}
    return {lab: s + sum(scores.get(x, 0.0) for x in SIBLINGS.get(lab, ())) for lab, s in scores.items()}


@functools.lru_cache(maxsize=4)
def load_model(path: str):
    from fasttext.FastText import _FastText  # the class behind fasttext.load_model, without its warning

    return _FastText(model_path=path)


def model_path(params: LanguageParams) -> Path:
    p = Path(params.model) if params.model else models.lid176_path()
    if not p.is_file():
        raise FileNotFoundError(models.missing_model_message("language filter", p))
    return p


@register_filter("language", version="2", libraries=("fasttext",))  # 2: Norwegian's standards score together
class LanguageFilter(Filter):
    """fastText lid.176 language ID: keep wanted languages above a score; adds lang and lang_score."""

    Params = LanguageParams
    requires = (("fasttext", "fasttext-numpy2-wheel"),)

    @staticmethod
    def default_files(params: LanguageParams) -> dict[str, str]:
        return {} if params.model else {"model": str(models.lid176_path())}

    def __init__(self, params: LanguageParams):
        super().__init__(params)
        self.model = load_model(str(model_path(params)))
        self.wanted = set(params.languages) if params.languages else None

    def apply(self, batch: pa.RecordBatch) -> FilterResult:
        p: LanguageParams = self.params
        col = batch.column("text")
        if p.max_chars is not None:
            col = pa.compute.utf8_slice_codeunits(col, 0, p.max_chars)
        # fastText reads one line: newlines become spaces, and the line ends with the "\n"
        # its own `predict` appends (it marks the end of the text for the model)
        texts = [t.replace("\n", " ") + "\n" for t in col.to_pylist()]
        # Probabilities over the labels sum to 1, so with min_score >= 0.5 only the top label
        # can pass: asking fastText for it alone gives the same decisions and scores without
        # building all 176. Below 0.5, every label is needed.
        if p.min_score >= 0.5 or p.label_only:
            return self._top_label(texts)
        labels, probs = self.model.f.multilinePredict(texts, -1, 0.0, "strict")
        n = len(texts)
        keep = np.ones(n, dtype=bool)
        reasons: list[str | None] = [None] * n
        best_lang, best_score = [], []
        for i, (labs, ps) in enumerate(zip(labels, probs)):
            scores = grouped([lab[9:] for lab in labs], ps)  # "__label__en" -> "en"; siblings summed
            best = max(scores.items(), key=lambda kv: kv[1]) if scores else ("und", 0.0)
            best_lang.append(best[0])
            best_score.append(best[1])
            if self.wanted is None:
                ok = best[1] > p.min_score
            else:
                ok = any(scores.get(lang, 0.0) > p.min_score for lang in self.wanted)
            if not ok:
                keep[i] = False
                wanted_best = self.wanted is None or best[0] in self.wanted
                reasons[i] = "low_language_score" if wanted_best else f"wrong_language:{best[0]}"
        return FilterResult(keep, reasons, {"lang": pa.array(best_lang, pa.string()),
                                            "lang_score": pa.array(best_score, pa.float64())})

    def _top_label(self, texts: list[str]) -> FilterResult:
        """min_score >= 0.5: the top label decides; the decisions as array operations."""
        p: LanguageParams = self.params
        labels, probs = self.model.f.multilinePredict(texts, TOP_K, 0.0, "strict")
        lang, score = [], np.zeros(len(texts), np.float64)
        for i, (labs, ps) in enumerate(zip(labels, probs)):
            labs = [lab[9:] for lab in labs]  # "__label__en" -> "en"
            if not labs:
                lang.append("und")
            elif labs[0] in SIBLINGS or (len(labs) > 1 and labs[1] in SIBLINGS):  # a standard of Norwegian: summed
                best = max(grouped(labs, ps).items(), key=lambda kv: kv[1])
                lang.append(best[0])
                score[i] = best[1]
            else:
                lang.append(labs[0])
                score[i] = float(ps[0])
        n = len(texts)
        scores = {"lang": pa.array(lang, pa.string()), "lang_score": pa.array(score, pa.float64())}
        if p.label_only:
            return FilterResult(np.ones(n, dtype=bool), [None] * n, scores)
        wanted = np.ones(n, dtype=bool) if self.wanted is None else np.fromiter(
            (x in self.wanted for x in lang), dtype=np.bool_, count=n)
        keep = wanted & (score > p.min_score)
        reasons = [None if k else ("low_language_score" if w else f"wrong_language:{x}")
                   for k, w, x in zip(keep.tolist(), wanted.tolist(), lang)]
        return FilterResult(keep, reasons, scores)
