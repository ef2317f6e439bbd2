"""Language ID with fastText's lid.176, offline, as datatrove's `LanguageFilter` decides.

The model loads once per worker process. A document is kept when one of `languages`
scores above `min_score` (all 176 labels are scored, newlines read as spaces, as
datatrove does); with `languages: null`, when the best language does. Every document the
filter sees gets the score columns `lang` and `lang_score` (the best label), kept or not.
Reasons: `wrong_language:<best>` or, when the best language is wanted but scores too
low, `low_language_score`.
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


@functools.lru_cache(maxsize=4)
def load_model(path: str):
    from fasttext.FastText import _FastText  # the class behind fasttext.load_model, without its warning

    return _FastText(model_path=path)


def model_path(params: LanguageParams) -> Path:
    p = Path(params.model) if params.model else models.lid176_path()
    if not p.is_file():
        raise FileNotFoundError(models.missing_model_message("language filter", p))
    return p


@register_filter("language")
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
        texts = [t.replace("\n", " ") for t in batch.column("text").to_pylist()]
        # Probabilities over the labels sum to 1, so with min_score >= 0.5 only the top label
        # can pass: asking fastText for it alone gives the same decisions and scores without
        # building all 176 (about 10% of the filter's time). Below 0.5, every label is needed.
        top_only = p.min_score >= 0.5 or p.label_only
        labels, probs = self.model.predict(texts, k=1 if top_only else -1)
        n = len(texts)
        keep = np.ones(n, dtype=bool)
        reasons: list[str | None] = [None] * n
        best_lang, best_score = [], []
        for i, (labs, ps) in enumerate(zip(labels, probs)):
            scores = {lab[9:]: float(s) for lab, s in zip(labs, ps)}  # "__label__en" -> "en"
            best = max(scores.items(), key=lambda kv: kv[1]) if scores else ("und", 0.0)
            best_lang.append(best[0])
            best_score.append(best[1])
            if p.label_only:
                continue
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
