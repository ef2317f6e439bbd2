"""Pattern filters: `regex` drops documents whose text matches; `url` drops documents whose
URL is on a blocklist the user names (domains, with their subdomains, and substrings)."""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

import numpy as np
import orjson
import pyarrow as pa
from pydantic import Field

from filters.base import Filter, FilterParams, FilterResult, RegexPattern, list_lines, register_filter


class RegexParams(FilterParams):
    type: Literal["regex"] = "regex"
    pattern: RegexPattern = Field(description="a Python regular expression searched in the text")
    ignore_case: bool = Field(False, description="match regardless of case")
    reason: str = Field("regex_match", description="the removal reason for a match")


@register_filter("regex")
class RegexFilter(Filter):
    """Drop documents whose text matches a regular expression."""

    Params = RegexParams

    def __init__(self, params: RegexParams):
        super().__init__(params)
        self.rx = re.compile(params.pattern, re.IGNORECASE if params.ignore_case else 0)

    def apply(self, batch: pa.RecordBatch) -> FilterResult:
        hit = np.array([self.rx.search(t) is not None for t in batch.column("text").to_pylist()], dtype=bool)
        return FilterResult(~hit, [self.params.reason if h else None for h in hit])


class UrlParams(FilterParams):
    type: Literal["url"] = "url"
    blocklist: str = Field(
        description="a file: one entry a line; a domain (example.com, which blocks its subdomains too), "
        "or `substring:TEXT` to block URLs containing TEXT; # starts a comment",
        json_schema_extra={"is_path": True})
    url_field: str = Field("url", description="the metadata field holding the document's URL")


def load_blocklist(path: str) -> tuple[frozenset[str], tuple[str, ...]]:
    domains, subs = set(), []
    for line in list_lines(path):
        if line.startswith("substring:"):
            subs.append(line[len("substring:"):].strip().lower())
        else:
            domains.add(line.lower().lstrip("."))
    return frozenset(domains), tuple(subs)


@register_filter("url")
class UrlFilter(Filter):
    """Drop documents whose URL's domain (or a parent domain) or text is on a blocklist file."""

    Params = UrlParams

    def __init__(self, params: UrlParams):
        super().__init__(params)
        self.domains, self.subs = load_blocklist(params.blocklist)

    def _reason(self, url: str) -> str | None:
        low = url.lower()
        host = (urlsplit(low).hostname or "").rstrip(".")
        parts = host.split(".")
        for i in range(len(parts) - 1):
            if ".".join(parts[i:]) in self.domains:
                return "blocked_domain"
        if any(s in low for s in self.subs):
            return "blocked_substring"
        return None

    def apply(self, batch: pa.RecordBatch) -> FilterResult:
        metas = batch.column("metadata").to_pylist() if "metadata" in batch.schema.names else [None] * batch.num_rows
        reasons = []
        for m in metas:
            url = orjson.loads(m).get(self.params.url_field) if m else None
            reasons.append(self._reason(url) if isinstance(url, str) else None)
        return FilterResult(np.array([r is None for r in reasons], dtype=bool), reasons)
