"""The embedding probe against fastText on the demo: the same examples, the same
train/validation split (the classify stage's seeded sample), both families' eval.json side
by side, and scoring speed per core on the held-out texts.

Runs `mixtures/demo.yaml` as it is (fastText) and with its classifier changed to
`type: embedding` (WordLlama's embeddings, a logistic probe), both to the same step store
(every step before classification is shared), then times each family's `score` with the models it trained on the five kinds of text of
bench/textkinds.py in this process (CPU seconds, one core): MB/s.

    python -m bench.probe [--mixture mixtures/demo.yaml] [--out /tmp/curate-probe]

Not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import yaml


def family_params(typ: str) -> dict:
    from filters.classifiers import family

    return type(family(typ)).Params(positive=["p"], negative=["n"]).model_dump(mode="json")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mixture", default="mixtures/demo.yaml")
    ap.add_argument("--out", default="/tmp/curate-probe")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--docs", type=int, default=400, help="documents per kind for the scoring speed")
    ap.add_argument("--c", type=float, default=1.0, help="the probe's inverse regularisation")
    a = ap.parse_args(argv)

    import pyarrow.parquet as pq

    from filters.classifiers import family
    from pipeline import config
    from pipeline.io import atomic
    from pipeline.run import runner

    src = Path(a.mixture).resolve()
    raw = yaml.safe_load(src.read_text())
    name = next(iter(raw["classifiers"]))
    c = raw["classifiers"][name]
    probe = {"type": "embedding", "positive": c["positive"], "negative": c["negative"],
             "max_examples_per_class": c.get("max_examples_per_class", 20000), "c": a.c}
    variant = dict(raw, name=raw["name"] + "-probe", classifiers={name: probe})
    vpath = src.with_name(src.stem + "-probe-bench.yaml")  # beside the original: its relative paths still hold
    vpath.write_text(yaml.safe_dump(variant, sort_keys=False))
    ens = {"type": "ensemble", "members": {f"{name}_ft": 1.0, f"{name}_probe": 1.0}, "positive": c["positive"],
           "negative": c["negative"], "max_examples_per_class": c.get("max_examples_per_class", 20000)}
    evariant = dict(raw, name=raw["name"] + "-ensemble", classifiers={f"{name}_ft": c, f"{name}_probe": probe, name: ens})
    epath = src.with_name(src.stem + "-ensemble-bench.yaml")
    epath.write_text(yaml.safe_dump(evariant, sort_keys=False))
    rows = []
    try:
        for path in (src, vpath, epath):
            t = time.time()
            run = Path(runner.run(config.load(path), workers=a.workers, output=a.out, log=lambda m: None, quiet=True))
            steps = atomic.read_json(run / "run.json")["steps"]
            tdir = run / steps[f"classify-{name}-train"]["dir"]
            ev = atomic.read_json(tdir / "eval.json")
            rows.append((path, tdir, ev, steps[f"classify-{name}-train"].get("seconds"), time.time() - t))
    finally:
        vpath.unlink(missing_ok=True)
        epath.unlink(missing_ok=True)
    fams = {}
    for path, tdir, ev, train_s, wall in rows:
        typ = "fasttext" if path == src else "embedding" if path == vpath else "ensemble"
        fams[typ] = (tdir, ev)
        if typ == "ensemble":
            print(f"ensemble   ROC AUC {ev['roc_auc']:.4f}  F1 {ev['f1']:.4f}  (mean of percentile ranks); its members on "
                  f"the same held-out examples: {ev['members']}")
            continue
        print(f"{typ:<10} ROC AUC {ev['roc_auc']:.4f}  F1 {ev['f1']:.4f}  precision {ev['precision']:.4f}  "
              f"recall {ev['recall']:.4f}  train {ev['examples']['train']}  validation {ev['examples']['validation']}  "
              f"train step {train_s} s")
    va = [sorted(r["hash"] for r in pq.read_table(fams[f][0] / "sample.parquet").to_pylist() if r["split"] == "validation")
          for f in ("fasttext", "embedding", "ensemble")]
    print(f"the same validation examples for all three: {va[0] == va[1] == va[2]} ({len(va[0]):,})")
    # scoring speed per core on the five kinds of text, each family's trained model
    from bench import textkinds

    models = {"fasttext": (family("fasttext"), fams["fasttext"][0] / "model.bin", "__label__hq"),
              "embedding": (family("embedding"), fams["embedding"][0] / "probe.json", "__label__hq")}
    print("\n| kind | docs | MB | fastText score MB/s | probe score MB/s | probe / fastText |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for kind, texts in textkinds.build(a.docs).items():
        mb = sum(len(t.encode()) for t in texts) / 1e6
        rate = {}
        for f, (fam, path, label) in models.items():
            m = fam.load(str(path))
            opts = fam.options(family_params(f))
            fam.score(m, texts[:5], label, opts)  # warm: the model and its tokenizer loaded
            t = time.process_time()
            fam.score(m, texts, label, opts)
            rate[f] = mb / (time.process_time() - t)
        print(f"| {kind} | {len(texts):,} | {mb:.2f} | {rate['fasttext']:.2f} | {rate['embedding']:.2f} | "
              f"{rate['embedding'] / rate['fasttext']:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
