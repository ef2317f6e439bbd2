"""The `extract:` section of a web source: HTML to text, its extractor and limits (a
discriminated union on `type`; pipeline/steps/ingest/extract.py runs it)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["WEB_FORMATS", "ExtractSpec", "PythonExtract", "ResiliparseExtract", "TrafilaturaExtract"]


class _ExtractBase(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)  # as config/models.py Model

    timeout: float = Field(5.0, gt=0, description="CPU seconds one page may take; a page over it is quarantined as "
                           "extract_timeout (a wall-clock guard of 4x this + 10 s catches pages that hang without computing)")
    max_memory_mb: int = Field(2048, ge=256, description="address space of the extractor process; a page that needs more "
                               "is quarantined (extract_error: MemoryError, or extract_crash) and the shard goes on")


class ResiliparseExtract(_ExtractBase):
    """resiliparse's extract_plain_text (the default; as DCLM): fast, main-content heuristics."""

    type: Literal["resiliparse"] = "resiliparse"
    main_content: bool = Field(True, description="keep only the main content (drop navigation, headers, footers)")
    preserve_formatting: bool = Field(True, description="keep line breaks, paragraphs and lists")
    list_bullets: bool = Field(True, description="bullets and numbers for list items")
    alt_texts: bool = Field(False, description="keep images' alternative texts")
    links: bool = Field(False, description="keep link targets")
    form_fields: bool = Field(False, description="keep form fields")
    noscript: bool = Field(False, description="keep <noscript> content")
    comments: bool = Field(False, description="treat comment sections as main content")
    skip_elements: list[str] | None = Field(None, description="CSS selectors of elements to drop")


class TrafilaturaExtract(_ExtractBase):
    """trafilatura.extract (as FineWeb and datatrove); its cross-page `deduplicate` cache is not offered: results would
    depend on which pages a worker saw before (paragraph dedup does that across the corpus)."""

    type: Literal["trafilatura"] = "trafilatura"
    favor_precision: bool = Field(True, description="less text, more surely main content (as FineWeb)")
    favor_recall: bool = Field(False, description="more text, less surely main content")
    include_comments: bool = Field(False, description="keep comment sections")
    include_tables: bool = Field(True, description="keep tables' text")
    include_images: bool = Field(False, description="keep image descriptions")
    include_links: bool = Field(False, description="keep link targets")
    include_formatting: bool = Field(False, description="keep bold/italic markup")


class PythonExtract(_ExtractBase):
    """Your own function, run in the same sandbox with the same time limit."""

    type: Literal["python"] = "python"
    callable: str = Field(description="module:function taking the page's HTML (str) and returning its text")


ExtractSpec = Annotated[ResiliparseExtract | TrafilaturaExtract | PythonExtract, Field(discriminator="type")]
WEB_FORMATS = ("warc", "html")
