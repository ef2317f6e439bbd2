"""Heuristic filter chain: datatrove vs Curate, one core, same documents, same run.

    python -m bench.filters [--docs 800] [--kinds K,..] [--per-filter] [--profile]

The chain is the one FineWeb's pipeline runs, in its order: Gopher repetition -> Gopher quality ->
C4 quality (filter_no_terminal_punct=False) -> FineWeb quality; a document leaves the
chain at its first failing filter. The documents are `--docs` of each kind in
bench/textkinds.py (wiki pages, technical docs, code, non-English prose, short texts and
spam), none of which a test uses; the worst kind is printed last. Each kind starts with
the word caches of the kinds before it (one process), as a worker's later shards do.

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
import time

import numpy as np
import pyarrow as pa


def run_datatrove(texts: list[str]) -> tuple[float, list[bool]]:
    from datatrove.data import Document
    from datatrove.pipeline.filters import C4QualityFilter, FineWebQualityFilter, GopherQualityFilter, GopherRepetitionFilter

    chain = [GopherRepetitionFilter(), GopherQualityFilter(), C4QualityFilter(filter_no_terminal_punct=False), FineWebQualityFilter()]
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
    from pipeline.steps.filter import BATCH_ROWS, filter_batch

    specs = [("gopher_repetition", {}), ("gopher_quality", {}), ("c4_quality", {"filter_no_terminal_punct": False}),
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
        kept += filter_batch(batch, filters, stages).column("keep").to_pylist()
    return time.perf_counter() - t0, kept


def per_filter_agreement(texts: list[str]) -> dict[str, float]:
    """Each filter alone on every document, datatrove's against Curate's (conformance)."""
    from datatrove.data import Document
    from datatrove.pipeline.filters import C4QualityFilter, FineWebQualityFilter, GopherQualityFilter, GopherRepetitionFilter

    from filters import base

    pairs = [("gopher_quality", GopherQualityFilter(), {}), ("gopher_repetition", GopherRepetitionFilter(), {}),
             ("c4_quality", C4QualityFilter(filter_no_terminal_punct=False), {"filter_no_terminal_punct": False}),
             ("fineweb_quality", FineWebQualityFilter(), {})]
    table = pa.table({"id": [str(i) for i in range(len(texts))], "text": texts})
    out = {}
    for name, dt, params in pairs:
        ours = base.build(base.parse_params({"type": name, **params}))
        k_cu = np.concatenate([ours.apply(b).keep for b in table.to_batches(max_chunksize=1024)])
        k_dt = []
        for i, t in enumerate(texts):
            r = dt.filter(Document(text=t, id=str(i)))
            k_dt.append(bool(r[0] if isinstance(r, tuple) else r))
        out[name] = float(np.mean(np.array(k_dt) == k_cu))
    return out


def main(argv=None):
    from bench import textkinds

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=800, help="documents of each kind")
    ap.add_argument("--kinds", default=",".join(textkinds.KINDS), help="comma-separated kinds (bench/textkinds.py)")
    ap.add_argument("--per-filter", action="store_true", help="also each filter alone, datatrove against Curate")
    ap.add_argument("--profile", action="store_true",
                    help="print where Curate's time goes on each kind (a second pass: the word caches are warm)")
    args = ap.parse_args(argv)
    kinds = textkinds.build(args.docs)
    print("| kind | docs | KB/doc | datatrove docs/s | Curate docs/s | Curate MB/s | ratio | same final decision |"
          + (" per filter (GQ, GR, C4, FW) |" if args.per_filter else ""))
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |" + (" --- |" if args.per_filter else ""))
    worst = None
    for kind in args.kinds.split(","):
        texts = kinds[kind]
        mb = sum(len(t.encode()) for t in texts) / 1e6
        # warm both (spaCy and our rules load once per process; a run pays that once per worker)
        run_datatrove(texts[:20])
        run_curate(texts[:20])
        t_dt, k_dt = run_datatrove(texts)
        t_cu, k_cu = run_curate(texts)
        agree = sum(a == b for a, b in zip(k_dt, k_cu)) / len(texts)
        ratio = t_dt / t_cu
        worst = min(worst or (ratio, kind), (ratio, kind))
        extra = ""
        if args.per_filter:
            extra = " " + ", ".join(f"{v:.2%}" for v in per_filter_agreement(texts).values()) + " |"
        print(f"| {kind} | {len(texts):,} | {1e3 * mb / len(texts):.1f} | {len(texts) / t_dt:,.0f} | {len(texts) / t_cu:,.0f} | "
              f"{mb / t_cu:.2f} | **{ratio:.1f}x** | {agree:.2%} |" + extra, flush=True)
        if args.profile:
            pr = cProfile.Profile()
            pr.enable()
            run_curate(texts)
            pr.disable()
            s = io.StringIO()
            pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(14)
            print(s.getvalue())
    print(f"worst kind: {worst[1]} at {worst[0]:.1f}x datatrove (one core, in process)")


if __name__ == "__main__":
    main()
