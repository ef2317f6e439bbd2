"""Document embedding speed per core, Curate's WordLlama backend beside WordLlama's own,
on the five kinds of text of bench/textkinds.py:

- **floor**: WordLlama's tokenizer alone (`encode_batch` of the texts, no padding, one
  thread): no embedding can be faster than tokenizing;
- **Curate**: `filters.embeddings.embed("wordllama", texts)` (each text's tokens cut at
  `max_tokens`, pooled as one sparse count matrix times the weights);
- **WordLlama** 0.4: `WordLlama.load(...).embed(texts, norm=True)` (batches of 64 padded to
  their longest text), on the same shipped weights. It has no token cap, so for a fair
  comparison Curate runs here with `max_tokens` large enough to cut nothing
  (`--max-tokens`, default 10^9), and the largest difference between the two vectors is
  printed.

CPU seconds of this process (tokenizers may use threads: RAYON_NUM_THREADS=1 is set), MB
of text per CPU second. The worst kind is the one to quote.

    python -m bench.embed [--docs 800] [--repeat 3]

Not a test: nothing here gates CI.
"""

from __future__ import annotations

import os

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # before tokenizers loads: one core, as a Ray task has

import argparse  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402


def _cpu(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=800, help="documents per kind")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each; the fastest counts")
    ap.add_argument("--max-tokens", type=int, default=10**9, help="Curate's token cap (default: none in effect)")
    a = ap.parse_args(argv)

    import wordllama
    from wordllama import WordLlama

    from bench import textkinds
    from filters import embeddings

    wl = WordLlama.load(cache_dir=Path(wordllama.__file__).parent, disable_download=True)
    tok, _ = embeddings.loaded("wordllama")
    kinds = textkinds.build(a.docs)
    print("| kind | docs | MB | tokens / doc | floor (tokenizer) MB/s | Curate MB/s | WordLlama embed MB/s | "
          "Curate / WordLlama | Curate / floor | max abs difference |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    worst = None
    for kind, texts in kinds.items():
        mb = sum(len(t.encode()) for t in texts) / 1e6
        ntok = sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)) / len(texts)
        floor = _cpu(lambda: tok.encode_batch(texts, add_special_tokens=False), a.repeat)
        ours = _cpu(lambda: embeddings.embed("wordllama", texts, a.max_tokens), a.repeat)
        with np.errstate(invalid="ignore"):
            theirs = _cpu(lambda: wl.embed(texts, norm=True), a.repeat)
            diff = np.abs(embeddings.embed("wordllama", texts, a.max_tokens) - np.nan_to_num(wl.embed(texts, norm=True))).max()
        ratio = theirs / ours
        worst = min(worst or (ratio, kind), (ratio, kind))
        print(f"| {kind} | {len(texts):,} | {mb:.2f} | {ntok:,.0f} | {mb / floor:.2f} | {mb / ours:.2f} | {mb / theirs:.2f} | "
              f"{ratio:.2f}x | {floor / ours:.2f} | {diff:.1e} |")
    print(f"\nworst kind for Curate against WordLlama's own embed: {worst[1]} ({worst[0]:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
