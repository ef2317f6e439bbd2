"""Quality classification through the real CLI: a fastText model trained on real text
(Wikipedia summaries against the demo crawl), scores, exact keep fractions, cheap
re-thresholding, determinism, a pretrained model."""

from __future__ import annotations

import os

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from filters.classifiers import binary_metrics, family
from pipeline import config
from pipeline.run import graph, runner
from pipeline.shards import select
from pipeline.io import atomic
from pipeline.steps.classify import quality
from pipeline.steps.classify import tasks as classify
from tests.conftest import curate, write_yaml


def test_roc_auc_equals_pair_counting():
    rng = np.random.default_rng(0)
    y = rng.random(300) < 0.4
    s = np.round(np.where(y, rng.random(300) + 0.3, rng.random(300)), 2)  # rounded: many ties
    pos, neg = s[y], s[~y]
    want = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))
    assert binary_metrics(y, s)["roc_auc"] == pytest.approx(want, abs=1e-6)


def test_kth_largest_is_exact_across_shards(tmp_path):
    """The threshold's merge of the score tasks' key files gives the exact k-th largest key."""
    rng = np.random.default_rng(1)
    files, keys = [], []
    for j in range(4):
        n = 500
        score = np.concatenate([rng.random(n - 100), np.full(100, 0.5)]).astype(np.float32)  # ties in score
        tie = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
        files.append(str(tmp_path / f"s{j}.parquet"))
        select.write_keys(files[-1], ~quality.score_keys(score, tie), np.ones(n, np.int64))
        keys += [(int(a) << 32) | int(b) for a, b in zip(score.view(np.uint32), tie, strict=True)]
    keys.sort(reverse=True)
    for k in (1, 2, 137, 1000, 1999, 2000):
        assert (2**64 - 1) ^ select.cutoff(files, k)[0] == keys[k - 1]


def _yaml(path, corpus, quality_line: str, classifier: str = "", extra_sources: str = ""):
    return write_yaml(path, f"""
        name: cls
        tokenizer: null
        sources:
          wiki:
            paths: ["{corpus}/wiki/summaries_en.parquet"]
            id_field: id
            {quality_line}
          web:
            paths: ["{corpus}/web/*.jsonl.zst"]
        {extra_sources}
        classifiers:
          wiki_vs_web:
            {classifier or "positive: [wiki]"}
            negative: [web]
            epochs: 5
            bucket: 50000
            dim: 32
    """)


def _attrs(run, source):
    steps = atomic.read_json(run / "run.json")["steps"]
    return pq.read_table(sorted((run / steps[f"quality-{source}"]["dir"] / source).glob("*.parquet"))).to_pylist()


@pytest.fixture(scope="module")
def trained(demo_corpus, tmp_path_factory, joined):
    d = tmp_path_factory.mktemp("cls")
    y = _yaml(d / "a.yaml", demo_corpus, "quality: {classifier: wiki_vs_web, keep_fraction: 0.3}")
    r = curate("run", str(y), "--workers", "2", "--output", str(d / "one"), env=joined)
    assert r.returncode == 0, r.stderr[-3000:]
    return d, y, r


def test_training_evaluates_and_keep_fraction_is_exact(trained):
    d, _, r = trained
    run = d / "one" / "cls"
    assert "classifier wiki_vs_web: validation ROC AUC" in r.stdout
    steps = atomic.read_json(run / "run.json")["steps"]
    ev = atomic.read_json(run / steps["classify-wiki_vs_web-train"]["dir"] / "eval.json")
    print(f"\nwiki vs web: ROC AUC {ev['roc_auc']:.4f}, F1 {ev['f1']:.4f}, examples {ev['examples']}")
    assert ev["roc_auc"] >= 0.95 and ev["examples"]["train"]["positive"] == ev["examples"]["train"]["negative"] > 2000
    sample = pq.read_table(run / steps["classify-wiki_vs_web-train"]["dir"] / "sample.parquet").to_pylist()
    assert sum(s["split"] == "validation" for s in sample) * 10 == len(sample)
    rows = _attrs(run, "wiki")
    assert all(r["score"] is not None and 0 <= r["score"] <= 1 for r in rows)  # every row scored
    kept = sum(r["keep"] is True for r in rows)
    assert kept == round(0.3 * len(rows))
    dropped = [r for r in rows if r["keep"] is False]
    thr = min(r["score"] for r in rows if r["keep"])
    assert all(r["score"] <= thr for r in dropped)
    assert all(r["reason"].startswith("quality_below:") and "(score=" in r["reason"] for r in dropped)
    led = atomic.read_json(run / "ledger.json")
    assert led["conservation"] is True and sum(led["sources"]["wiki"]["removed"]["quality:wiki_vs_web"].values()) == len(dropped)


