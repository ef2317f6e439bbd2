"""WARC and WET files, read streaming with resiliparse's FastWARC; and written, for the demo
corpus and the tests.

`iter_records` yields one `WebRecord` per response, resource or conversion (WET) record,
with its URL, crawl date, record id, HTTP status, content type and declared charset, and
its payload bytes. Other record types (warcinfo, request, metadata, revisit) are not
documents: they are counted by type in `skipped` and not read. A record over `max_bytes`
is yielded with `payload=None` (the caller sets it aside as too_large) and never read.

FastWARC ends iteration quietly at a file cut short. So the file is decompressed here
(gzip, zstd: an error or a cut member raises), and each record is checked against its
declared lengths (WARC Content-Length, then the payload's); a short record, one without
its headers, or a decompression error ends the file with a `StreamError` at that record.
What was read before it stands; nothing after it is lost silently. Offsets are in the
decompressed stream.
"""

from __future__ import annotations

import gzip
import io
from dataclasses import dataclass
from datetime import datetime

from fastwarc.warc import ArchiveIterator, WarcRecord, WarcRecordType

from pipeline.io import readers
from pipeline.io.readers import StreamError

DOCUMENT_TYPES = {"response", "resource", "conversion"}


@dataclass
class WebRecord:
    index: int  # the record's ordinal in the file (every type counted), for "file#index"
    offset: int  # byte offset of the record (of its gzip member in a .warc.gz)
    kind: str  # response | resource | conversion
    url: str | None
    date: str | None  # WARC-Date, ISO 8601 as written
    record_id: str | None
    status: int | None  # HTTP status, None when the record is not HTTP
    content_type: str | None  # WARC-Identified-Payload-Type, else HTTP Content-Type, else the record's
    charset: str | None  # declared in the HTTP Content-Type
    size: int  # payload bytes
    payload: bytes | None  # None when over max_bytes


def iter_records(path: str, compression: str | None, max_bytes: int, skipped: dict):
    """WebRecords of one WARC/WET file in order, then at most one StreamError."""
    # decompressed here, not by FastWARC, whose gzip reader stops quietly at a cut member
    stream = readers.open_binary(path, compression)
    try:
        yield from _records(_OneStep(stream), max_bytes, skipped)
    finally:
        stream.close()


class _OneStep:
    """A stream whose read() is its read1(): one decompression step a call, so an error
    (a cut or damaged member) is raised only after every byte before it was delivered
    (a buffered read() that fails part-way drops what it had read)."""

    def __init__(self, stream):
        self.stream = stream
        self.pos = 0

    def read(self, n: int = -1) -> bytes:
        b = self.stream.read1(n if n and n > 0 else readers.READ_CHUNK)
        self.pos += len(b)
        return b

    def tell(self) -> int:  # FastWARC asks for record offsets
        return self.pos

    def readable(self) -> bool:
        return True

    def close(self):
        self.stream.close()


def _records(stream, max_bytes: int, skipped: dict):
    it = ArchiveIterator(stream, record_types=WarcRecordType.any_type, parse_http=False, stream_detect=False)
    index = -1
    last_offset = 0
    while True:
        try:
            r = next(it)
        except StopIteration:
            return
        except readers.STREAM_ERRORS as e:  # gzip or zstd data error, a cut compressed stream
            yield StreamError(index + 2, last_offset, f"{type(e).__name__}: {e}")
            return
        index += 1
        last_offset = r.stream_pos
        try:
            out = _record(r, index, max_bytes)
        except readers.STREAM_ERRORS as e:  # while reading the record's HTTP headers or payload
            out = StreamError(index + 1, r.stream_pos, f"{type(e).__name__}: {e}")
        if isinstance(out, str):
            skipped[out] = skipped.get(out, 0) + 1
            continue
        yield out
        if isinstance(out, StreamError):
            return


def _record(r, index: int, max_bytes: int) -> WebRecord | StreamError | str:
    """One record: a WebRecord, a StreamError, or the type of a record that is no document."""
    h = r.headers
    kind = str(r.record_type)
    declared = h.get("Content-Length")
    if declared is None or h.get("WARC-Type") is None or not declared.isdigit() or int(declared) != r.content_length:
        return StreamError(index + 1, r.stream_pos, "the file ends inside a record's headers (cut short?)")
    if kind not in DOCUMENT_TYPES:
        got = r.consume()
        if got < r.content_length:
            return StreamError(index + 1, r.stream_pos, f"the file ends inside a record ({got:,} of {r.content_length:,} bytes)")
        return kind
    status = ctype = charset = None
    if r.is_http:
        r.parse_http()  # OSError on a cut or malformed header block
        status = r.http_headers.status_code
        ctype, charset = r.http_content_type, r.http_charset
    else:
        ctype = (h.get("Content-Type") or "").split(";")[0].strip().lower() or None
    # the crawler's own sniffed type (Common Crawl writes it) beats what the server declared
    ctype = (h.get("WARC-Identified-Payload-Type") or "").split(";")[0].strip().lower() or ctype
    size = r.content_length
    payload = None
    if size <= max_bytes:
        payload = r.reader.read()
        got = len(payload)
    else:
        got = r.consume()
    if got < size:
        return StreamError(index + 1, r.stream_pos, f"the file ends inside a record ({got:,} of {size:,} bytes)")
    return WebRecord(index, r.stream_pos, kind, h.get("WARC-Target-URI"), h.get("WARC-Date"),
                     h.get("WARC-Record-ID"), status, ctype, charset, size, payload)


# ---------------------------------------------------------------- writing (demo corpus, tests)


def http_response(body: bytes, content_type: str = "text/html", charset: str | None = "utf-8", status: int = 200,
                  reason: str = "OK") -> bytes:
    ct = f"{content_type}; charset={charset}" if charset else content_type
    return f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ct}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


def record_bytes(kind: str, url: str | None, date: str, block: bytes, uuid: str, http: bool = True,
                 payload_type: str | None = None) -> bytes:
    """One WARC/1.1 record. `kind`: response, request, conversion (WET text), warcinfo, ...;
    `payload_type`: WARC-Identified-Payload-Type, as Common Crawl writes it."""
    r = WarcRecord()
    r.init_headers(getattr(WarcRecordType, kind), f"uuid:{uuid}".encode())
    if url is not None:
        r.headers["WARC-Target-URI"] = url
    r.headers["WARC-Date"] = date
    if payload_type:
        r.headers["WARC-Identified-Payload-Type"] = payload_type
    if http:
        r.headers["Content-Type"] = f"application/http; msgtype={'request' if kind == 'request' else 'response'}"
    elif kind == "conversion":
        r.headers["Content-Type"] = "text/plain"
    r.set_bytes_content(block)
    b = io.BytesIO()
    r.write(b)
    return b.getvalue()


def write_warc(path, records: list[bytes], compress: bool = True) -> None:
    """Records as a .warc.gz (one gzip member per record, as crawlers write them) or a
    plain .warc; byte-identical for the same records."""
    with open(path, "wb") as f:
        f.writelines(gzip.compress(rec, mtime=0) if compress else rec for rec in records)


def iso(d: datetime) -> str:
    return d.strftime("%Y-%m-%dT%H:%M:%SZ")
