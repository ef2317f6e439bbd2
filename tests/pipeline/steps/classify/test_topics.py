"""Topic cells: a multi-class fastText classifier trained in the run from labelled files
(the demo's code, Wikipedia summaries and crawl pages as three labels), every document's
top label as `topic`, and mixture weights over topic x quality-bucket cells."""

from __future__ import annotations

import gzip
import io
import json

import pyarrow.parquet as pq
import pytest
import zstandard

from pipeline.io import atomic
from tests.conftest import curate, write_jsonl, write_yaml

WEIGHTS = {"pool/code": 0.2, "pool/wiki": 0.4, "pool/web/q1": 0.3, "pool/web/q2": 0.1}  # web/q2: crawl pages most like Wikipedia


def _corpus(demo_corpus, d):
    """Half of each kind as labelled example files, the other half mixed into one source."""
    wiki = pq.read_table(demo_corpus / "wiki" / "summaries_en.parquet", columns=["id", "text"]).to_pylist()[:3000]
    web = []
    for f in sorted((demo_corpus / "web").glob("*.jsonl.zst")):
        with zstandard.ZstdDecompressor().stream_reader(open(f, "rb")) as r:
            web += [json.loads(x) for x in io.TextIOWrapper(r, encoding="utf-8")]
    code = []
    for f in sorted((demo_corpus / "code").glob("*.jsonl.gz")):
        with gzip.open(f, "rt") as r:
            code += [json.loads(x) for x in r]
    code = [c for c in code if len(c["text"]) < 20000]
    (d / "ex").mkdir()
    (d / "ex" / "wiki.txt").write_text("\n".join(w["text"].replace("\n", " ") for w in wiki[::2]) + "\n")
    write_jsonl(d / "ex" / "web.jsonl", [{"text": w["text"]} for w in web[::2]])
    write_jsonl(d / "ex" / "code.jsonl", [{"text": c["text"]} for c in code[::2]])
    pool = ([{"id": f"wiki-{w['id']}", "text": w["text"]} for w in wiki[1::2]]
            + [{"id": f"web-{i}", "text": w["text"]} for i, w in enumerate(web[1::2])]
            + [{"id": f"code-{c['path']}", "text": c["text"]} for c in code[1::2]])
    write_jsonl(d / "pool.jsonl", pool)


