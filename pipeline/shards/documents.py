"""A document shard's schema and its ids: what ingest writes and every stage reads.

`id` is the record's own id when `id_field` is set; otherwise `content_id`: the xxh3-128
hash of the record's place (file relative to its glob's fixed prefix, and line or row)
and its text, so exact copies keep distinct ids until dedup decides between them.
"""

from __future__ import annotations

import pyarrow as pa
import xxhash

DOC_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("text", pa.string()),
        ("source", pa.string()),
        ("source_id", pa.string()),
        ("metadata", pa.string()),
        ("n_chars", pa.int64()),
        ("n_tokens", pa.int64()),
    ]
)


def content_id(place: str, text: str) -> str:
    return xxhash.xxh3_128_hexdigest(place.encode("utf-8", "surrogatepass") + b"\n" + text.encode("utf-8", "surrogatepass"))