def test_same_model_bytes_on_a_second_run(ray_local, trained):
    d, y, _ = trained
    runner.run(config.load(y), workers=1, output=str(d / "two"), log=lambda m: None, quiet=True)  # in process
    a = atomic.read_json(d / "one" / "cls" / "run.json")["steps"]["classify-wiki_vs_web-train"]["dir"]
    b = atomic.read_json(d / "two" / "cls" / "run.json")["steps"]["classify-wiki_vs_web-train"]["dir"]
    assert atomic.file_digest(d / "one" / "cls" / a / "model.bin") == atomic.file_digest(d / "two" / "cls" / b / "model.bin")
    assert _attrs(d / "one" / "cls", "wiki") == _attrs(d / "two" / "cls", "wiki")


def test_editing_the_threshold_skips_training_and_scoring(trained, demo_corpus, joined):
    d, y, _ = trained
    original = y.read_text()
    try:  # the same file, edited in place (the run directory is that file's)
        edited = _yaml(y, demo_corpus, "quality: {classifier: wiki_vs_web, min_score: 0.9}")
        plan = curate("plan", str(edited), "--output", str(d / "one")).stdout
        r = curate("run", str(edited), "--output", str(d / "one"), env=joined)
    finally:
        y.write_text(original)
    lines = {ln.split()[0]: ln for ln in plan.splitlines() if ln.startswith(("classify-", "quality-", "mix"))}
    assert " skip " in lines["classify-wiki_vs_web-train"] and " skip " in lines["classify-wiki_vs_web-wiki"]
    assert "config changed" in lines["quality-wiki-threshold"]
    assert r.returncode == 0, r.stderr[-3000:]
    st = atomic.read_json(d / "one" / "cls" / "run.json")["steps"]
    assert st["classify-wiki_vs_web-train"]["status"] == st["classify-wiki_vs_web-wiki"]["status"] == "SKIPPED"
    rows = _attrs(d / "one" / "cls", "wiki")
    assert all((r["keep"] is True) == (r["score"] >= 0.9) for r in rows)


def _model(d):
    """The model.bin the module's first run trained."""
    run = d / "one" / "cls"
    return run / atomic.read_json(run / "run.json")["steps"]["classify-wiki_vs_web-train"]["dir"] / "model.bin"


def test_pretrained_model_scores_like_the_trained_one(ray_local, trained, demo_corpus, tmp_path):
    d, _, _ = trained
    model = _model(d)
    y = _yaml(tmp_path / "p.yaml", demo_corpus, "quality: {classifier: wiki_vs_web, keep_fraction: 0.3}",
              classifier=f"model: {model}\n            label: __label__hq")
    runner.run(config.load(y), workers=2, output=str(tmp_path), log=lambda m: None, quiet=True)
    steps = atomic.read_json(tmp_path / "cls" / "run.json")["steps"]
    assert "classify-wiki_vs_web-train" not in steps
    # the module's first run's scores (its keep mask may be another test's threshold edit: scores only), and
    # this run's keep mask the top 30% of them (it once read a folder another test wrote: passed only after it)
    a = [(x["id"], x["score"]) for x in _attrs(d / "one" / "cls", "wiki")]
    rows = _attrs(tmp_path / "cls", "wiki")
    assert a == [(x["id"], x["score"]) for x in rows]
    assert sum(x["keep"] is True for x in rows) == round(0.3 * len(rows))


def test_missing_model_is_a_clear_error(demo_corpus, tmp_path):
    y = _yaml(tmp_path / "m.yaml", demo_corpus, "quality: {classifier: wiki_vs_web, min_score: 0.5}",
              classifier="model: models/nope.bin")
    r = curate("run", str(y), "--output", str(tmp_path))
    assert r.returncode == 2
    assert f"{y}:13: classifiers.wiki_vs_web.model: no such model file: {tmp_path}/models/nope.bin" in r.stderr
    assert "Traceback" not in r.stderr



