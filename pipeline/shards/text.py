"""Text to dedup keys: normalisation, word n-gram shingles, MinHash, LSH bands, paragraphs.

`normalize` (exact dedup) gives the same bytes as datatrove's `simplify_text` for the
options they share (case, digits, punctuation to spaces, whitespace; a test compares
them), working on UTF-8 bytes where it can (`bytes.translate`, `bytes.split`).

`fold` (fuzzy dedup) normalises a whole batch at once in numpy, since only word
boundaries matter there: punctuation and whitespace become spaces, digit runs one 0.
Words are hashed with a polynomial hash over the batch (prefix sums mod 2^64 with an odd
base, so a word's hash is (H[e] - H[s]) * base^-s, then murmur3's finaliser), and each
word n-gram from its n word hashes. A document with fewer than n words is one shingle
of all its words. filters/_native.c computes the same values in one pass over the folded
bytes (the numpy passes move ~40 bytes of memory per byte of text: 7x slower); the numpy
path stays for builds without a C compiler, and a test holds the two equal.

MinHash uses `num_perm` multiply-add permutations of 32-bit shingle values, mod 2^32,
computed for a whole batch of documents per permutation and reduced per document with
`np.minimum.reduceat`. Band buckets hash each band's `rows` values with the band index.
"""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np

from filters.kernels import native

NORMALIZE_OPTIONS = ("whitespace", "case", "punctuation", "digits")
_U64 = np.uint64
_MASK32 = _U64(0xFFFFFFFF)


@lru_cache(maxsize=1)
def _tables():
    """datatrove's punctuation set: a byte table for ASCII, UTF-8 sequences for the rest.
    Non-ASCII whitespace is listed too, since simplify_text's whitespace is Unicode \\s."""
    from datatrove.utils.text import PUNCTUATION  # the reference set of characters

    table = bytearray(range(256))
    for c in PUNCTUATION:
        if ord(c) < 128:
            table[ord(c)] = 32
    return bytes(table), frozenset(c for c in PUNCTUATION if ord(c) >= 128), frozenset(map(chr, WIDE_SPACES))


# The non-ASCII characters str.isspace() holds true for (Python 3.11's Unicode 14; a test
# checks them against every code point): listed, since finding them costs 0.3 s a process
WIDE_SPACES = (0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000)


@lru_cache(maxsize=4)
def _wide_re(punctuation: bool, space: bool):
    """One character class of the non-ASCII characters `normalize` makes spaces (a regex
    scan, ~10x a set intersection with the text), or None when there are none."""
    wide_punct, wide_space = _tables()[1:]
    chars = (wide_punct if punctuation else frozenset()) | (wide_space if space else frozenset())
    return re.compile("[" + "".join(re.escape(c) for c in sorted(chars)) + "]") if chars else None


_NUMBERS = re.compile(r"\d+([.,،٫⎖⎗⎘]\d+)?")  # simplify_text's number pattern (\d is Unicode Nd)
_NUMBERS_ASCII = re.compile(rb"[0-9]+([.,][0-9]+)?")


def normalize(text: str, options) -> bytes:
    """The normalised text as UTF-8 bytes (for exact dedup); `options` is a subset of
    NORMALIZE_OPTIONS, with simplify_text's meaning."""
    if "case" in options:
        text = text.lower()
    ascii_only = text.isascii()
    fold_space = "whitespace" in options
    if not ascii_only:
        if "digits" in options:
            text = _NUMBERS.sub("0", text)
        rx = _wide_re("punctuation" in options, fold_space)
        if rx is not None:
            text = rx.sub(" ", text)
    data = text.encode("utf-8", "surrogatepass")
    if "digits" in options and ascii_only:
        data = _NUMBERS_ASCII.sub(b"0", data)
    if "punctuation" in options:
        data = data.translate(_tables()[0])
    if "whitespace" in options:
        data = b" ".join(data.split())
    else:  # simplify_text always strips
        data = data.strip() if ascii_only else data.decode("utf-8", "surrogatepass").strip().encode("utf-8", "surrogatepass")
    return data


def fmix64(h: np.ndarray) -> np.ndarray:
    """murmur3's 64-bit finaliser, in place on a uint64 array (wrapping arithmetic)."""
    h ^= h >> _U64(33)
    h *= _U64(0xFF51AFD7ED558CCD)
    h ^= h >> _U64(33)
    h *= _U64(0xC4CEB9FE1A85EC53)
    h ^= h >> _U64(33)
    return h


_BASE = 0x100000001B3  # odd, so it has an inverse mod 2^64
_BASE_INV = pow(_BASE, -1, 1 << 64)


def _powers(base: int, n: int) -> np.ndarray:
    p = np.empty(n, np.uint64)
    p[0] = 1
    p[1:] = base
    return np.cumprod(p, dtype=np.uint64)


