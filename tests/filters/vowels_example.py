"""A filter family of one type: too few vowels among the letters (a crude gibberish test).
The worked example of docs/extending.md (tests/filters/test_extending.py runs it)."""

from __future__ import annotations

from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from filters.base import Filter, FilterParams, FilterResult, register_filter


class VowelParams(FilterParams):
    type: Literal["min_vowels"] = "min_vowels"
    min_ratio: float | None = Field(0.2, ge=0, le=1, description="drop documents whose letters are fewer than this "
                                    "share of vowels (None: off)")


@register_filter("min_vowels")
class VowelFilter(Filter):
    """Too few vowels among the letters: keyboard mashing, base64, hashes."""

    Params = VowelParams

    def apply(self, batch: pa.RecordBatch) -> FilterResult:
        p: VowelParams = self.params
        text = pc.utf8_lower(batch.column("text"))
        letters = pc.count_substring_regex(text, r"[a-z]").to_numpy(zero_copy_only=False)
        vowels = pc.count_substring_regex(text, r"[aeiou]").to_numpy(zero_copy_only=False)
        ratio = np.where(letters > 0, vowels / np.maximum(letters, 1), 1.0)  # no letters: not judged here
        keep = np.ones(batch.num_rows, dtype=bool) if p.min_ratio is None else ratio >= p.min_ratio
        reasons = [None if k else "too_few_vowels" for k in keep]
        return FilterResult(keep, reasons, {"vowel_ratio": pa.array(ratio, pa.float64())})
