"""Filters per detected language (per_language: fineweb2) on a mixture of 17 languages.

    python -m bench.languages [--docs 300]

Texts: Wikipedia summaries in English, Spanish and French (the demo corpus, data/demo,
real prose) and, for nine more languages (de, it, nl, pl, ru, cs, uk, el, da), documents of
real words of the language in random order from Faker's word lists (`pip install faker`:
no prose of these languages ships in an installed package here; Gopher's and FineWeb's rules
read words, lines and punctuation, which these have), and Chinese, Thai, Vietnamese,
Japanese and Korean from the paragraphs written for tests/filters/test_segmenters.py (their
words cut by jieba, PyThaiNLP, pyvi, SudachiPy and Kiwi, as datatrove cuts them). Each document is labelled by lid.176
as the chain does; per language it prints:

- the share of its documents each filter removes with FineWeb-2's thresholds for the
  language (`per_language: fineweb2`) and with one English set (the defaults);
- the agreement of each routed filter's decisions with datatrove's own filter given the same
  per-language parameters, as FineWeb-2's `fineweb-2-pipeline.py` calls them (its word
  tokenizer for the language included): the target is >= 99.5% per language;
- the filter chain's CPU with routing against without, on the same documents (the target:
  within 1.1x; the work differs only by each language's own thresholds and word rules).
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
FAKER = {"de": "de_DE", "it": "it_IT", "nl": "nl_NL", "pl": "pl_PL", "ru": "ru_RU", "cs": "cs_CZ", "uk": "uk_UA",
         "el": "el_GR", "da": "da_DK"}
TYPES = ("gopher_repetition", "fineweb_quality", "gopher_quality")


def corpus(n: int, seed: int = 0) -> dict[str, list[str]]:
    rng = random.Random(seed)
    out = {}
    for lang in ("en", "es", "fr"):
        summ = pq.read_table(ROOT / "data" / "demo" / "wiki" / f"summaries_{lang}.parquet", columns=["text"]).column("text").to_pylist()
        out[lang] = ["\n\n".join(rng.sample(summ, rng.randint(1, 6))) for _ in range(n)]
    from faker import Faker

    for lang, loc in FAKER.items():
        f = Faker(loc)
        f.seed_instance(seed)
        docs = []
        for _ in range(n):
            paras = [f.paragraph(nb_sentences=rng.randint(2, 9)) for _ in range(rng.randint(1, 8))]
            docs.append("\n".join(paras) if rng.random() < 0.3 else "\n\n".join(paras))
        out[lang] = docs
    # Chinese, Thai, Vietnamese, Japanese, Korean: paragraphs written for tests/filters/test_segmenters.py (no prose of them ships in
    # an installed package), 1-6 a document, in random order
    prose = json.loads((ROOT / "tests" / "filters" / "data" / "segmented_prose.json").read_text())
    for lang in ("zh", "th", "vi", "ja", "ko"):
        out[lang] = ["\n\n".join(rng.choice(prose[lang]) for _ in range(rng.randint(1, 6))) for _ in range(n)]
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=300, help="documents a language")
    args = ap.parse_args(argv)
    from datatrove.data import Document

    from filters import base, fineweb2
    from pipeline.steps import filter as fstep

    docs = corpus(args.docs)
    texts = [t for lang in docs for t in docs[lang]]
    given = [lang for lang in docs for _ in docs[lang]]
    batch = pa.RecordBatch.from_pydict({"id": [str(i) for i in range(len(texts))], "text": texts})
    lid = base.build(base.parse_params({"type": "language", "label_only": True}))
    labels = lid.apply(batch).scores["lang"].to_pylist()
    table = fineweb2.table()
    rows = []
    routed = {t: base.build(base.parse_params({"type": t, "per_language": "fineweb2"})) for t in TYPES}
    plain = {t: base.build(base.parse_params({"type": t})) for t in TYPES}
    res_r = {t: routed[t].apply(batch, pa.array(labels, pa.string())) for t in TYPES}
    res_p = {t: plain[t].apply(batch) for t in TYPES}
    for lang in docs:
        ix = [i for i, g in enumerate(given) if g == lang]
        detected = collections.Counter(labels[i] for i in ix).most_common(1)[0][0]
        row = {"language": lang, "documents": len(ix), "lid_agrees": round(sum(labels[i] == lang for i in ix) / len(ix), 3)}
        for t in TYPES:
            row[f"{t}_removed_per_language"] = round(sum(not res_r[t].keep[i] for i in ix) / len(ix), 3)
            row[f"{t}_removed_english"] = round(sum(not res_p[t].keep[i] for i in ix) / len(ix), 3)
        if detected in table:
            agree = {}
            for t in TYPES:
                dt = fineweb2.datatrove_filter(t, detected)
                same = 0
                checked = [i for i in ix if labels[i] == detected]
                for i in checked:
                    r = dt.filter(Document(text=texts[i], id=str(i)))
                    keep = r if isinstance(r, bool) else bool(r[0])
                    same += keep == bool(res_r[t].keep[i])
                agree[t] = round(same / max(1, len(checked)), 4)
            row["agreement_with_datatrove"] = agree
        else:
            row["agreement_with_datatrove"] = f"{detected}: not in the fineweb2 table (its default: the instance's own)"
        rows.append(row)
    for r in rows:
        print(json.dumps(r, ensure_ascii=False))
    # speed: the chain over the same batches, routed against not
    chains = {
        "plain": [("lid", base.build(base.parse_params({"type": "language", "label_only": True})))] +
                 [(t, base.build(base.parse_params({"type": t}))) for t in TYPES],
        "routed": [("lid", base.build(base.parse_params({"type": "language", "label_only": True})))] +
                  [(t, base.build(base.parse_params({"type": t, "per_language": "fineweb2"}))) for t in TYPES],
    }
    for _, flt in chains["routed"][1:]:
        flt.routes_by = "lid"
    order = list(range(len(texts)))
    random.Random(1).shuffle(order)  # mixed languages in every batch
    mixed = batch.take(pa.array(order))
    mixed = mixed.append_column("metadata", pa.nulls(mixed.num_rows, pa.string())).append_column(
        "n_chars", pa.array([len(t) for t in mixed.column("text").to_pylist()], pa.int64()))
    cpu = {}
    for rep in range(2):  # the first pass warms each language's word rules and caches
        for name, chain in chains.items():
            stages = {n: {"docs_in": 0, "docs_out": 0, "chars_in": 0, "chars_out": 0, "tokens_in": None,
                          "tokens_out": 0, "removed": {}} for n, _ in chain}
            c0 = time.process_time()
            for lo in range(0, mixed.num_rows, fstep.BATCH_ROWS):
                fstep.filter_batch(mixed.slice(lo, fstep.BATCH_ROWS), chain, stages, None)
            cpu[name] = time.process_time() - c0
    print(json.dumps({"chain_cpu_s": {k: round(v, 3) for k, v in cpu.items()},
                      "routed_over_plain": round(cpu["routed"] / cpu["plain"], 3), "documents": len(texts)}))


if __name__ == "__main__":
    main()
