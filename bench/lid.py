"""Language ID: Curate's `language` filter against fastText's own predict loop, per kind of text.

    python -m bench.lid [--docs 800]

The floor is fastText itself on the same model (lid.176.ftz) and the same texts, newlines
already replaced (fastText refuses them), in its tightest loop: the C++ batch call
`multilinePredict(texts, k=1)`, or one `predict` per text, whichever is faster. Curate is
timed through the filter's `apply` on an Arrow batch (reading the column, replacing
newlines, predicting, decisions and score columns), as the filter step calls it; the
prefix option (`max_chars`) is shown beside it with its agreement with whole-text labels.
datatrove's `LanguageFilter` (one `predict` per document through its own wrapper) is
measured too. Not a test: timings never gate CI.
"""

from __future__ import annotations

import argparse
import time

import pyarrow as pa


def best_of(f, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv=None):
    from bench import textkinds
    from filters import base, models
    from filters.language import load_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=800, help="documents of each kind")
    ap.add_argument("--prefix", type=int, default=2000, help="max_chars for the prefix option")
    args = ap.parse_args(argv)
    model = load_model(str(models.lid176_path()))
    f = model.f
    ours = base.build(base.parse_params({"type": "language", "languages": ["en"]}))
    pre = base.build(base.parse_params({"type": "language", "languages": ["en"], "max_chars": args.prefix}))
    try:
        import datatrove.utils.lid as lid
        from datatrove.data import Document
        from datatrove.pipeline.filters import LanguageFilter

        lid.FT176LID.MODEL_URL = str(models.lid176_path())
        dt = LanguageFilter(languages=["en"], language_threshold=0.65)
    except ImportError:  # pragma: no cover
        dt = None
    print("| kind | docs | KB/doc | fastText floor docs/s | Curate docs/s | Curate / floor | prefix docs/s | prefix same label | datatrove docs/s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    worst = None
    for kind, texts in textkinds.build(args.docs).items():
        flat = [t.replace("\n", " ") + "\n" for t in texts]
        batch = pa.RecordBatch.from_pydict({"id": [str(i) for i in range(len(texts))], "text": texts})
        ours.apply(batch)
        t_batch = best_of(lambda: f.multilinePredict(flat, 1, 0.0, "strict"))
        t_loop = best_of(lambda: [f.predict(t, 1, 0.0, "strict") for t in flat])
        floor = min(t_batch, t_loop)
        t_ours = best_of(lambda: ours.apply(batch))
        t_pre = best_of(lambda: pre.apply(batch))
        full_lang = ours.apply(batch).scores["lang"].to_pylist()
        pre_lang = pre.apply(batch).scores["lang"].to_pylist()
        same = sum(a == b for a, b in zip(full_lang, pre_lang)) / len(texts)
        t_dt = best_of(lambda: [dt.filter(Document(text=t, id=str(i))) for i, t in enumerate(texts)], 1) if dt else float("nan")
        n = len(texts)
        kb = sum(len(t.encode()) for t in texts) / n / 1e3
        ratio = t_ours / floor
        worst = max(worst or (ratio, kind), (ratio, kind))
        print(f"| {kind} | {n:,} | {kb:.1f} | {n / floor:,.0f} | {n / t_ours:,.0f} | **{ratio:.2f}x** | {n / t_pre:,.0f} | "
              f"{same:.2%} | {n / t_dt:,.0f} |", flush=True)
    print(f"worst kind: {worst[1]}, Curate's filter at {worst[0]:.2f}x fastText's own loop (target <= 1.5x)")


if __name__ == "__main__":
    main()