def _run(d, name, workers, shard_rows, env=None):
    w = ", ".join(f"{k}: {v}" for k, v in WEIGHTS.items())
    y = write_yaml(d / f"{name}.yaml", f"""
        name: {name}
        output: out
        sources:
          pool:
            paths: [pool.jsonl]
            id_field: id
            max_shard_rows: {shard_rows}
            topic: {{classifier: kind}}
            quality: {{classifier: wiki_like, buckets: 2}}
        classifiers:
          kind:
            labels: {{code: [ex/code.jsonl], wiki: [ex/wiki.txt], web: [ex/web.jsonl]}}
            epochs: 20
            dim: 32
            bucket: 50000
          wiki_like: {{positive: [ex/wiki.txt], negative: [ex/web.jsonl], epochs: 5, bucket: 50000}}
        mixture:
          weights: {{{w}}}
          target_tokens: 1500000
          max_epochs: 6
    """)
    r = curate("run", str(y), "--workers", str(workers), env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return d / "out" / name


@pytest.fixture(scope="module")
def runs(demo_corpus, tmp_path_factory, joined, joined_1cpu):
    d = tmp_path_factory.mktemp("topics")
    _corpus(demo_corpus, d)
    return d, _run(d, "t1", 1, 5000, env=joined_1cpu), _run(d, "t2", 2, 700, env=joined)


def test_a_topic_classifier_is_trained_from_labelled_files_and_evaluated_per_label(runs):
    _, a, _ = runs
    steps = atomic.read_json(a / "run.json")["steps"]
    ev = atomic.read_json(a / steps["classify-kind-train"]["dir"] / "eval.json")
    assert set(ev["labels"]) == {"code", "wiki", "web"}
    for lab, v in ev["labels"].items():
        # held out: a tenth of each label, ~20 code files (one miss is 4.5 points): F1 high, neither side low
        assert v["f1"] >= 0.9 and v["precision"] >= 0.8 and v["recall"] >= 0.8 and v["support"] > 10, (lab, v)
    print(f"\ntopic classifier: {ev}")
    # every pooled document gets a topic; it is its origin for nearly all
    t = pq.read_table(sorted((a / steps["topic-pool"]["dir"] / "pool").glob("*.parquet"))).to_pylist()
    seen = [r for r in t if r["keep"] is not None]
    assert seen and all(r["topic"] in ("code", "wiki", "web") and 0 < r["topic_score"] <= 1 for r in seen)
    right = sum(r["id"].split("-", 1)[0] == r["topic"] for r in seen)
    assert right / len(seen) >= 0.95, right / len(seen)


def test_topic_and_bucket_cells_meet_their_weights_whatever_the_workers(runs):
    _, a, b = runs
    ma, mb = (atomic.read_json(r / "manifest.json") for r in (a, b))
    assert [f["sha256"] for f in ma["files"]] == [f["sha256"] for f in mb["files"]]
    c = ma["cells"]
    assert set(c) == set(WEIGHTS)  # every (topic, bucket) is named: no cell of weight 0
    for k, w in WEIGHTS.items():
        assert abs(c[k]["realized_weight"] - w) <= 0.005, (k, c[k])
    rows = pq.read_table(sorted((a / "mixture").glob("*.parquet")), columns=["id", "topic", "topic_score", "quality_bucket"]).to_pylist()
    for k in WEIGHTS:
        topic = k.split("/")[1]
        q = int(k.split("/q")[1]) if "/q" in k else None
        mine = [r for r in rows if r["topic"] == topic and (q is None or r["quality_bucket"] == q)]
        assert len(mine) == c[k]["documents"], k
        assert c[k]["topic"] == topic  # the manifest names each cell's topic
    # the report shows the cells; so it does for a mixture of topic cells alone (no bucket in any cell)
    from pipeline.views import report

    rep = atomic.read_json(a / "report.json")["cells"]["cells"]
    assert {k: v["topic"] for k, v in rep.items()} == {k: k.split("/")[1] for k in WEIGHTS}
    only_topics = {"pool/code": {**c["pool/code"], "buckets": None}, "pool/wiki": {**c["pool/wiki"], "buckets": None}}
    assert report._cells({"cells": only_topics}, {})["cells"] == only_topics
    assert all(r["topic"] is not None and r["topic_score"] is not None for r in rows)
    led = atomic.read_json(a / "ledger.json")["sources"]["pool"]
    assert led["conservation"] is True and [s["stage"] for s in led["stages"]][-3:] == ["quality:wiki_like", "topic:kind", "mix"]
    # curate explain names the topic and the cell
    doc = next(r for r in rows if r["topic"] == "web" and r["quality_bucket"] == 2)
    r = curate("explain", str(a), "--id", doc["id"])
    assert r.returncode == 0 and "topic=web" in r.stdout and "(cell pool/web/q2)" in r.stdout, r.stdout


def test_unknown_topics_and_wrong_classifier_kinds_are_refused(runs):
    from pipeline import config
    from pipeline.errors import UsageError

    d, _, _ = runs
    y = (d / "t1.yaml").read_text()
    for old, new, want in [
        ("pool/code: 0.2", "pool/news: 0.2", "'news' is not a topic of pool's classifier; its labels: code, wiki, web"),
        ("pool/web/q2: 0.1", "pool/web/q2: 0.1, pool/code/q1: 0.0", "pool/code/q1 overlaps pool/code"),
        ("topic: {classifier: kind}", "topic: {classifier: wiki_like}", "wiki_like is a positive/negative classifier"),
        ("quality: {classifier: wiki_like, buckets: 2}", "quality: {classifier: kind, buckets: 2}", "kind has labels (topics)"),
        ("    epochs: 20", "    epochs: 20\n    model: m.bin", "give labels (to train a topic classifier) or model"),
    ]:
        bad = write_yaml(d / "bad.yaml", y.replace(old, new))
        with pytest.raises(UsageError) as e:
            config.load(bad)
        assert want in str(e.value), (want, str(e.value))


def test_a_pretrained_topic_model_gives_the_same_topics_and_its_labels_name_the_cells(runs, joined):
    """`model:` instead of labels: the topics are the model's labels (read at plan time), so
    a cell naming another topic is refused with them; the documents get the same topics."""
    d, a, _ = runs
    steps = atomic.read_json(a / "run.json")["steps"]
    model = a / steps["classify-kind-train"]["dir"] / "model.bin"
    y = (d / "t1.yaml").read_text().replace("name: t1", "name: pre").replace(
        "labels: {code: [ex/code.jsonl], wiki: [ex/wiki.txt], web: [ex/web.jsonl]}", f"model: {model}")
    bad = write_yaml(d / "pre-bad.yaml", y.replace("pool/code: 0.2", "pool/news: 0.2"))
    r = curate("run", str(bad))
    assert r.returncode != 0 and "'news' is not a topic of pool's classifier; its labels: " in r.stderr, r.stderr[-1500:]
    assert "Traceback" not in r.stderr
    good = write_yaml(d / "pre.yaml", y)
    r = curate("run", str(good), "--workers", "2", env=joined)
    assert r.returncode == 0, r.stderr[-3000:]
    pre = d / "out" / "pre"
    topics = {}
    for run in (a, pre):
        st = atomic.read_json(run / "run.json")["steps"]
        t = pq.read_table(sorted((run / st["topic-pool"]["dir"] / "pool").glob("*.parquet")), columns=["id", "topic"])
        topics[run.name] = dict(zip(t.column("id").to_pylist(), t.column("topic").to_pylist(), strict=True))
    assert topics["pre"] == topics["t1"]
    c = atomic.read_json(pre / "manifest.json")["cells"]
    assert all(abs(c[k]["realized_weight"] - w) <= 0.005 for k, w in WEIGHTS.items())

    # the plans read the model's labels once and keep them by its sha256 (tests/conftest.py
    # points CURATE_CACHE_DIR at a folder of the session): a later plan does not open the model
    from filters import fasttext_family
    from filters.models import cache_dir
    from pipeline.io.atomic import file_digest
    from pipeline.steps.classify import plan as classify_plan

    digest = file_digest(model)[1]
    kept = cache_dir() / "model-labels" / f"{digest}.json"
    assert sorted(atomic.read_json(kept)) == ["code", "web", "wiki"]

    def no_model(path):
        raise AssertionError("the model was opened although its labels are kept")

    mp = pytest.MonkeyPatch()
    mp.setattr(fasttext_family, "open_model", no_model)
    try:
        assert classify_plan._model_labels(None, "pool", str(model), digest) == atomic.read_json(kept)
    finally:
        mp.undo()
