"""Packing a file's documents into training sequences of exactly `seq_len` tokens
(`tokenize.pack: {seq_len, strategy}`), for trainers that read fixed windows in order.

- **concat**: the documents (with their specials) back to back in the mixture's order, cut
  every `seq_len` tokens; a document may run on into the next sequence. The last sequence
  is padded.
- **best_fit** (best-fit decreasing, as in "Fewer Truncations Improve Language Modeling",
  Ding et al. 2024): a document longer than `seq_len` is cut into `seq_len` pieces (the
  rest is its last piece); the pieces, longest first (ties in the mixture's order), each go
  into the sequence with the least room that still holds it, else into a new one. Only
  documents longer than a sequence are cut, and each sequence is padded.

Padding is the end-of-text id (config/checks make `pack` need `eos`). Each piece is
(document, piece number, start, end) in the packed file, in file order: the provenance
sidecar gets a row a piece, so any token still names its document, and padding none.
Deterministic: the same documents give the same bytes.
"""

from __future__ import annotations

import bisect

import numpy as np

GATHER = 1 << 20  # tokens a gather places at once (pieces are never split)

def pack(ids: np.ndarray, lengths: np.ndarray, seq_len: int, strategy: str, pad: int
         ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(tokens: a multiple of `seq_len` of them, pieces: {"doc", "piece", "start", "end"} in
    file order) of documents packed back to back in `ids` (`lengths` tokens each)."""
    lengths = np.asarray(lengths, np.int64)
    if not len(lengths) or not lengths.sum():
        return ids[:0], {k: np.zeros(0, np.int64) for k in ("doc", "piece", "start", "end")}
    if strategy == "concat":
        return _concat(ids, lengths, seq_len, pad)
    return _best_fit(ids, lengths, seq_len, pad)


def _concat(ids, lengths, seq_len, pad):
    ends = np.cumsum(lengths)
    total = int(ends[-1])
    out = np.full(-(-total // seq_len) * seq_len, pad, ids.dtype)
    out[:total] = ids
    cuts = np.union1d(np.r_[0, ends], np.arange(0, total, seq_len))
    a, b = cuts[:-1], cuts[1:]
    doc = np.searchsorted(ends, a, side="right")
    piece = np.arange(len(a)) - np.searchsorted(doc, doc, side="left")
    return out, {"doc": doc, "piece": piece, "start": a, "end": b}


def _best_fit(ids, lengths, seq_len, pad):
    starts = np.r_[0, np.cumsum(lengths)[:-1]]
    # the pieces: every document cut at multiples of seq_len
    n_pieces = -(-lengths // seq_len)
    doc = np.repeat(np.arange(len(lengths)), n_pieces)
    piece = np.arange(len(doc)) - np.repeat(np.cumsum(n_pieces) - n_pieces, n_pieces)
    src = starts[doc] + piece * seq_len
    size = np.minimum(seq_len, lengths[doc] - piece * seq_len)
    order = np.lexsort((np.arange(len(doc)), -size))  # longest first, then the mixture's order
    rooms: list[tuple[int, int]] = []  # (room left, sequence), sorted: the least room that fits is a bisect away
    fill: list[int] = []
    dst = np.empty(len(doc), np.int64)
    for i in order.tolist():
        n = int(size[i])
        k = bisect.bisect_left(rooms, (n, -1))
        if k < len(rooms):
            room, s = rooms.pop(k)
        else:
            room, s = seq_len, len(fill)
            fill.append(0)
        dst[i] = s * seq_len + fill[s]
        fill[s] += n
        if room - n:
            bisect.insort(rooms, (room - n, s))
    out = np.full(len(fill) * seq_len, pad, ids.dtype)
    # the pieces' tokens to their places, a gather of about GATHER tokens at a time: the index
    # arrays (8 bytes a token each) stay small whatever the file, and short pieces are not a
    # Python step each
    ends = np.cumsum(size)
    lo = 0
    while lo < len(size):
        hi = max(lo + 1, int(np.searchsorted(ends, ends[lo] - size[lo] + GATHER, side="right")))
        n = size[lo:hi]
        step = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
        out[np.repeat(dst[lo:hi], n) + step] = ids[np.repeat(src[lo:hi], n) + step]
        lo = hi
    at = np.argsort(dst, kind="stable")
    return out, {"doc": doc[at], "piece": piece[at], "start": dst[at], "end": dst[at] + size[at]}