@lru_cache(maxsize=4)
def _fold_tables(punctuation: bool) -> tuple[np.ndarray, np.ndarray]:
    """(byte table, sorted non-ASCII code points that become spaces) for `fold`."""
    table, wide_punct, wide_space = _tables()
    t = np.frombuffer(table if punctuation else bytes(range(256)), np.uint8).copy()
    t[[9, 10, 11, 12, 13, 28, 29, 30, 31]] = 32  # ASCII whitespace (str.split's) to " "
    t[0] = 0  # NUL separates documents in `fold`'s output (texts' own NULs are replaced first)
    wide = set(wide_space) | (set(wide_punct) if punctuation else set())
    return t, np.array(sorted(ord(c) for c in wide), dtype=np.int64)


def fold(texts: list[str], options) -> np.ndarray:
    """Texts normalised for shingling, as one uint8 array with NUL between documents.

    The folding is vectorised over the batch: case (str.lower), punctuation and every
    whitespace character to spaces (datatrove's punctuation set; non-ASCII characters are
    matched by decoded code point), and with "digits" each run of ASCII digits becomes
    one 0 (simplify_text also folds a decimal part and non-ASCII digits; here its
    separator becomes a space). Word boundaries are all that matter downstream.
    """
    if "case" in options:
        texts = [t.lower() for t in texts]
    texts = [t.replace("\x00", " ") if "\x00" in t else t for t in texts]
    arr = np.frombuffer("\x00".join(texts).encode("utf-8", "surrogatepass"), np.uint8)
    table, wide = _fold_tables("punctuation" in options)
    arr = table[arr]  # a copy
    lead = np.flatnonzero(arr >= 0xC0)
    if len(lead):
        a = np.concatenate([arr, np.zeros(3, np.uint8)])
        b0, b1, b2, b3 = (a[lead + k].astype(np.int64) & (0xFF if k == 0 else 0x3F) for k in range(4))
        two, three = b0 < 0xE0, (b0 >= 0xE0) & (b0 < 0xF0)
        cp = np.where(two, ((b0 & 0x1F) << 6) | b1,
                      np.where(three, ((b0 & 0x0F) << 12) | (b1 << 6) | b2, ((b0 & 0x07) << 18) | (b1 << 12) | (b2 << 6) | b3))
        hit = np.isin(cp, wide)
        if hit.any():
            width = np.where(two, 2, np.where(three, 3, 4))[hit]
            starts = lead[hit]
            for k in range(4):
                sel = starts[width > k] + k
                arr[sel] = 32
    if "digits" in options:
        d = (arr >= 48) & (arr <= 57)
        arr[d] = 48
        again = d[1:] & d[:-1]
        if again.any():
            arr = arr[np.r_[True, ~again]]
    # NUL marks document ends; the table mapped every text NUL to a space above
    return arr


_POWERS: dict[int, np.ndarray] = {}


def _power_table(base: int, n: int) -> np.ndarray:
    """base^0 .. base^(n-1) mod 2^64, cached and grown geometrically."""
    have = _POWERS.get(base)
    if have is None or len(have) < n:
        have = _powers(base, max(n, 2 * len(have) if have is not None else n, 1 << 16))
        _POWERS[base] = have
    return have[:n]


_WORD_MUL = _U64(0x9E3779B97F4A7C15)


