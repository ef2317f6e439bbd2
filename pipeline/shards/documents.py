"""A document shard's schema and its ids: what ingest writes and every stage reads.

`id` is the record's own id when `id_field` is set; otherwise `content_id`: the xxh3-128
hash of the record's place (file relative to its glob's fixed prefix, and line or row)
and its text, so exact copies keep distinct ids until dedup decides between them.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict, cast

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
# the rows of a mixture shard (mix) and of the token files written from it (tokenize), in this order
MIX_ORDER = [("order", "ascending"), ("source", "ascending"), ("id", "ascending"), ("epoch", "ascending")]


def content_id(place: str, text: str) -> str:
    return xxhash.xxh3_128_hexdigest(place.encode("utf-8", "surrogatepass") + b"\n" + text.encode("utf-8", "surrogatepass"))


class DocShard(TypedDict):
    """One document shard as a step's spec carries it (plan/context.py `doc_shards`): where
    its documents are, the attribute layers that decide it, in order, and its counts."""

    source: str
    src: int  # the source's position in the YAML
    rank: int  # its survivor priority (dedup keeps the lowest)
    part: int  # the ingest shard's number
    index: int  # its position among the source's shards
    k: int  # its global number: shard k of every per-document-shard step
    slot: int  # where decisions come back to (plan/context.py `slot_offsets`)
    documents: str  # the ingest shard's Parquet file
    layers: list[str]  # its attribute files: the filter step's, the global layers', quality and topic
    kept: int  # documents and tokens after the last of those layers
    tokens: int
    bucket_docs: NotRequired[list[int]]  # a quality step's counts per bucket
    bucket_tokens: NotRequired[list[int]]
    groups: NotRequired[list[list]]  # a topic step's per (topic, bucket)
    axis_groups: NotRequired[list[list]]  # mix-axes' per (axis value, bucket)


class LayerMarker(TypedDict):
    """What a layer's shard reports (shards/apply.py `stage_stats`): the rows that reached the
    stage and what it kept, by count, characters and tokens, and removals by reason."""

    rows: int
    source: str
    part: int
    docs_in: int
    docs_out: int
    chars_in: int
    chars_out: int
    tokens_in: int
    tokens_out: int
    removed: dict[str, int]


COUNTS = ("bucket_docs", "bucket_tokens", "groups", "axis_groups")  # the driver's, for the cells' availability


def slim(d: DocShard) -> DocShard:
    """A document shard as a task's spec carries it: without the counts only the driver reads
    (per bucket, topic and axis value: as many entries a shard as the source has cells; keys a
    DocShard may leave out)."""
    return cast(DocShard, {k: v for k, v in d.items() if k not in COUNTS})
