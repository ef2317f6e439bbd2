"""The `extract` stage of web sources: removes the records that extraction gave no text.

Ingest (pipeline/steps/ingest/web.py) writes every WARC response, HTML file or HTML field as a
document, so `in` counts it; a record that is not an HTML page, answered with an HTTP
error, or whose page has no text gets empty text and `extraction: <reason>` in its
metadata. The filter stage (pipeline/steps/filter.py) puts this filter first in such a source's filter step, under the stage
name `extract`, so the removals carry their reason (not_html, http_status, no_text) into
the ledger, the funnel, the samples and `curate explain`.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import orjson
import pyarrow as pa

from filters.base import Filter, FilterParams, FilterResult, register_filter


EXTRACT_STAGE = "extract"  # the stage name of this filter, first in a web source's filter step
EXTRACT_FILTER = {"type": "extracted"}  # its parameters


class ExtractedParams(FilterParams):
    type: Literal["extracted"] = "extracted"


@register_filter("extracted")
class ExtractedFilter(Filter):
    """Drop web records extraction gave no text (added by Curate as the `extract` stage of warc/html sources)."""

    Params = ExtractedParams

    def apply(self, batch: pa.RecordBatch) -> FilterResult:
        reasons = []
        for m in batch.column("metadata").to_pylist():
            reasons.append(orjson.loads(m).get("extraction") if m and '"extraction"' in m else None)
        return FilterResult(np.array([r is None for r in reasons], dtype=bool), reasons)