def test_training_sample_from_bounded_candidates_equals_a_full_pass(tmp_path):
    """Each shard offers only the documents under the class's hash bound; the k smallest
    of the offers are the k smallest of the class (and a bound set too low falls back)."""
    from pipeline.engine.step import ShardOutput

    rng = np.random.default_rng(4)
    shards = []
    for j in range(5):
        n = int(rng.integers(200, 3000))
        p = tmp_path / f"docs-{j}.parquet"
        pq.write_table(pa.table({"id": [f"d{j}-{i}" for i in range(n)], "text": [f"text of d{j}-{i}" for i in range(n)]}), p)
        shards.append({"documents": str(p), "layers": [], "source": "web", "kept": n})
    k = 300
    bound = classify.tau(k, sum(d["kept"] for d in shards))
    assert bound < 2**64 - 1  # the bound is in force: shards offer about a tenth of their documents
    offered = []
    for j, d in enumerate(shards):
        m = classify.examples_shard({"doc": d, "seed": 3, "tau": bound}, ShardOutput(str(tmp_path / "ex"), j))
        offered.append({**d, "candidates": str(tmp_path / "ex" / f"part-{j:05d}.parquet"), "offered": m["candidates"]})
    assert sum(o["offered"] for o in offered) < sum(d["kept"] for d in shards) / 3
    full = classify._sample({"shards": shards, "files": [], "tau": bound}, k, 3)  # no candidates: every document
    low = [{**o, "offered": 1} for o in offered]  # as if the bound had let too few through: the fallback
    assert classify._sample({"shards": low, "files": [], "tau": 1 << 40}, k, 3) == full
    # the candidates carry their texts: with the document shards gone, the same sample, texts included
    for d in shards:
        os.rename(d["documents"], d["documents"] + ".gone")
    assert classify._sample({"shards": offered, "files": [], "tau": bound}, k, 3) == full and len(full) == k
    assert all(text == f"text of {origin.split(':', 1)[1]}" for _, origin, text in full)


def test_moving_an_example_file_to_the_other_side_retrains(demo_corpus, tmp_path):
    """A classifier's step hash knows which side (or label) each example file is on."""
    (tmp_path / "a.txt").write_text("one example\n")
    (tmp_path / "b.txt").write_text("another example\n")
    hashes = {}
    for name, pos, neg in (("v1", "a.txt", "b.txt"), ("v2", "b.txt", "a.txt")):
        y = _yaml(tmp_path / f"{name}.yaml", demo_corpus, "quality: {classifier: wiki_vs_web, keep_fraction: 0.5}",
                  classifier=f"positive: [wiki, {pos}]\n            negative: [web, {neg}]\n            "
                  "max_examples_per_class: 100").read_text().replace("    negative: [web]\n    epochs", "    epochs", 1)
        lm = config.load(write_yaml(tmp_path / f"{name}.yaml", y))
        spec = lm.mixture.classifiers["wiki_vs_web"]  # the template's own `negative: [web]` is gone: one side each
        assert [Path(x).name for x in spec.positive] == ["wiki", pos] and [Path(x).name for x in spec.negative] == ["web", neg]
        plan = graph.build(lm, tmp_path / name)
        hashes[name] = next(s.hash for s in plan.steps if s.name == "classify-wiki_vs_web-train")
    assert hashes["v1"] != hashes["v2"]


def test_a_safety_classifier_drops_what_scores_above_max_score(ray_local, trained, demo_corpus, tmp_path):
    """`max_score` keeps documents at or below it (a pretrained toxicity model's positive
    label, say): the rest go as quality_above:<max>, and the ledger counts them so."""
    d, _, _ = trained
    model = _model(d)
    y = _yaml(tmp_path / "s.yaml", demo_corpus, "quality: {classifier: wiki_vs_web, max_score: 0.5}",
              classifier=f"model: {model}\n            label: __label__hq")
    runner.run(config.load(y), workers=2, output=str(tmp_path), log=lambda m: None, quiet=True)
    rows = [x for x in _attrs(tmp_path / "cls", "wiki") if x["keep"] is not None]
    assert rows and all(x["keep"] == (x["score"] <= 0.5) for x in rows)
    dropped = [x for x in rows if not x["keep"]]
    assert dropped and all(x["reason"].startswith("quality_above:0.5 (score=") for x in dropped)
    led = atomic.read_json(tmp_path / "cls" / "ledger.json")["sources"]["wiki"]["removed"]
    assert led["quality:wiki_vs_web"] == {"quality_above:0.5": len(dropped)}


