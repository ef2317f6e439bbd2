"""Batch kernels: a batch's words as integer ids, and the word and n-gram statistics of
the heuristic filters computed over the whole batch with numpy.

Per-word Python is what made the Gopher chain slow on long and code-heavy text (a 12 KB
module has ~1,900 words, and the repetition rules build 9 lists of joined n-grams from
them). Here a document's words are looked up once, chunk by chunk, in a per-process
vocabulary (filters/words.py splits a chunk the first time it is seen), and become an
int32 array; a batch is those arrays end to end with document offsets. Every count the
filters need is then a vectorised reduction per document:

- per-word attributes (characters, symbol word, has a letter, stop word) are vocabulary
  arrays indexed by the ids;
- an n-gram is identified by a 64-bit polynomial hash of its characters, computed for
  every position at once from running products (hash of words a..b = B^C[b] * (S[b] -
  S[a-1]) mod 2^64, with C the running character count and S the running sum of
  word-hash * B^-C), salted with its document. Hashing the characters keeps datatrove's
  identities exactly: the top n-grams compare " ".join(words), the repeated n-grams
  "".join(words) (so "ab"+"c" is "a"+"bc");
- counting: one `bincount` of the keys' top bits (a table of ~4 slots per key, per group
  of whole documents so that it stays in cache) sets aside the keys alone in their slot,
  which cannot repeat; the rest go to a hash table (pandas' factorize when pandas is
  loaded, else pyarrow's dictionary_encode) whose codes are in first-seen order, the
  order `Counter.most_common` breaks ties by;
- datatrove's left-to-right scan of repeated n-grams (skip past a repeat, remember only
  what was visited) is sequential; it runs in Python only over the positions whose
  n-gram occurs at least twice in the document, and only for documents where the later
  occurrences of repeated n-grams could add up to the threshold.

A hash collision between two different n-grams of one document would change a count;
with 64-bit hashes that is ~10^-11 per document of 10^4 n-grams. tests/filters/
test_kernels.py checks every count against datatrove's own functions on the demo's
text (summaries in two languages, standard-library modules) and on built cases.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from functools import cached_property
from itertools import chain

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

BASE = 0x9E3779B97F4A7C15 | 1  # odd: invertible mod 2^64
BASE_INV = pow(BASE, -1, 1 << 64)
CHUNK_CACHE_MAX = 500_000  # chunks remembered per process (with their words' ids)
GROUP_CHARS = 4_000_000  # characters of text per kernel call: ~700k words, ~100 MB of temporaries
MEMO_MAX = 2_100  # texts whose ids are remembered: two batches of the filter step
MEMO_MAX_IDS = 8_000_000  # and at most this many ids (32 MB)

try:  # the punctuation datatrove counts as "symbol" characters
    from datatrove.utils.text import PUNCTUATION_SET
except ImportError:  # pragma: no cover - datatrove is a dependency
    PUNCTUATION_SET = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")


class Vocab:
    """One language's words seen by this process: id -> word and its attributes, and
    chunk (whitespace-free text) -> the ids of its words."""

    def __init__(self, language: str):
        from filters.words import splitter

        self.splitter = splitter(language)
        self._reset()

    def _reset(self):
        self.index: dict[str, int] = {}
        self.words: list[str] = []
        self.chunks: dict[str, tuple[int, ...]] = {}
        self._arrays: dict[str, np.ndarray] = {}
        self.memo: dict[str, np.ndarray] = {}  # text -> its ids, for the filters after the first in a chain
        self.memo_ids = 0
        self.generation = getattr(self, "generation", -1) + 1

    def _word_id(self, w: str) -> int:
        i = self.index.get(w)
        if i is None:
            i = self.index[w] = len(self.words)
            self.words.append(w)
        return i

    def _chunk(self, chunk: str) -> tuple[int, ...]:
        words = self.splitter.chunk_words(chunk)
        ids = self.chunks[chunk] = tuple(map(self._word_id, words))
        return ids

    def ids(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(word ids of all texts end to end, offsets: text i is ids[off[i]:off[i+1]])."""
        if len(self.chunks) > CHUNK_CACHE_MAX:
            self._reset()
        if len(self.memo) > MEMO_MAX or self.memo_ids > MEMO_MAX_IDS:
            self.memo.clear()
            self.memo_ids = 0
        memo = self.memo
        missing = [t for t in dict.fromkeys(texts) if t not in memo]
        whole = getattr(self.splitter, "whole_text", False)  # a segmenter that reads across spaces (filters/segmenters.py WHOLE_TEXT)
        mod = native() if missing and not whole else None
        if whole:
            for text in missing:
                arr = memo[text] = np.fromiter(map(self._word_id, self.splitter.split(text)), dtype=np.int32)
                self.memo_ids += len(arr)
        elif mod is not None:  # the chunk loop in C
            raw, counts = mod.text_ids(missing, self.chunks, self.index, self.words, self.splitter.chunk_words)
            got = np.frombuffer(raw, dtype=np.int32)
            ends = np.cumsum(counts).tolist()
            for t, a, b in zip(missing, [0] + ends[:-1], ends):
                memo[t] = got[a:b]
            self.memo_ids += len(got)
        else:
            get = self.chunks.get
            for text in missing:
                chunks = text.split()
                got = list(map(get, chunks))
                if None in got:
                    got = [g if g is not None else self._chunk(c) for g, c in zip(got, chunks)]
                arr = memo[text] = np.fromiter(chain.from_iterable(got), dtype=np.int32)
                self.memo_ids += len(arr)
        parts = [memo[t] for t in texts]
        off = np.zeros(len(texts) + 1, dtype=np.int64)
        np.cumsum([len(a) for a in parts], out=off[1:])
        ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
        return ids, off

    def array(self, name: str) -> np.ndarray:
        """A per-word attribute as a numpy array over the current vocabulary (extended
        by the words added since the last call, computed for them at once)."""
        have = len(self._arrays.get("length", ()))
        if have != len(self.words) or "length" not in self._arrays:  # (an empty vocabulary gets empty arrays)
            new = _attributes(self.words[have:])
            for k, arr in new.items():
                old = self._arrays.get(k)
                self._arrays[k] = arr if old is None else np.concatenate([old, arr])
        return self._arrays[name]

    def lookup(self, words) -> np.ndarray:
        """Ids of the given words that this vocabulary has seen."""
        return np.array(sorted(self.index[w] for w in words if w in self.index), dtype=np.int32)


