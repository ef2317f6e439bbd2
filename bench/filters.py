"""Heuristic filter chain: datatrove vs Curate, one core, same documents, same run.

    python -m bench.filters [--docs 3000] [--profile]

The chain is the one FineWeb-style pipelines run: Gopher quality -> Gopher repetition ->
C4 quality (filter_no_terminal_punct=False) -> FineWeb quality; a document leaves the
chain at its first failing filter. The corpus is built from the demo generator (real
Wikipedia text in crawl-like pages, spam, copies), with article pages lengthened to about
2.7 KB as in datatrove's measured figure.

datatrove is timed calling each filter's `filter()` directly, without its executor or
stats overhead (the most favourable way to run it). Curate is timed through the filter
step's own batch path (pipeline/steps/filter.py), as a run uses it. datatrove's C4 filter
also rewrites the kept text before FineWeb sees it; Curate's decides only, so the final
decisions are compared and their agreement printed beside the speed. Not a test: timings
never gate CI.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import random
import time

import pyarrow as pa


def corpus(n_docs: int, seed: int = 1) -> list[str]:
    from pipeline import demo_data
    from tests.conftest import WHEEL_DIR  # the wheel cache `make` fills

    wiki = demo_data.wiki_records(demo_data._wheel(WHEEL_DIR))["en"]
    rng = random.Random(seed)
    pages = demo_data.web_records(wiki, n_docs, seed=seed)
    out = []
    for p in pages:
        text = p["text"]
        if p["kind"] in ("article", "near_copy", "exact_copy"):
            while len(text) < 2700:
                text += "\n\n" + rng.choice(wiki)["text"]
        out.append(text)
    return out


def run_datatrove(texts: list[str]) -> tuple[float, list[bool]]:
    from datatrove.data import Document
    from datatrove.pipeline.filters import C4QualityFilter, FineWebQualityFilter, GopherQualityFilter, GopherRepetitionFilter

    chain = [GopherQualityFilter(), GopherRepetitionFilter(), C4QualityFilter(filter_no_terminal_punct=False), FineWebQualityFilter()]
    kept = []
    t0 = time.perf_counter()
    for i, text in enumerate(texts):
        doc = Document(text=text, id=str(i))
        ok = True
        for f in chain:
            r = f.filter(doc)
            if not (r[0] if isinstance(r, tuple) else r):
                ok = False
                break
        kept.append(ok)
    return time.perf_counter() - t0, kept


def run_curate(texts: list[str]) -> tuple[float, list[bool]]:
    from filters import base
    from pipeline.steps.filter import BATCH_ROWS, _filter_batch

    specs = [("gopher_quality", {}), ("gopher_repetition", {}), ("c4_quality", {"filter_no_terminal_punct": False}),
             ("fineweb_quality", {})]
    filters = [(name, base.build(base.parse_params({"type": name, **p}))) for name, p in specs]
    n = len(texts)
    table = pa.table({"id": [str(i) for i in range(n)], "text": texts, "metadata": [None] * n,
                      "n_chars": [len(t) for t in texts], "n_tokens": [0] * n})
    stages = {name: {"docs_in": 0, "docs_out": 0, "chars_in": 0, "chars_out": 0, "tokens_in": 0, "tokens_out": 0, "removed": {}}
              for name, _ in filters}
    kept = []
    t0 = time.perf_counter()
    for batch in table.to_batches(max_chunksize=BATCH_ROWS):
        kept += _filter_batch(batch, filters, stages).column("keep").to_pylist()
    return time.perf_counter() - t0, kept


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=3000)
    ap.add_argument("--profile", action="store_true", help="print where Curate's time goes")
    args = ap.parse_args(argv)
    texts = corpus(args.docs)
    mb = sum(len(t.encode()) for t in texts) / 1e6
    print(f"corpus: {len(texts):,} documents, {mb:.1f} MB, {1e6 * mb / len(texts):,.0f} bytes/doc on average")
    # warm both (spaCy and our rules load once per process; a run pays that once per worker)
    run_datatrove(texts[:20])
    run_curate(texts[:20])
    t_dt, k_dt = run_datatrove(texts)
    t_cu, k_cu = run_curate(texts)
    agree = sum(a == b for a, b in zip(k_dt, k_cu)) / len(texts)
    print(f"{'':<10} {'docs/s/core':>12} {'MB/s/core':>10} {'kept':>7}")
    print(f"{'datatrove':<10} {len(texts) / t_dt:>12,.0f} {mb / t_dt:>10.2f} {sum(k_dt):>7,}")
    print(f"{'curate':<10} {len(texts) / t_cu:>12,.0f} {mb / t_cu:>10.2f} {sum(k_cu):>7,}")
    print(f"ratio curate/datatrove: {t_dt / t_cu:.1f}x; final decisions agree on {agree:.2%} of documents")
    if args.profile:
        from filters.words import split_into_words

        split_into_words.cache_clear()
        pr = cProfile.Profile()
        pr.enable()
        run_curate(texts)
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(12)
        print(s.getvalue())


if __name__ == "__main__":
    main()