def test_sources_named_train_and_examples_are_scored_by_steps_of_their_own(demo_corpus, tmp_path, joined):
    """A source may be called `train` or `examples`, the words of a classifier's own steps
    (`classify-c-train`, `classify-c-examples`): its score step is `classify-c-source-train`,
    so no two steps share a name (which once mixed up their stats, run.json and gc)."""
    y = write_yaml(tmp_path / "t.yaml", f"""
        name: t
        tokenizer: null
        sources:
          train: {{paths: ["{demo_corpus}/wiki/summaries_es.parquet"], id_field: id,
                   quality: {{classifier: c, keep_fraction: 0.5}}}}
          examples: {{paths: ["{demo_corpus}/web/crawl-00000.jsonl.zst"], quality: {{classifier: c, keep_fraction: 0.5}}}}
        classifiers:
          c: {{positive: [train], negative: [examples], max_examples_per_class: 500, epochs: 2, bucket: 10000, lr: 0.05}}
    """)
    r = curate("run", str(y), "--workers", "2", env=joined)
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "out" / "t"
    steps = atomic.read_json(run / "run.json")["steps"]
    classify_steps = sorted(n for n in steps if n.startswith("classify-"))
    assert classify_steps == ["classify-c-examples", "classify-c-source-examples", "classify-c-source-train", "classify-c-train"]
    assert len({s["dir"] for s in steps.values()}) == len(steps)  # one store folder per step
    assert r.stdout.count("classifier c: validation ROC AUC") == 1  # the train step, not a score step ending in -train
    led = atomic.read_json(run / "ledger.json")
    for source in ("train", "examples"):
        rows = _attrs(run, source)
        assert rows and all(x["score"] is not None for x in rows)
        assert sum(led["sources"][source]["removed"]["quality:c"].values()) == len(rows) - round(0.5 * len(rows))


def test_an_embedding_probe_classifies_in_a_run_and_scores_again_from_its_probe_file(demo_corpus, tmp_path, joined,
                                                                                     ray_local):
    """`type: embedding` (WordLlama's shipped weights and a logistic probe) through the same
    stage as fastText: trained from the sources, evaluated, exact keep fraction; then the
    probe file it wrote, given as `probe:`, scores every row the same without training."""
    y = write_yaml(tmp_path / "e.yaml", f"""
        name: emb
        tokenizer: null
        sources:
          wiki: {{paths: ["{demo_corpus}/wiki/summaries_en.parquet"], id_field: id,
                  quality: {{classifier: wiki_vs_web, keep_fraction: 0.3}}}}
          web: {{paths: ["{demo_corpus}/web/*.jsonl.zst"]}}
        classifiers:
          wiki_vs_web: {{type: embedding, positive: [wiki], negative: [web], max_examples_per_class: 2000}}
    """)
    r = curate("run", str(y), "--workers", "2", "--output", str(tmp_path / "one"), env=joined)
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "one" / "emb"
    steps = atomic.read_json(run / "run.json")["steps"]
    train = run / steps["classify-wiki_vs_web-train"]["dir"]
    ev = atomic.read_json(train / "eval.json")
    print(f"\nwiki vs web, embedding probe: ROC AUC {ev['roc_auc']:.4f}, F1 {ev['f1']:.4f}")
    assert ev["roc_auc"] >= 0.95 and ev["examples"]["train"]["positive"] == 1800
    probe = atomic.read_json(train / "probe.json")
    assert probe["embedding"]["backend"] == "wordllama" and probe["classes"] == ["__label__hq", "negative"]
    rows = _attrs(run, "wiki")
    assert all(x["score"] is not None for x in rows) and sum(x["keep"] is True for x in rows) == round(0.3 * len(rows))
    # the scores come from embed-wiki's vectors (every row embedded once), and equal the probe's scores of the texts
    rec = atomic.read_json(run / steps["classify-wiki_vs_web-wiki"]["dir"] / "step.json")
    assert any(n.startswith("embed-wiki") for n in rec["inputs"]) and all("vectors" in sp for sp in rec["shards"])
    assert atomic.read_json(run / steps["embed-wiki"]["dir"] / "step.json")["config"]["rows"] == "all"
    fam = family("embedding")
    texts = pq.read_table(demo_corpus / "wiki" / "summaries_en.parquet", columns=["text"])["text"].to_pylist()[:300]
    again = fam.score(fam.load(str(train / "probe.json")), texts, "__label__hq", {})
    assert [x["score"] for x in rows[:300]] == again.tolist()
    pub = curate("publish", str(run), str(tmp_path / "pub"))
    assert pub.returncode == 0, pub.stderr[-2000:]
    assert "(an embedding probe trained in the run: positive `wiki`" in (tmp_path / "pub" / "README.md").read_text()
    y2 = write_yaml(tmp_path / "p.yaml", y.read_text().replace("positive: [wiki], negative: [web], max_examples_per_class: 2000",
                                                               f"probe: {train / 'probe.json'}"))
    runner.run(config.load(y2), workers=2, output=str(tmp_path / "two"), log=lambda m: None, quiet=True)
    steps2 = atomic.read_json(tmp_path / "two" / "emb" / "run.json")["steps"]
    assert "classify-wiki_vs_web-train" not in steps2
    assert [(x["id"], x["score"], x["keep"]) for x in _attrs(tmp_path / "two" / "emb", "wiki")] == \
        [(x["id"], x["score"], x["keep"]) for x in rows]