def _powers(base: int, n: int) -> np.ndarray:
    """base^0 .. base^(n-1) mod 2^64."""
    out = np.full(n, base, dtype=np.uint64)
    out[0] = 1
    with np.errstate(over="ignore"):
        return np.cumprod(out, dtype=np.uint64)


def _attributes(words: list[str]) -> dict[str, np.ndarray]:
    """Characters, symbol word, has a letter, and the polynomial hash of the characters
    (sum of c_i * B^(len-1-i) mod 2^64) with B^len and B^-len, for new words at once."""
    length = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
    symbol = np.fromiter(map(PUNCTUATION_SET.issuperset, words), dtype=np.bool_, count=len(words))
    alpha = np.fromiter((w.isalpha() or any(c.isalpha() for c in w) for w in words), dtype=np.bool_, count=len(words))
    cps = np.frombuffer("".join(words).encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    end = np.cumsum(length)  # one past each word's last character
    start = end - length
    total = int(end[-1]) if len(words) else 0
    with np.errstate(over="ignore"):
        cs = np.cumsum(cps * _powers(BASE_INV, total + 1)[:total], dtype=np.uint64)
        before = np.where(start > 0, cs[np.maximum(start - 1, 0)], np.uint64(0))
        hashes = _powers(BASE, total + 1)[end - 1] * (cs[end - 1] - before)
    top = int(length.max()) + 1 if len(words) else 1
    return {"length": length, "symbol": symbol, "alpha": alpha, "hash": hashes,
            "pow": _powers(BASE, top)[length], "ipow": _powers(BASE_INV, top)[length]}


def native():
    """filters/_native.c's module (the n-gram rules per document in C), or None where it
    was not built or `CURATE_NATIVE=0` (the numpy kernels here then run)."""
    from filters.words import _native

    return _native()


_VOCABS: dict[str, Vocab] = {}


def vocab(language: str = "en") -> Vocab:
    v = _VOCABS.get(language)
    if v is None:
        v = _VOCABS[language] = Vocab(language)
    return v


@dataclass
class Words:
    """A batch's words: `ids[off[i]:off[i+1]]` are document i's."""

    vocab: Vocab
    ids: np.ndarray
    off: np.ndarray
    _prefix: dict = field(default_factory=dict, repr=False)

    @property
    def n_docs(self) -> int:
        return len(self.off) - 1

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.off)

    @cached_property
    def doc(self) -> np.ndarray:
        """The document of every word."""
        return np.repeat(np.arange(self.n_docs, dtype=np.int64), self.counts)

    @cached_property
    def salt(self) -> np.ndarray:
        """A 64-bit value per word from its document's index (mixed into n-gram keys)."""
        with np.errstate(over="ignore"):
            return self.doc.astype(np.uint64) * np.uint64(0xD6E8FEB86659FD93) + np.uint64(0x9E3779B97F4A7C15)

    @cached_property
    def remaining(self) -> np.ndarray:
        """For every word, how many words of its document start there (itself included)."""
        return self.off[1:][self.doc] - np.arange(len(self.ids))

    def per_doc_sum(self, values: np.ndarray) -> np.ndarray:
        """Sum of a per-word value over each document's words (exact for integer values)."""
        cs = np.zeros(len(values) + 1, dtype=np.int64)
        np.cumsum(values, out=cs[1:])
        return cs[self.off[1:]] - cs[self.off[:-1]]