def shingles(texts: list[str], n: int, options=("case", "punctuation", "digits"), min_words: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Hashes of the word n-grams of texts after `fold` (words split on whitespace).

    Returns (hashes uint64, doc index int64), doc-major; a text with no words has none,
    nor has a text with fewer than `min_words` words (when min_words >= n, a text shorter
    than n words has none either: decontamination checks only units of n words or more).
    Each word is hashed from its bytes, each n-gram from its n word hashes, so the hash
    does not depend on how much whitespace separates the words.
    """
    if not texts:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    arr = fold(texts, options)
    if (mod := native()) is not None:  # the same values in one compiled pass (filters/_native.c)
        h, d = mod.shingles(arr, n, min_words)
        return np.frombuffer(h, np.uint64), np.frombuffer(d, np.int64)
    # fold mapped text NULs to spaces: the NULs left are document ends; 32 is every space
    arr_nul = arr == 0
    size = len(arr)
    prefix = np.zeros(size + 1, np.uint64)
    weighted = arr.astype(np.uint64)
    weighted *= _power_table(_BASE, size)
    np.cumsum(weighted, out=prefix[1:])
    del weighted
    space = np.concatenate([[True], (arr == 32) | arr_nul, [True]])
    edge = np.diff(space.view(np.int8))
    starts = np.flatnonzero(edge == -1)  # space -> word
    ends = np.flatnonzero(edge == 1)  # word -> space
    if len(starts) == 0:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    word = fmix64((prefix[ends] - prefix[starts]) * _power_table(_BASE_INV, size + 1)[starts])
    word_doc = np.cumsum(arr_nul)[starts]
    counts = np.bincount(word_doc, minlength=len(texts))
    m = len(word) - n + 1
    h_parts, d_parts = [], []
    if m > 0:
        acc = word[:m].copy()
        for k in range(1, n):
            acc *= _WORD_MUL
            acc += word[k : m + k]
        ok = word_doc[:m] == word_doc[n - 1 :]
        if min_words:
            ok &= counts[word_doc[:m]] >= min_words
        h_parts.append(acc[ok])
        d_parts.append(word_doc[:m][ok])
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    for d in np.flatnonzero((counts > 0) & (counts < n) & (counts >= min_words)):  # fewer words than n: one shingle of all
        acc = int(word[first[d]])
        for k in range(1, counts[d]):
            acc = (acc * int(_WORD_MUL) + int(word[first[d] + k])) & 0xFFFFFFFFFFFFFFFF
        h_parts.append(np.array([acc], np.uint64))
        d_parts.append(np.array([d]))
    if not h_parts:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    h = np.concatenate(h_parts)
    d = np.concatenate(d_parts).astype(np.int64)
    order = np.argsort(d, kind="stable")
    return fmix64(h[order]), d[order]


def permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = (rng.integers(0, 1 << 32, num_perm, dtype=np.uint64) | _U64(1)).astype(np.uint32)
    b = rng.integers(0, 1 << 32, num_perm, dtype=np.uint64).astype(np.uint32)
    return a, b


def minhash(hashes: np.ndarray, doc: np.ndarray, ndocs: int, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(signatures uint32 (docs with shingles, num_perm), which docs they are)."""
    if len(hashes) == 0:
        return np.zeros((0, len(a)), np.uint32), np.zeros(0, np.int64)
    x = (hashes >> _U64(32)).astype(np.uint32)
    starts = np.flatnonzero(np.r_[True, doc[1:] != doc[:-1]])
    docs = doc[starts]
    out = np.empty((len(a), len(starts)), np.uint32)
    v = np.empty_like(x)
    for j in range(len(a)):
        np.multiply(x, a[j], out=v)
        np.add(v, b[j], out=v)
        out[j] = np.minimum.reduceat(v, starts)
    return np.ascontiguousarray(out.T), docs


def band_buckets(sig: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(docs, bands) uint64 bucket keys; equal keys mean equal band values (whp)."""
    out = np.empty((sig.shape[0], bands), np.uint64)
    for j in range(bands):
        h = np.full(sig.shape[0], (j * 0x9E3779B97F4A7C15 + 1) % (1 << 64), np.uint64)
        for c in range(j * rows, (j + 1) * rows):
            h ^= sig[:, c].astype(np.uint64)
            h *= _U64(0x100000001B3)
            h = fmix64(h)
        out[:, j] = h
    return out


def shingle_set(text: str, n: int, options=("case", "punctuation", "digits")) -> np.ndarray:
    """Sorted unique shingle hashes of one text (for verification)."""
    h, _ = shingles([text], n, options)
    return np.unique(h)


def shingle_sets(texts: list[str], n: int, options=("case", "punctuation", "digits"),
                 chunk_bytes: int = 1 << 20) -> list[np.ndarray]:
    """`shingle_set` of every text, a batch at a time (one fold and shingle pass per ~1 MB
    of text instead of one per text: fuzzy verify's texts are short and many)."""
    out: list[np.ndarray] = []
    i = 0
    while i < len(texts):
        j, size = i, 0
        while j < len(texts) and (j == i or size + len(texts[j]) <= chunk_bytes):
            size += len(texts[j])
            j += 1
        h, d = shingles(texts[i:j], n, options)
        order = np.lexsort((h, d))
        h, d = h[order], d[order]
        first = np.ones(len(h), bool)
        first[1:] = (h[1:] != h[:-1]) | (d[1:] != d[:-1])
        h, d = h[first], d[first]
        bounds = np.searchsorted(d, np.arange(j - i + 1))
        out += [h[bounds[k]:bounds[k + 1]] for k in range(j - i)]
        i = j
    return out


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Jaccard similarity of two sorted unique hash arrays."""
    if len(a) == 0 and len(b) == 0:
        return 1.0
    inter = len(np.intersect1d(a, b, assume_unique=True))
    return inter / (len(a) + len(b) - inter)


_PARA = re.compile(r"\n[ \t\r\f\v]*\n\s*")
_LINE = re.compile(r"\n")


def segments(text: str, unit: str) -> list[tuple[int, int]]:
    """[start, end) spans of the paragraphs (split on blank lines) or lines of a text,
    each span including the separator after it."""
    pat = _PARA if unit == "paragraph" else _LINE
    out, pos = [], 0
    for m in pat.finditer(text):
        out.append((pos, m.end()))
        pos = m.end()
    if pos < len(text):
        out.append((pos, len(text)))
    return out