def test_an_ensemble_is_at_least_as_good_as_its_best_member_on_the_same_held_out_examples(demo_corpus, tmp_path, joined):
    """`type: ensemble` over a fastText classifier and an embedding probe: the members trained
    first (their steps are the ensemble's inputs), each member's score mapped to its
    percentile rank on the ensemble's training examples, the weighted mean; eval.json gives
    the ensemble's and each member's metrics on the same held-out examples."""
    y = write_yaml(tmp_path / "e.yaml", f"""
        name: ens
        tokenizer: null
        sources:
          wiki: {{paths: ["{demo_corpus}/wiki/summaries_en.parquet"], id_field: id,
                  quality: {{classifier: both, keep_fraction: 0.3}}}}
          web: {{paths: ["{demo_corpus}/web/*.jsonl.zst"]}}
        classifiers:
          ft: {{positive: [wiki], negative: [web], max_examples_per_class: 1500, dim: 16, bucket: 20000, epochs: 2}}
          probe: {{type: embedding, positive: [wiki], negative: [web], max_examples_per_class: 1500}}
          both: {{type: ensemble, members: {{ft: 1, probe: 2}}, positive: [wiki], negative: [web],
                  max_examples_per_class: 1500}}
    """)
    r = curate("run", str(y), "--workers", "2", "--output", str(tmp_path / "out"), env=joined)
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "out" / "ens"
    steps = atomic.read_json(run / "run.json")["steps"]
    train = run / steps["classify-both-train"]["dir"]
    ev = atomic.read_json(train / "eval.json")
    best = max(v["roc_auc"] for v in ev["members"].values())
    print(f"\nensemble ROC AUC {ev['roc_auc']:.4f}; members {ev['members']}")
    assert set(ev["members"]) == {"ft", "probe"} and ev["roc_auc"] >= best
    ens = atomic.read_json(train / "ensemble.json")
    assert [(x["name"], x["type"], x["weight"]) for x in ens["members"]] == [("ft", "fasttext", 1.0), ("probe", "embedding", 2.0)]
    assert all(len(x["quantiles"]) == 1001 and x["quantiles"] == sorted(x["quantiles"]) for x in ens["members"])
    rows = _attrs(run, "wiki")
    assert sum(x["keep"] is True for x in rows) == round(0.3 * len(rows)) and all(0 <= x["score"] <= 1 for x in rows)
    # the probe member read embed-wiki's vectors (the fastText member the texts), and scored as from the texts
    rec = atomic.read_json(run / steps["classify-both-wiki"]["dir"] / "step.json")
    assert any(n.startswith("embed-wiki") for n in rec["inputs"]) and all("vectors" in sp for sp in rec["shards"])
    fam = family("ensemble")
    texts = pq.read_table(demo_corpus / "wiki" / "summaries_en.parquet", columns=["text"])["text"].to_pylist()[:200]
    assert [x["score"] for x in rows[:200]] == fam.score(fam.load(str(train / "ensemble.json")), texts, "", {}).tolist()
    bad = write_yaml(tmp_path / "bad.yaml", y.read_text().replace("members: {ft: 1, probe: 2}", "members: {ft: 1, nope: 2}"))
    v = curate("validate", str(bad))
    assert v.returncode == 2 and "classifiers.both.members.nope: unknown classifier 'nope'; defined: ft, probe, both" in v.stderr
