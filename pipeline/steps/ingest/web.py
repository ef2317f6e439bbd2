"""Ingest for web input: WARC/WET records, HTML files and HTML fields, to text documents.

Runs inside the ingest task (steps/ingest/documents.py) with its sink, so web documents get the same
ids, shards, quarantine and accounting as any other. Per record:

- warcinfo, request, metadata and revisit records are not documents: counted by type in
  the marker's `skipped_records`, not in `in`.
- a response, resource or conversion (WET) record is a document: `in` counts it. A
  non-2xx HTTP status or a payload that is not HTML becomes a row with empty text and
  `extraction: http_status | not_html` in its metadata, which the `extract` stage (the
  first stage of the source's filter step) removes with that reason, so the report's funnel
  shows what extraction lost and `curate samples --stage extract` shows which pages. An
  extraction that yields only whitespace is removed the same way as `no_text`.
- a page whose extraction times out, raises or kills the extractor is quarantined
  (`extract_timeout`, `extract_error`, `extract_crash`) with its file, record and URL.

Metadata keeps url, crawl_date, warc_type, warc_record_id, http_status, content_type,
charset (declared) and encoding (used to decode; see pipeline/steps/ingest/extract.py).
"""

from __future__ import annotations

import functools
from collections import deque

import orjson

from pipeline.steps.ingest import extract
from pipeline.io import readers, warc
from pipeline.io.readers import StreamError
from pipeline.shards.documents import content_id

EXCERPT = 200


class Extraction:
    """One shard's extractor process, its figures, and the order of its output.

    Pages are extracted a little ahead (the sandbox keeps DEPTH pages in flight), so what a
    record turns into (a document, a quarantine entry) is queued in `outbox` and done in
    input order once the pages before it are back: shards come out the same whatever the
    timing. `text_now` is the synchronous form (HTML fields)."""

    MAX_QUEUED = 1024  # records waiting behind a page before the pages in flight are awaited

    def __init__(self, shard):
        self.shard = shard
        self.sandbox = extract.Sandbox(shard.spec["extract"])
        self.stats = {"type": shard.spec["extract"]["type"], "pages": 0, "timeouts": 0, "errors": 0, "crashes": 0}
        self.outbox: deque = deque()  # callables ready to run, and _Pages awaiting their result

    def later(self, fn) -> None:
        """Run `fn` now, or after the pages queued before it."""
        if not self.outbox:
            fn()
            return
        self.outbox.append(fn)
        if len(self.outbox) > self.MAX_QUEUED:
            self.finish()

    def page(self, html: str, file: dict, where: dict, url: str | None, on_text) -> None:
        """Extract `html`; in input order, `on_text(text)` or a quarantine entry."""
        entry = _Page((html[:EXCERPT], file, where, url), on_text)
        self.outbox.append(entry)
        self._settle(self.sandbox.submit(html, entry))

    def finish(self) -> None:
        self._settle(self.sandbox.drain())

    def _settle(self, results) -> None:
        for entry, status, value in results:
            entry.result = (status, value)
        while self.outbox and not (isinstance(self.outbox[0], _Page) and self.outbox[0].result is None):
            e = self.outbox.popleft()
            if not isinstance(e, _Page):
                e()
                continue
            (status, value), (excerpt, file, where, url) = e.result, e.where
            text = self._outcome(status, value, excerpt, file, where, url)
            if text is not None:
                e.on_text(text)

    def text_now(self, html: str, file: dict, where: dict, url: str | None) -> str | None:
        """The page's text ("" when there is none), or None when it went to quarantine."""
        status, value = self.sandbox.extract(html)
        return self._outcome(status, value, html[:EXCERPT], file, where, url)

    def _outcome(self, status: str, value: str, excerpt: str, file: dict, where: dict, url) -> str | None:
        self.stats["pages"] += 1
        if status == "ok":
            return value
        key, reason = {"timeout": ("timeouts", "extract_timeout"), "error": ("errors", "extract_error"),
                       "crash": ("crashes", "extract_crash")}[status]
        self.stats[key] += 1
        hint = f"; raise sources.{self.shard.source}.extract.timeout if the page is wanted" if status == "timeout" else ""
        self.shard.bad(reason, f"{value}{hint}", file, **where, raw=excerpt, url=url)
        return None

    def close(self) -> dict:
        self.sandbox.close()
        self.stats["restarts"] = max(0, self.sandbox.starts - 1)
        self.stats["cpu_seconds"] = round(self.sandbox.cpu, 3)  # in the extractor, pages that finished
        return self.stats


class _Page:
    """A page in the outbox: where it came from, what to do with its text, its result once back."""

    __slots__ = ("on_text", "result", "where")

    def __init__(self, where: tuple[str, dict, dict, str | None], on_text):
        self.where = where  # (excerpt, file, where, url) for a quarantine entry
        self.on_text = on_text
        self.result: tuple[str, str] | None = None


