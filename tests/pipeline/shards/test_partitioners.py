"""Every partitioner the project uses is balanced on keys of its real kind (issue 70): 10^6
keys made as the steps make them (text hashes, gids, LSH band keys, pairs of gids, k-means
cluster numbers, id hashes, mixture order keys), through each step's own partition
function; the largest partition holds at most 1.5x the mean, at 8 and at 256 partitions.
(Rows follow their keys: a bucket's or a cluster's rows are one reducer's. Keys that many
rows share, a templated page's band, are cut into blocks first: tests/pipeline/steps/dedup
/test_salt.py.)
Semantic dedup once sent every row to partition 0: cluster numbers are small integers, and
a partition was a key's top 32 bits."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash

from pipeline.mixing import budget
from pipeline.shards import shuffle, text
from pipeline.steps.dedup import components, fuzzy, semantic
from pipeline.steps.ingest import idindex

N = 1_000_000


def _gids(n: int) -> np.ndarray:
    """n gids as ingest numbers them: 3 sources, shards of 5,000 rows, rows in order."""
    k = np.arange(n)
    return shuffle.gid(k % 3, (k // 3) // 5000, (k // 3) % 5000)


def _text_hashes(n: int) -> np.ndarray:
    """The exact and paragraph maps' h1: the high 64 bits of xxh3-128 of a normalised text."""
    return np.array([xxhash.xxh3_128_intdigest(f"document {i} of the crawl".encode()) >> 64 for i in range(n)], np.uint64)


def _clusters(n: int) -> np.ndarray:
    """n k-means cluster numbers (semantic dedup's keys: a cluster is one key, its rows go
    with it), as the centroids number them: 0 .. n - 1."""
    return np.arange(n, dtype=np.int64)


def _band_keys(n: int) -> np.ndarray:
    """LSH band keys from real MinHash signatures of n / 14 documents of 60 random words
    (a vocabulary of 20,000), 14 bands of 8 rows."""
    docs = n // 14
    rng = np.random.default_rng(3)
    words = rng.integers(0, 20_000, size=(docs, 60))
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = ["".join(letters[np.random.default_rng(i).integers(0, 26, 6)]) for i in range(20_000)]  # no digits: folded
    texts = [" ".join(vocab[x] for x in row) for row in words]
    h, d = text.shingles(texts, 5)
    a, b = text.permutations(112, 0)
    sig, _ = text.minhash(h, d, len(texts), a, b)
    return text.band_buckets(sig, 14, 8).ravel()


PARTITIONERS = {
    "exact and paragraph maps (text hashes)": lambda n: shuffle.partition_of(_text_hashes(N), n),
    "fuzzy buckets (band keys)": lambda n: fuzzy.partitions_of(_band_keys(N), np.zeros(N, np.uint64), n, None),
    "fuzzy verify (pairs of gids)": lambda n: fuzzy.pair_partition(_gids(N), _gids(N)[::-1].copy(), n),
    "components (node gids)": lambda n: components._part(_gids(N), n),
    "semantic reduce (cluster numbers)": lambda n: semantic.partition(_clusters(N), n),
    "ids and id index (id hashes)": lambda n: idindex.range_of(idindex.id_hash([f"id-{i}" for i in range(N)]), n),
    "mixture shards (order keys)": lambda n: (budget.order_key(0, "web", [f"d{i}" for i in range(N)], 0) % np.uint64(n)).astype(np.int64),
}


@pytest.mark.parametrize("name", sorted(PARTITIONERS))
@pytest.mark.parametrize("nparts", [8, 256])
def test_the_largest_partition_holds_at_most_one_and_a_half_times_the_mean(name, nparts):
    part = PARTITIONERS[name](nparts)
    assert len(part) >= N * 0.99 and part.min() >= 0 and part.max() < nparts
    counts = np.bincount(part, minlength=nparts)
    assert counts.max() <= 1.5 * counts.mean(), (name, nparts, counts.max() / counts.mean())
