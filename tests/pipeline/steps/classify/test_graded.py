"""A graded classifier (`type: regression`) trained from annotations, FineWeb-Edu style,
on grades the test plants from known kinds of text: Wikipedia summaries 4-5, source code
3, crawl pages 2, spam and cookie banners 0-1 (with noise). The family alone, then in a
run: eval.json's Spearman on the held-out tenth, scores on [0, 1], a threshold in grades."""

from __future__ import annotations

import gzip
import io
import json
import random

import numpy as np
import pyarrow.parquet as pq
import pytest
import zstandard

from filters import classifiers
from filters.regression_family import RegressionParams
from pipeline import config
from pipeline.demo_data import COOKIE, SHORT, SPAM_WORDS
from pipeline.errors import UsageError
from pipeline.io import atomic
from pipeline.run import runner
from tests.conftest import curate, write_jsonl, write_yaml


def _graded(demo_corpus, n: int = 500) -> list[dict]:
    rng = random.Random(5)
    wiki = pq.read_table(demo_corpus / "wiki" / "summaries_en.parquet", columns=["id", "text"]).to_pylist()[:n]
    web = []
    with zstandard.ZstdDecompressor().stream_reader(open(sorted((demo_corpus / "web").glob("*.jsonl.zst"))[0], "rb")) as r:
        web = [json.loads(x) for x in io.TextIOWrapper(r, encoding="utf-8")][:n]
    code = []
    for f in sorted((demo_corpus / "code").glob("*.jsonl.gz")):
        with gzip.open(f, "rt") as r:
            code += [json.loads(x) for x in r]
    rows = [{"id": f"wiki-{w['id']}", "text": w["text"], "score": 4 + (len(w["text"]) > 800)} for w in wiki]
    rows += [{"id": f"web-{i}", "text": w["text"], "score": 2} for i, w in enumerate(web)]
    rows += [{"id": f"code-{i}", "text": c["text"][:20000], "score": 3} for i, c in enumerate(code[:n])]
    for i in range(n):
        if i % 2:
            text = " ".join(rng.choice(SPAM_WORDS) for _ in range(rng.randint(20, 120)))
        else:
            text = "\n".join(rng.choice(COOKIE + SHORT) for _ in range(rng.randint(1, 6)))
        rows.append({"id": f"spam-{i}", "text": text, "score": i % 2})
    for r in rows:
        r["score"] = round(min(5.0, max(0.0, r["score"] + rng.gauss(0, 0.3))), 2)  # annotators disagree a little
    rng.shuffle(rows)
    return rows


@pytest.mark.parametrize("head", ["ridge", "mlp"])
def test_a_regression_head_ranks_held_out_documents_by_their_grades(demo_corpus, tmp_path, head):
    fam = classifiers.family("regression")
    rows = _graded(demo_corpus)
    train, val = rows[: len(rows) * 9 // 10], rows[len(rows) * 9 // 10 :]
    params = RegressionParams(annotations="a.jsonl", head=head).model_dump(mode="json")
    model = fam.train([(r["score"], r["text"]) for r in train], params, 0, tmp_path / fam.model_file)
    ev = fam.evaluate_graded(model, [r["text"] for r in val], np.array([r["score"] for r in val]))
    print(f"\n{head}: Spearman {ev['spearman']:.3f}, Pearson {ev['pearson']:.3f}, MAE {ev['mae']:.3f} on {len(val)}")
    assert ev["spearman"] >= 0.8 and ev["mae"] < 1.0
    s = fam.score(fam.load(str(tmp_path / "head.json")), [r["text"] for r in val], "", {})
    assert s.dtype == np.float32 and s.min() >= 0 and s.max() <= 1 and model["scale"] == max(r["score"] for r in train)
    again = tmp_path / "again.json"
    fam.train([(r["score"], r["text"]) for r in train], params, 0, again)
    assert again.read_bytes() == (tmp_path / "head.json").read_bytes()


def _yaml(path, d, annotations: str, quality: str = "min_score: 0.6"):
    return write_yaml(path, f"""
        name: edu
        tokenizer: null
        sources:
          pool: {{paths: ["{d}/pool.jsonl"], id_field: id, quality: {{classifier: edu, {quality}}}}}
        classifiers:
          edu: {{type: regression, annotations: {annotations}}}
    """)


def test_a_graded_classifier_in_a_run_grades_and_thresholds_a_source(ray_local, demo_corpus, tmp_path):
    rows = _graded(demo_corpus, 400)
    write_jsonl(tmp_path / "annotations.jsonl", rows[: len(rows) // 2])
    write_jsonl(tmp_path / "pool.jsonl", [{"id": r["id"], "text": r["text"]} for r in rows[len(rows) // 2 :]])
    grade = {r["id"]: r["score"] for r in rows}
    y = _yaml(tmp_path / "e.yaml", tmp_path, "annotations.jsonl")
    run = runner.run(config.load(y), workers=2, output=str(tmp_path / "out"), log=lambda m: None, quiet=True)
    steps = atomic.read_json(run / "run.json")["steps"]
    ev = atomic.read_json(run / steps["classify-edu-train"]["dir"] / "eval.json")
    print(f"\nin a run: Spearman {ev['spearman']:.3f}, MAE {ev['mae']:.3f}, {ev['examples']}")
    assert ev["spearman"] >= 0.8 and ev["examples"]["validation"] == ev["examples"]["annotations"] // 10
    attrs = [r for f in sorted((run / steps["quality-pool"]["dir"] / "pool").glob("*.parquet"))
             for r in pq.read_table(f).to_pylist()]
    assert all(0 <= r["score"] <= 1 for r in attrs)
    kept = [grade[r["id"]] for r in attrs if r["keep"]]
    dropped = [grade[r["id"]] for r in attrs if r["keep"] is False]
    print(f"kept {len(kept)}: mean grade {np.mean(kept):.2f}; dropped {len(dropped)}: mean grade {np.mean(dropped):.2f}")
    # min_score 0.6 x scale 5 = predicted grade 3 (code and above): crawl pages and spam mostly dropped
    assert np.mean([g >= 2.5 for g in kept]) >= 0.8 and np.mean(kept) >= np.mean(dropped) + 1.2
    r = curate("explain", str(run), "--id", next(x["id"] for x in attrs if x["keep"] is False))
    assert "quality_below:0.6 (score=" in r.stdout


def test_graded_classifier_config_errors_name_the_key(tmp_path):
    (tmp_path / "pool.jsonl").write_text('{"id": "a", "text": "x"}\n')
    y = write_yaml(tmp_path / "x.yaml", f"""
        name: edu
        sources:
          pool: {{paths: ["{tmp_path}/pool.jsonl"], id_field: id, quality: {{classifier: edu, min_score: 0.5}}}}
        classifiers:
          edu: {{type: regression, annotations: nope.jsonl}}
    """)
    r = curate("validate", str(y))
    assert r.returncode == 2 and f"classifiers.edu.annotations: no such file: {tmp_path}/nope.jsonl" in r.stderr
    y2 = write_yaml(tmp_path / "y.yaml", y.read_text().replace("annotations: nope.jsonl", "positive: [pool]"))
    with pytest.raises(UsageError, match=r"classifiers.edu: a regression classifier learns from `annotations`"):
        config.load(y2)
    (tmp_path / "bad.jsonl").write_text('{"id": "a", "score": "high", "text": "x"}\n')
    from pipeline.errors import InputError
    from pipeline.steps.classify.graded import read_annotations

    with pytest.raises(InputError, match=r"bad.jsonl:line 1: no score 'high' \(a number\)"):
        read_annotations(str(tmp_path / "bad.jsonl"))
