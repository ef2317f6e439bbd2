"""Rewriters per kind of text: docs/s and MB/s per core, against a peer where there is one.

    python -m bench.rewrite [--docs 800]

Each rewriter is timed through the filter's `apply` on an Arrow batch, as the filter step
calls it (reading the column, rewriting, change counts). The peer of `ftfy` is datatrove's
`FTFYFormatter` with the same ftfy options (its `format` per document); the peer of `pii` is
datatrove's `PIIFormatter`, which does less (emails and IPv4, no phones, no IPv6, no
context checks: its output differs by design), and with presidio-analyzer installed a
`pii:presidio` row times the same rewriter on Presidio's recognizers (`engine: presidio`),
its ratio the built-in engine's speed over Presidio's; the others have no peer in datatrove 0.10
(its `SymbolLinesFormatter` is another rule), so their rows give speed only. Kinds come from bench/textkinds.py (none used by a test); a quarter of each
kind's documents get mojibake planted so that ftfy has work to do. Not a test: timings
never gate CI.
"""

from __future__ import annotations

import argparse
import importlib.util
import random

import pyarrow as pa

from bench.lid import best_of


def plant(texts: list[str], seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [t.encode("utf-8").decode("cp1252", errors="replace") if rng.random() < 0.25 else t for t in texts]


def main(argv=None):
    from bench import textkinds
    from filters import base

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=800, help="documents of each kind")
    args = ap.parse_args(argv)
    kinds = textkinds.build(args.docs)
    words = "/tmp/curate-bench-flagged.txt"
    with open(words, "w") as f:
        f.write("casino\nviagra\nfree money\nclick here\nbuy now\n")
    rewriters = {
        "ftfy": {"type": "ftfy", "fix_latin_ligatures": False, "fix_character_width": False, "uncurl_quotes": False,
                 "fix_line_breaks": False, "normalization": None},  # datatrove's defaults
        "line_remover": {"type": "line_remover", "remove_repeated_lines": True, "min_edge_words": 3},
        "regex_replace": {"type": "regex_replace", "pattern": r"\b\d{3}[-.]\d{3}[-.]\d{4}\b", "replacement": "<PHONE>"},
        "flagged_words": {"type": "flagged_words", "words_file": words},
        "pii": {"type": "pii"},
    }
    print(f"{'kind':<22} {'rewriter':<14} {'docs/s':>9} {'MB/s':>6} {'peer docs/s':>12} {'ratio':>6} {'changed':>8}")
    for kind, texts in kinds.items():
        texts = plant(texts)
        mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
        batch = pa.record_batch({"id": [str(i) for i in range(len(texts))], "text": texts})
        for name, p in rewriters.items():
            flt = base.build(base.parse_params(p))
            t = best_of(lambda flt=flt: flt.apply(batch))
            res = flt.apply(batch)
            changed = sum(1 for x in (res.texts or []) if x is not None) if res.texts is not None else int((~res.keep).sum())
            peer = ratio = ""
            if name == "ftfy":
                from datatrove.pipeline.formatters import FTFYFormatter

                dt = FTFYFormatter()
                tp = best_of(lambda: [dt.format(x) for x in texts])
                same = all((n if n is not None else o) == dt.format(o) for n, o in zip(res.texts, texts, strict=True))
                peer, ratio = f"{len(texts) / tp:,.0f}", f"{tp / t:.2f}x" + ("" if same else " (DIFFER)")
            if name == "pii":  # datatrove's PIIFormatter: emails and IPv4 only (no phones, no IPv6, no context checks)
                from datatrove.pipeline.formatters import PIIFormatter

                dt = PIIFormatter()
                tp = best_of(lambda: [dt.format(x) for x in texts])
                peer, ratio = f"{len(texts) / tp:,.0f}", f"{tp / t:.2f}x"
            print(f"{kind:<22} {name:<14} {len(texts) / t:>9,.0f} {mb / t:>6.1f} {peer:>12} {ratio:>6} {changed:>8}")
            if name == "pii" and importlib.util.find_spec("presidio_analyzer"):  # Presidio's recognizers as the engine
                pres = base.build(base.parse_params({**p, "engine": "presidio"}))
                tp = best_of(lambda pres=pres: pres.apply(batch))
                got = pres.apply(batch)
                n_pres = sum(1 for x in (got.texts or []) if x is not None)
                print(f"{kind:<22} {'pii:presidio':<14} {len(texts) / tp:>9,.0f} {mb / tp:>6.1f} {'(curate pii)':>12} "
                      f"{tp / t:>5.2f}x {n_pres:>8}")


if __name__ == "__main__":
    main()
