"""The classifier registry (filters/classifiers.py) and the fastText family behind its interface."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Literal

import numpy as np
import pytest

from filters import classifiers
from filters.fasttext_family import FastText, FastTextParams
from tests.conftest import curate


def test_the_registry_lists_fasttext_and_a_miss_lists_the_known_types():
    assert next(iter(classifiers.registry())) == "fasttext"  # the first is the default `type`
    assert classifiers.registry()["fasttext"] is FastText
    assert isinstance(classifiers.family("fasttext"), FastText)
    with pytest.raises(KeyError, match=r"unknown classifier type 'xgboost'; known types: fasttext, embedding, regression, ensemble \(`curate classifiers`"):
        classifiers.family("xgboost")


def test_a_family_is_registered_once_under_the_name_its_params_type_says():
    with pytest.raises(ValueError, match="registered twice: filters.fasttext_family.FastText and .*Other"):
        @classifiers.register_classifier("fasttext")
        class Other(classifiers.ClassifierFamily):
            Params = FastTextParams

    class Wrong(classifiers.ClassifierParams):
        type: Literal["wrong"] = "wrong"

    with pytest.raises(ValueError, match=r"Wrong.type must be Literal\['other'\]"):
        @classifiers.register_classifier("other")
        class Mismatched(classifiers.ClassifierFamily):
            Params = Wrong
    assert "other" not in classifiers.registry()


def test_builtin_modules_name_every_registering_module():
    assert {n: c.__module__ for n, c in classifiers.registry().items() if c.__module__.startswith("filters.")} \
        == classifiers.BUILTIN_MODULES
    registering = {f"filters.{f.stem}" for f in Path(classifiers.__file__).parent.glob("*.py")
                   if re.search(r"^@register_classifier\(", f.read_text(), re.MULTILINE)}
    assert registering == set(classifiers.BUILTIN_MODULES.values())


def test_curate_classifiers_lists_the_families_with_their_parameters():
    text = classifiers.describe_registry()
    assert text.startswith("fasttext (v2): fastText supervised classifiers")
    assert "    epochs: int, default 5. fastText epochs" in text
    assert "    loss: one of softmax, hs, ns, ova, default 'softmax'. fastText loss" in text
    r = curate("classifiers")
    assert r.returncode == 0 and r.stdout.strip() == text


def test_the_registry_and_its_families_stay_below_the_pipeline():
    """filters/ may use pipeline.io and pipeline.errors, never the config, engine, stages or CLI
    (function-level imports count)."""
    root = Path(classifiers.__file__).parent
    families = {m.split(".")[-1] + ".py" for m in classifiers.BUILTIN_MODULES.values()}
    for name in sorted({"classifiers.py", "registry.py"} | families):  # every built-in family's module
        tree = ast.parse((root / name).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        bad = {m for m in imported if m.startswith("pipeline") and m.split(".")[1] not in ("io", "errors")}
        assert not bad, f"filters/{name} imports {bad}"


def test_fasttext_family_trains_scores_predicts_and_names_its_labels(tmp_path):
    fam = classifiers.family("fasttext")
    params = FastTextParams(labels={"a": [], "b": []}, epochs=20).model_dump(mode="json")
    rng = np.random.default_rng(0)
    words = {"a": ["alpha", "apple", "atom"], "b": ["beta", "banana", "boat"]}
    examples = [(fam.class_label(lab), " ".join(rng.choice(words[lab], 6))) for _ in range(40) for lab in "ab"]
    model = fam.train(examples, params, 0, tmp_path / fam.model_file)
    assert (tmp_path / "model.bin").is_file() and sorted(fam.labels(str(tmp_path / "model.bin"))) == ["a", "b"]
    texts = ["alpha apple atom", "beta\nbanana boat"]
    opts = fam.options(params)
    assert opts == {"lowercase": False}
    top, prob = fam.predict(model, texts, opts)
    assert top == ["a", "b"] and prob.dtype == np.float32 and (prob > 0.5).all()
    s = fam.score(fam.load(str(tmp_path / "model.bin")), texts, "__label__a", opts)
    assert s.dtype == np.float32 and s[0] > 0.5 > s[1]
    ev = fam.evaluate(model, texts, np.array([True, False]), "__label__a", opts)
    assert ev["roc_auc"] == 1.0 and ev["positives"] == 1
    assert fam.evaluate_topics(model, texts, ["a", "b"], ["a", "b"], opts)["accuracy"] == 1.0
    assert fam.score(model, [], "__label__a", opts).shape == (0,) and fam.predict(model, [], opts)[0] == []


def test_a_texts_own_label_words_never_become_labels(tmp_path):
    """fastText takes any word starting with `__label__` in a training line for a label: a
    page saying `__label__hq` would have labelled itself (and made a class of its own). Such
    words lose one underscore, in training and in scoring alike; other text is unchanged."""
    from filters.fasttext_family import preprocess

    fam = classifiers.family("fasttext")
    params = FastTextParams(positive=["p"], negative=["n"], epochs=10).model_dump(mode="json")
    rng = np.random.default_rng(0)
    words = {"__label__hq": ["alpha", "apple", "atom"], "__label__cc": ["beta", "banana", "boat"]}
    hostile = ["__label__evil", "x\t__label__hq", "__LABEL__up", "a__label__b"]  # after a tab too; a word, not a label
    examples = [(lab, " ".join(rng.choice(ws, 6)) + " " + hostile[i % 4]) for i in range(40) for lab, ws in words.items()]
    model = fam.train(examples, params, 0, tmp_path / fam.model_file)
    assert sorted(fam.labels(str(tmp_path / "model.bin"))) == ["cc", "hq"]
    lowered = {**fam.options(params), "lowercase": True}
    assert preprocess("__LABEL__up and __label__hq\tx\v__label__y", True) == "_label__up and _label__hq\tx _label__y"
    assert preprocess("a __label__hq b", False) == "a _label__hq b" and preprocess("a__label__hq", False) == "a__label__hq"
    opts = fam.options(params)
    assert fam.score(model, ["alpha __label__hq"], "__label__hq", opts) == fam.score(model, ["alpha _label__hq"], "__label__hq", opts)
    assert fam.score(model, ["ALPHA __LABEL__hq"], "__label__hq", lowered) == fam.score(model, ["alpha _label__hq"], "__label__hq", lowered)
    plain = "Text without the prefix: lines\njoined, tabs\tkept, CASE kept."
    assert preprocess(plain, False) == "Text without the prefix: lines joined, tabs\tkept, CASE kept."


def test_fasttext_trains_the_same_model_whatever_the_process_trained_before(tmp_path, wiki_texts):
    """A second training of the same examples in one process gave another model with small
    `bucket`s (1 of 3 with 20,000 here; "Encountered NaN" after other work), so a classifier
    depended on what its worker had run before. Each training is a process of its own now:
    five trainings in this process, the same model bytes."""
    fam = classifiers.family("fasttext")
    params = FastTextParams(positive=["p"], negative=["n"], epochs=3, bucket=20000).model_dump(mode="json")
    words = " ".join(wiki_texts[:400]).split()
    rng = np.random.default_rng(1)
    examples = [(fam.class_label("p"), t) for t in wiki_texts[:300]] + \
        [(fam.negative_label, " ".join(rng.choice(words, 60))) for _ in range(300)]
    got = set()
    for i in range(5):
        fam.train(examples, params, 0, tmp_path / f"m{i}.bin")
        got.add((tmp_path / f"m{i}.bin").read_bytes())
    assert len(got) == 1