def groups(texts: list[str], max_chars: int | None = None) -> list[range]:
    """Consecutive ranges of `texts` of at most `max_chars` characters each (a longer
    text alone): the kernels' arrays grow with the words they hold, so a filter runs
    them group by group and a batch of long documents takes bounded memory."""
    limit = GROUP_CHARS if max_chars is None else max_chars
    out, start, size = [], 0, 0
    for i, t in enumerate(texts):
        if size and size + len(t) > limit:
            out.append(range(start, i))
            start, size = i, 0
        size += len(t)
    if start < len(texts):
        out.append(range(start, len(texts)))
    return out


def batch_words(texts: list[str], language: str = "en") -> Words:
    v = vocab(language)
    ids, off = v.ids(texts)
    return Words(v, ids, off)


def _prefix(words: Words, sep: int):
    """Running products and sums over the batch's words (shared by every n), each with a
    leading 0 so that entry i is "before word i"."""
    got = words._prefix.get(sep)
    if got is not None:
        return got
    v, ids = words.vocab, words.ids
    length = v.array("length")[ids]
    h, pw, ipw = v.array("hash")[ids], v.array("pow")[ids], v.array("ipow")[ids]
    m = len(ids)
    cb = np.empty(m + 1, dtype=np.uint64)
    s = np.zeros(m + 1, dtype=np.uint64)
    clen = np.zeros(m + 1, dtype=np.int64)
    with np.errstate(over="ignore"):
        if sep:  # each word followed by the separator
            h = h * np.uint64(BASE) + np.uint64(sep)
            pw = pw * np.uint64(BASE)
            ipw = ipw * np.uint64(BASE_INV)
            length = length + 1
        cb[0] = 1
        np.cumprod(pw, dtype=np.uint64, out=cb[1:])  # B^C[i]
        np.cumsum(h * np.cumprod(ipw, dtype=np.uint64), dtype=np.uint64, out=s[1:])  # sum of hash * B^-C
    np.cumsum(length, out=clen[1:])
    got = words._prefix[sep] = (cb, s, clen)
    return got


