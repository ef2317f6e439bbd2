"""docs/extending.md's filter and classifier family examples are the code that runs, and
they behave as the doc says."""

from __future__ import annotations

import re
import sys

import pyarrow as pa
import pytest

from filters import base as filter_base
from filters import classifiers
from tests.conftest import ROOT


@pytest.fixture(autouse=True)
def _examples_registered_for_their_test_only():
    """An example registers its type while its test runs; later tests of the session (the
    generated docs tables, `curate filters` and `curate classifiers`) see the built-in ones."""
    filters_before, families_before = dict(filter_base._REGISTRY), dict(classifiers._REGISTRY)
    yield
    for registry, before in ((filter_base._REGISTRY, filters_before), (classifiers._REGISTRY, families_before)):
        registry.clear()
        registry.update(before)
    classifiers.family.cache_clear()
    for name in ("tests.filters.vowels_example", "tests.filters.naive_bayes_example"):
        sys.modules.pop(name, None)  # a later import registers it again


def test_the_doc_shows_the_filter_that_runs():
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "extending.md").read_text(), re.S)
    assert (ROOT / "tests" / "filters" / "vowels_example.py").read_text() in blocks


def test_the_example_filter_keeps_prose_and_drops_gibberish_with_its_reason():
    from tests.filters import vowels_example  # registers min_vowels

    f = filter_base.build(filter_base.parse_params({"type": "min_vowels", "min_ratio": 0.25}))
    assert isinstance(f, vowels_example.VowelFilter)
    batch = pa.RecordBatch.from_pydict({"id": ["a", "b", "c"], "text": ["A sentence of plain prose.", "xkcd qwrt zzkf", "12345"]})
    res = f.apply(batch)
    assert list(res.keep) == [True, False, True] and res.reasons == [None, "too_few_vowels", None]
    off = filter_base.build(filter_base.parse_params({"type": "min_vowels", "min_ratio": None})).apply(batch)
    assert all(off.keep)


def test_the_doc_shows_the_classifier_family_that_runs():
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "extending.md").read_text(), re.S)
    assert (ROOT / "tests" / "filters" / "naive_bayes_example.py").read_text() in blocks


def test_the_example_family_trains_scores_and_evaluates_through_the_interface(tmp_path):
    import numpy as np

    from tests.filters import naive_bayes_example  # registers naive_bayes

    fam = classifiers.family("naive_bayes")
    assert isinstance(fam, naive_bayes_example.NaiveBayes)
    params = naive_bayes_example.NaiveBayesParams(positive=["wiki"], negative=["web"]).model_dump(mode="json")
    examples = [("__label__hq", "The river flows through the old town."), (fam.negative_label, "BUY NOW cheap pills click here"),
                ("__label__hq", "The town hall was built in 1820."), (fam.negative_label, "click here to win, buy now")]
    model = fam.train(examples, params, 0, tmp_path / fam.model_file)
    assert fam.labels(str(tmp_path / "model.json")) == ["__label__hq", "negative"]
    texts = ["an old river town", "Click here, buy now"]
    s = fam.score(fam.load(tmp_path / "model.json"), texts, "__label__hq", fam.options(params))
    assert s[0] > 0.5 > s[1]
    assert fam.predict(model, texts, fam.options(params))[0] == ["__label__hq", "negative"]
    assert fam.evaluate(model, texts, np.array([True, False]), "__label__hq", fam.options(params))["roc_auc"] == 1.0


def test_a_registered_family_is_a_type_the_yaml_can_name_and_the_plan_uses(tmp_path):
    """Registered before the config is imported (a built-in one: by its BUILTIN_MODULES line),
    a family is a variant of `classifiers.<name>.type`; its options enter the scoring step."""
    import subprocess

    (tmp_path / "a.jsonl").write_text("".join(f'{{"id": "{i}", "text": "text {i}"}}\n' for i in range(5)))
    (tmp_path / "x.yaml").write_text(
        "name: x\ntokenizer: null\nsources:\n  wiki: {paths: [a.jsonl]}\n"
        "  web: {paths: [a.jsonl], quality: {classifier: nb, min_score: 0.5}}\n"
        "classifiers:\n  nb: {type: naive_bayes, positive: [wiki], negative: [web], alpha: 0.5, lowercase: false}\n")
    code = ("import sys; from tests.filters import naive_bayes_example; from pipeline import config; "
            "from pipeline.run import graph; lm = config.load(sys.argv[1]); "
            "print(lm.canonical()['classifiers']['nb']['alpha']); "
            "print({s.name: s.config for s in graph.build(lm, lm.output_dir()).steps}['classify-nb-web'])")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "x.yaml")], capture_output=True, text=True, cwd=ROOT, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["0.5", "{'model': None, 'label': '__label__hq', 'lowercase': False}"]