def _meta(d: dict) -> str:
    return orjson.dumps({k: v for k, v in d.items() if v is not None}, option=orjson.OPT_SORT_KEYS).decode()


def _emit(shard, text: str, skip: str | None = None, *, meta: dict, place: str, source_id: str, loc: int):

    if skip is None and text is not None and not text.strip():
        skip, text = "no_text", ""
    if skip:
        meta["extraction"] = skip
    shard.add(content_id(place, text), text, source_id, _meta(meta), loc)


def ingest_warc(shard, split: dict) -> None:
    f = split["file"]
    limit = shard.spec["max_doc_bytes"]
    ext = Extraction(shard)
    skipped: dict[str, int] = {}
    stop = None
    try:
        for rec in warc.iter_records(f["path"], f["compression"], limit, skipped):
            if isinstance(rec, StreamError):
                stop = rec
                break
            where = {"row": rec.index, "offset": rec.offset}
            if rec.payload is None:
                ext.later(functools.partial(
                    shard.bad, "too_large", f"the record's payload has {rec.size:,} bytes, over sources.{shard.source}."
                    f"max_doc_bytes ({limit:,}); raise the limit or drop the record", f, **where, url=rec.url))
                continue
            meta = {"url": rec.url, "crawl_date": rec.date, "warc_type": rec.kind, "warc_record_id": rec.record_id,
                    "http_status": rec.status, "content_type": rec.content_type, "charset": rec.charset}
            place = f"{f['rel']}#{rec.index}"
            emit = functools.partial(_emit, shard, meta=meta, place=place, source_id=rec.record_id or place, loc=rec.index)
            if rec.kind == "conversion":  # WET: the crawler's own text
                meta["encoding"] = "utf-8"
                ext.later(functools.partial(emit, rec.payload.decode("utf-8", "replace")))
            elif rec.status is not None and not 200 <= rec.status < 300:
                ext.later(functools.partial(emit, "", "http_status"))
            elif not extract.is_html(rec.content_type, rec.payload):
                ext.later(functools.partial(emit, "", "not_html"))
            else:
                html, meta["encoding"] = extract.decode(rec.payload, rec.charset)
                ext.page(html, f, where, rec.url, emit)
        ext.finish()
        if stop is not None:
            shard.stats["stream_error"] = stop.message
            shard.bad("corrupt_stream", f"the WARC file is unreadable from record {stop.line_no} on ({stop.message}); "
                      "the records after this point could not be read or counted; re-fetch or repair the file",
                      f, row=stop.line_no - 1, offset=stop.offset, unread_records="unknown")
    finally:
        shard.stats["skipped_records"] = dict(sorted(skipped.items()))
        shard.stats["extract"] = ext.close()


def ingest_html_files(shard, split: dict) -> None:
    """A group of .html files, one document each; source_id is the file's name under its glob."""
    limit = shard.spec["max_doc_bytes"]
    ext = Extraction(shard)
    try:
        for i, f in enumerate(split["files"]):
            if f.get("unreadable"):
                ext.later(functools.partial(
                    shard.bad, "unreadable_file", f"the file cannot be read ({f['unreadable']}); give the user running "
                    "curate read access (e.g. chmod a+r) and run again", f, row=0))
                continue
            try:
                with readers.open_binary(f["path"], f["compression"]) as fh:
                    payload = fh.read(limit + 1)
            except readers.STREAM_ERRORS as e:
                ext.later(functools.partial(shard.bad, "corrupt_file", f"the file is unreadable ({type(e).__name__}: {e}); "
                                            "re-fetch or repair it", f, row=0))
                continue
            if len(payload) > limit:
                ext.later(functools.partial(shard.bad, "too_large", f"the page has over {limit:,} bytes (sources.{shard.source}."
                                            "max_doc_bytes); raise the limit or drop the file", f, row=0, raw=payload[:EXCERPT]))
                continue
            meta = {"path": f["rel"]}
            html, meta["encoding"] = extract.decode(payload, None)
            ext.page(html, f, {"row": 0}, None,
                     functools.partial(_emit, shard, meta=meta, place=f["rel"], source_id=f["rel"], loc=i))
        ext.finish()
    finally:
        shard.stats["extract"] = ext.close()


class FieldExtraction:
    """`html_field` of JSONL/Parquet/HF records: the field's HTML to the document's text."""

    def __init__(self, shard):
        self.shard = shard
        self.ext = Extraction(shard) if shard.keep_fields else None

    def text(self, html: str, file: dict, where: dict, url) -> tuple[str | None, str | None]:
        """(text, skip reason); text None: quarantined."""
        if self.ext is None:
            return "-", None
        text = self.ext.text_now(html, file, where, url if isinstance(url, str) else None)
        if text is None:
            return None, None
        return (text, None) if text.strip() else ("", "no_text")

    def close(self):
        if self.ext is not None:
            self.shard.stats["extract"] = self.ext.close()