def _ngram_keys(words: Words, n: int, sep: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(positions, keys, character length) of every n-gram that lies inside one document.

    `sep` > 0 hashes the words joined by `sep` (a character code), 0 concatenated; the
    key is that hash salted with the document, so equal n-grams of two documents differ."""
    m = len(words.ids)
    if m < n:
        e = np.zeros(0, dtype=np.int64)
        return e, e.astype(np.uint64), e
    cb, s, clen = _prefix(words, sep)
    last = m - n + 1  # n-grams start at 0 .. m-n; contiguous slices, then the ones inside a document
    valid = words.remaining[:last] >= n
    with np.errstate(over="ignore"):
        keys = cb[n:]
        keys = keys * (s[n:] - s[:last])
        keys ^= words.salt[:last]
        glen = clen[n:] - clen[:last]
        if sep:
            glen -= 1
    return np.flatnonzero(valid), keys[valid], glen[valid]


def _codes(keys: np.ndarray) -> np.ndarray:
    """Dense codes of the keys in first-seen order (a hash table: pandas' factorize when
    pandas is loaded, else pyarrow's dictionary_encode; both number codes by first appearance)."""
    pd = sys.modules.get("pandas")  # faster, but not worth its 0.2 s import in a fresh worker
    if pd is None:
        enc = pc.dictionary_encode(pa.array(keys, pa.uint64()))
        return enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    return pd.factorize(keys)[0].astype(np.int64, copy=False)


GROUP_KEYS = 1 << 17  # keys per pre-pass table: 2^19 slots, 4 MB, stays in cache


def _repeated(keys: np.ndarray, doc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(indices of the keys that occur at least twice, their codes in first-seen order).

    Most n-grams of a document occur once. Counting the keys' top bits in a table of ~4
    slots per key (one `bincount`) finds the keys alone in their slot, which cannot
    repeat; only the others (the repeats and ~1 in 4 of the rest) go to the exact hash
    table. Keys of one document never equal another's, so the pre-pass runs over groups
    of whole documents (`doc`: each key's document, ascending) with a table that fits in
    cache."""
    m = len(keys)
    cuts = [0]
    while m - cuts[-1] > GROUP_KEYS:  # a group ends where a document starts
        c = int(np.searchsorted(doc, doc[cuts[-1] + GROUP_KEYS], side="left"))
        if c <= cuts[-1]:  # one document longer than a group: the group is that document
            c = int(np.searchsorted(doc, doc[cuts[-1]], side="right"))
        cuts.append(c)
    cuts.append(m)
    parts = []
    for a, b in zip(cuts[:-1], cuts[1:]):
        bits = max(10, min(26, int((b - a) * 4).bit_length()))
        slot = (keys[a:b] >> np.uint64(64 - bits)).astype(np.intp)
        parts.append(np.flatnonzero(np.bincount(slot, minlength=1 << bits)[slot] >= 2) + a)
    cand = np.concatenate(parts) if parts else np.zeros(0, dtype=np.intp)
    if not len(cand):
        return cand, cand
    codes = _codes(keys[cand])
    rep = np.bincount(codes)[codes] >= 2
    return cand[rep], codes[rep]


def top_ngram_chars(words: Words, n: int) -> np.ndarray:
    """Per document: characters of " ".join(most frequent n-gram) times its count (ties:
    first seen), as datatrove's `find_top_duplicate`; 0 for a document under n words."""
    out = np.zeros(words.n_docs, dtype=np.int64)
    if (mod := native()) is not None:
        v = words.vocab
        mod.ngram_chars(words.ids, words.off, v.array("hash"), v.array("pow"), v.array("length"), n, 0, out)
        return out
    start, keys, glen = _ngram_keys(words, n, sep=32)
    if not len(start):
        return out
    pos_doc = words.doc[start]
    # a document with no repeated n-gram: its first n-gram, once (the first seen of the ties)
    first_of_doc = np.flatnonzero(np.r_[True, pos_doc[1:] != pos_doc[:-1]])
    out[pos_doc[first_of_doc]] = glen[first_of_doc]
    idx, codes = _repeated(keys, pos_doc)
    if not len(idx):
        return out
    # codes are in first-seen order, and a document's codes are contiguous: its top
    # n-gram is the highest count, ties to the lowest code
    counts = np.bincount(codes)
    first = np.flatnonzero(np.r_[True, codes[1:] > np.maximum.accumulate(codes)[:-1]])  # first position of each code
    ucodes = codes[first]
    code_doc = pos_doc[idx[first]]
    k = len(counts) + 1
    score = counts[ucodes].astype(np.int64) * k - ucodes
    bounds = np.flatnonzero(np.r_[True, code_doc[1:] != code_doc[:-1]])
    best = np.maximum.reduceat(score, bounds)
    best_code = (k - best % k) % k
    best_count = (best + best_code) // k
    where = np.searchsorted(ucodes, best_code)  # the code's first position among the repeats
    out[code_doc[bounds]] = glen[idx[first[where]]] * best_count
    return out


def dup_ngram_chars(words: Words, n: int, docs: np.ndarray | None = None,
                    limit: np.ndarray | None = None) -> np.ndarray:
    """Per document: characters in repeated n-grams ("".join identity), by datatrove's
    `find_all_duplicate` scan; only for `docs` (a boolean mask) when given, else all.

    With `limit` (characters per document), a document whose repeated n-grams can be
    shown not to exceed it is not scanned: every n-gram the scan counts is a later
    occurrence of a repeated one, so the characters of all later occurrences bound the
    count; where that bound is at most the limit, it is returned instead (a value <=
    limit, which is all a threshold needs)."""
    out = np.zeros(words.n_docs, dtype=np.int64)
    if (mod := native()) is not None:  # every document scanned, in C
        v = words.vocab
        mod.ngram_chars(words.ids, words.off, v.array("hash"), v.array("pow"), v.array("length"), n, 1, out)
        if docs is not None:
            out[~docs] = 0
        return out
    start, keys, glen = _ngram_keys(words, n, sep=0)
    if not len(start):
        return out
    key_doc = words.doc[start]
    idx, codes = _repeated(keys, key_doc)
    if docs is not None and len(idx):
        keep = docs[key_doc[idx]]
        idx, codes = idx[keep], codes[keep]
    if not len(idx):
        return out
    ev_doc = key_doc[idx]
    if limit is not None:
        later = np.r_[False, codes[1:] <= np.maximum.accumulate(codes)[:-1]]  # not a code's first occurrence
        bound = np.bincount(ev_doc[later], weights=glen[idx[later]], minlength=words.n_docs).astype(np.int64)
        scan = bound > limit
        out[~scan] = bound[~scan]
        keep = scan[ev_doc]
        idx, codes, ev_doc = idx[keep], codes[keep], ev_doc[keep]
        if not len(idx):
            return out
    ev_pos = (start[idx] - words.off[ev_doc]).tolist()
    ev_code = codes.tolist()
    ev_len = glen[idx].tolist()
    bounds = np.flatnonzero(np.r_[True, ev_doc[1:] != ev_doc[:-1], True]).tolist()
    ev_doc = ev_doc.tolist()
    for a, b in zip(bounds[:-1], bounds[1:]):
        seen: set[int] = set()
        nxt = chars = 0
        for p, c, ln in zip(ev_pos[a:b], ev_code[a:b], ev_len[a:b]):
            if p < nxt:  # inside a repeat the scan skipped
                continue
            if c in seen:
                chars += ln
                nxt = p + n
            else:
                seen.add(c)
                nxt = p + 1
        out[ev_doc[a]] = chars
    return out
