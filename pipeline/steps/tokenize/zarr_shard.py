"""One chunk file of a zarr v3 array with the `sharding_indexed` codec, streamed: the bytes
tensorstore writes for the same data, without holding the chunk.

A sharded chunk file is its inner chunks, each encoded by the inner codecs (`bytes` little
endian, then blosc: lz4, level 5, byte shuffle, as Levanter's metadata resolves), back to
back in order, then the index: per inner chunk (offset, length) as little-endian uint64,
(2^64 - 1, 2^64 - 1) for one not stored (all fill value, 0), then the index's CRC-32C
(zarr v3 sharding spec; tensorstore's `index_codecs: [bytes, crc32c]`). Each inner chunk is
encoded by tensorstore itself (a one-chunk array of the same codecs in memory), so the only
code here is the container, and `tests/pipeline/steps/tokenize/test_levanter.py` checks that a file written
here is byte for byte the one tensorstore writes for the same array.

Why not let tensorstore write the chunk: it keeps a chunk's whole shard in memory and
rewrites it on every partial write; a chunk of Levanter's grid is 134 M ids, so a task
writing it through tensorstore held 0.9 GB (bench/levanter.py writer). Streamed, a task
holds one inner chunk (1-2 MB) and the read buffer.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import numpy as np

MISSING = (1 << 64) - 1


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as the zarr v3 `crc32c` codec appends it (an index is 8 KB)."""
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


class InnerEncoder:
    """Encodes one inner chunk with the inner codecs, through tensorstore."""

    def __init__(self, dtype: str, inner: int):
        import tensorstore as ts

        self.inner = inner
        self.array = ts.open({"driver": "zarr3", "kvstore": {"driver": "memory"}, "metadata": {
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [inner]}},
            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                       {"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "shuffle",
                                                           "typesize": np.dtype(dtype).itemsize, "blocksize": 0}}]}},
            dtype=dtype, shape=[inner], create=True).result()

    def __call__(self, block: np.ndarray) -> bytes:
        self.array[:].write(block).result()
        return self.array.kvstore.read("c/0").result().value


def shard(blocks: Iterator[np.ndarray], dtype: str, inner: int, per_shard: int) -> Iterator[bytes]:
    """The chunk file's bytes, a piece at a time, from its inner chunks in order (`blocks`:
    each `inner` values, zero-padded at the end; fewer than `per_shard` of them when the
    array ends inside the chunk). Yields nothing when no inner chunk is stored (all zeros):
    tensorstore writes no file then."""
    enc = None
    index = [(MISSING, MISSING)] * per_shard
    off = 0
    for j, block in enumerate(blocks):
        if not block.any():  # the fill value only: not stored, as tensorstore does
            continue
        enc = enc or InnerEncoder(dtype, inner)
        data = enc(block)
        index[j] = (off, len(data))
        off += len(data)
        yield data
    if off:
        raw = b"".join(struct.pack("<QQ", a, b) for a, b in index)
        yield raw + struct.pack("<I", crc32c(raw))
