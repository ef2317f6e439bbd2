"""Semantic dedup's recall and collateral against its cosine threshold, per kind of text,
on planted copies: the curve the default `dedup.semantic.threshold` is chosen from.

Corpus: `--docs` documents of each of bench/textkinds.py's five kinds, pooled. A third of
each kind gets a planted copy, a third of those each way:

- **word edits**: a tenth of the words replaced by random words of the same kind's text;
- **substitutions**: a quarter of the words replaced (a heavier edit);
- **reorders**: the lines (or sentences, for one-line texts) shuffled.

The decisions are Curate's own code on the pooled embeddings (filters/embeddings.py,
pipeline/shards/kmeans.py's spherical k-means with the stage's default cluster count,
pipeline/steps/dedup/semantic.py's `duplicates` in priority order), in this process.
Recall: planted pairs of which at least one member is removed. Collateral:
documents removed that have neither a planted partner nor a lexical one (word 5-gram
Jaccard >= 0.5 with another document, e.g. the spam kind's templates, or tf-idf word
vectors at cosine >= 0.8, e.g. pages drawn from one message catalogue), as a share of such documents.

    python -m bench.semdedup [--docs 600] [--thresholds 0.9,0.93,0.95,0.96,0.97,0.98,0.99] [--containment 0.5]

Not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import math
import random
import re

import numpy as np
import xxhash


def _edit(text: str, frac: float, vocab: list[str], rng: random.Random) -> str:
    """`frac` of the text's words (\\w+ runs) replaced by random words of its kind, the
    whitespace and punctuation between them kept. (Before, space-separated tokens were
    replaced: in code one such token spans several words and lines, so a "tenth" was a far
    heavier edit there than in prose.)"""
    parts = re.split(r"(\w+)", text)  # odd positions are the words
    words = list(range(1, len(parts), 2))
    for _ in range(max(1, int(len(words) * frac)) if words else 0):
        parts[words[rng.randrange(len(words))]] = rng.choice(vocab)
    return "".join(parts)


def _reorder(text: str, rng: random.Random) -> str:
    parts = text.split("\n") if text.count("\n") >= 2 else re.split(r"(?<=[.!?]) ", text)
    if len(parts) < 2:
        words = text.split(" ")
        half = len(words) // 2
        return " ".join(words[half:] + words[:half])
    rng.shuffle(parts)
    return ("\n" if text.count("\n") >= 2 else " ").join(parts)


def _shingles(t: str) -> set:
    w = re.findall(r"\w+", t.lower())
    return {xxhash.xxh3_64_intdigest(" ".join(w[i : i + 5])) for i in range(max(1, len(w) - 4))}


def lexical_partners(texts: list[str], jaccard: float = 0.5, words: float = 0.8,
                     containment: float | None = None) -> np.ndarray:
    """Which documents have a lexical partner: another document at word 5-gram Jaccard >=
    `jaccard`, or whose tf-idf word vectors are at cosine >= `words` (pages drawn from one small
    vocabulary: the spam kind's word soups, the message catalogues of the non-English kind);
    with `containment`, also a pair sharing that share of the smaller one's 5-grams (two
    overlapping windows of one long text: Jaccard stays low when one is much larger)."""
    from scipy import sparse
    from sklearn.feature_extraction.text import TfidfVectorizer

    sets = [_shingles(t) for t in texts]
    index: dict[int, list[int]] = {}
    for i, s in enumerate(sets):
        for h in s:
            index.setdefault(h, []).append(i)
    out = np.zeros(len(texts), bool)
    for i, s in enumerate(sets):
        counts: dict[int, int] = {}
        for h in s:
            for j in index[h]:
                if j != i:
                    counts[j] = counts.get(j, 0) + 1
        out[i] = any(c / (len(s) + len(sets[j]) - c) >= jaccard
                     or (containment is not None and c / max(1, min(len(s), len(sets[j]))) >= containment)
                     for j, c in counts.items())
    bag = TfidfVectorizer(token_pattern=r"(?u)\b\w+\b", sublinear_tf=True).fit_transform(texts)
    sims = (bag @ bag.T).tocsr()
    sims.setdiag(0)
    out |= np.asarray(sparse.csr_matrix(sims >= words).sum(axis=1)).ravel() > 0
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=600, help="documents per kind before the planted copies")
    ap.add_argument("--thresholds", default="0.9,0.93,0.95,0.96,0.97,0.98,0.99,0.995")
    ap.add_argument("--center", action="store_true", help="subtract the corpus's mean vector before cosines")
    ap.add_argument("--residual", action="store_true", help="cosines of the members without their centroid's direction")
    ap.add_argument("--docs-per-cluster", type=int, default=0, help="clusters: one per this many documents (default: the stage's)")
    ap.add_argument("--containment", type=float, default=None, help="also count as lexical partners two documents "
                    "sharing this share of the smaller one's word 5-grams (e.g. 0.5: overlapping windows of one text)")
    ap.add_argument("--overlaps", default="none", help="min_overlap values to try (none: cosine alone), e.g. none,0.3,0.5")
    a = ap.parse_args(argv)

    from bench import textkinds
    from filters import embeddings
    from pipeline.shards import kmeans
    from pipeline.steps.dedup import plan as dedup_plan
    from pipeline.steps.dedup.semantic import duplicates, sketches

    rng = random.Random(3)
    texts, kind_of, partner, how = [], [], [], []
    for kind, docs in textkinds.build(a.docs).items():
        vocab = [w for t in docs for w in re.findall(r"\w+", t)][:50_000]
        base = len(texts)
        texts += docs
        # the non-English kind alternates French and Spanish Wikipedia pages with pages of one language's Sphinx
        # messages drawn at random (textkinds.non_english: pool i % 11): report the two apart
        pools = 2 + len(textkinds.PO_LANGS)
        kind_of += [f"{kind}: {'wiki' if j % pools < 2 else 'message soups'}" if kind == "non-English prose" else kind
                    for j in range(len(docs))]
        partner += [-1] * len(docs)
        how += [""] * len(docs)
        for j in range(0, len(docs), 3):
            edit = ("word edits", "substitutions", "reorders")[(j // 3) % 3]
            t = docs[j]
            copy = (_edit(t, 0.1, vocab, rng) if edit == "word edits" else
                    _edit(t, 0.25, vocab, rng) if edit == "substitutions" else _reorder(t, rng))
            partner[base + j] = len(texts)
            texts.append(copy)
            kind_of.append(kind_of[base + j])
            partner.append(base + j)
            how.append(edit)
    partner = np.array(partner)
    kind_of = np.array(kind_of)
    how = np.array(how)
    lexical = lexical_partners(texts, containment=a.containment)
    x = embeddings.embed("wordllama", texts).astype(np.float32)
    if a.center:
        x = kmeans.unit(x - x.mean(axis=0))
    n = len(texts)
    order = np.array(sorted(range(n), key=lambda i: xxhash.xxh3_64_intdigest(f"order:{i}")))  # unrelated to planting
    k = max(1, min(math.ceil(n / (a.docs_per_cluster or dedup_plan.SEMANTIC_DOCS_PER_CLUSTER)),
                   n // dedup_plan.SEMANTIC_SAMPLE_PER_CLUSTER))
    c = kmeans.kmeans(kmeans.unit(x.copy()), k, 0)
    cl = kmeans.nearest(x, c)
    thresholds = [float(t) for t in a.thresholds.split(",")]
    overlaps = [None if o == "none" else float(o) for o in a.overlaps.split(",")]
    sk = sketches(texts)
    print(f"{n:,} documents ({a.docs} per kind plus {int((partner >= 0).sum() / 2):,} planted copies), {k} clusters; "
          f"{int(lexical.sum()):,} with a lexical partner; documents without one per kind: "
          f"{ {kd: int(((partner < 0) & ~lexical & (kind_of == kd)).sum()) for kd in dict.fromkeys(kind_of.tolist())} }\n")
    kinds = list(dict.fromkeys(kind_of.tolist()))
    print("| threshold | min_overlap | " + " | ".join(f"recall: {e}" for e in ("word edits", "substitutions", "reorders"))
          + " | " + " | ".join(f"collateral: {kd}" for kd in kinds) + " | collateral, all |")
    print("| ---: | ---: |" + " ---: |" * (3 + len(kinds) + 1))
    for thr, ov in [(t, o) for o in overlaps for t in thresholds]:
        removed = np.zeros(n, bool)
        dup_of = np.full(n, -1)
        for cid in range(k):
            members = order[cl[order] == cid]
            v = x[members]
            if a.residual:  # each member without its cluster centroid's direction
                v = v - (v @ c[cid])[:, None] * c[cid][None, :]
            gone, best, _ = duplicates(v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12), thr,
                                       sk[members], ov)
            removed[members[gone]] = True
            dup_of[members[gone]] = members[best[gone]]
        found = removed | removed[np.maximum(partner, 0)]  # a planted pair is found when one of it is removed
        planted = (partner >= 0) & (how != "")
        rec = [found[planted & (how == e)].mean() for e in ("word edits", "substitutions", "reorders")]
        alone = (partner < 0) & ~lexical
        coll = [removed[alone & (kind_of == kd)].mean() if (alone & (kind_of == kd)).any() else float("nan") for kd in kinds]
        print(f"| {thr:.3f} | {'-' if ov is None else ov} | " + " | ".join(f"{r:.3f}" for r in rec) + " | " + " | ".join(f"{v:.3f}" for v in coll)
              + f" | {removed[alone].mean():.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
