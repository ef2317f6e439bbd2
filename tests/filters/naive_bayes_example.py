"""A classifier family: multinomial naive Bayes over lowercased words, its model a JSON file.
The worked example of docs/extending.md (tests/filters/test_extending.py runs it)."""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from typing import Literal

import numpy as np
from pydantic import Field

from filters.classifiers import ClassifierFamily, ClassifierParams, register_classifier
from pipeline.io import atomic


class NaiveBayesParams(ClassifierParams):
    """Multinomial naive Bayes over lowercased words: a JSON model, no dependency."""

    type: Literal["naive_bayes"] = "naive_bayes"
    alpha: float = Field(1.0, gt=0, description="added to every word's count in every label")
    lowercase: bool = Field(True, description="lowercase text before counting its words")


def words(text: str, lowercase: bool) -> list[str]:
    return re.findall(r"\w+", text.lower() if lowercase else text)


@functools.lru_cache(maxsize=4)
def load(path: str) -> dict:
    return atomic.read_json(path)  # {label: {word: log P(word | label)}}


@register_classifier("naive_bayes")
class NaiveBayes(ClassifierFamily):
    """Multinomial naive Bayes over lowercased words (a worked example)."""

    Params = NaiveBayesParams
    model_file = "model.json"

    def options(self, params: dict) -> dict:
        return {"lowercase": params["lowercase"]}

    def train(self, examples, params, seed, path):
        counts: dict[str, Counter] = {}
        for label, text in examples:
            counts.setdefault(label, Counter()).update(words(text, params["lowercase"]))
        vocab = set().union(*counts.values())
        model = {lab: {w: math.log((c[w] + params["alpha"]) / (c.total() + params["alpha"] * len(vocab))) for w in vocab}
                 for lab, c in sorted(counts.items())}
        atomic.write_json(path, model)
        return model

    def load(self, path):
        return load(str(path))

    def labels(self, path):
        return list(atomic.read_json(path))

    def _probs(self, model, texts, options) -> tuple[list[str], np.ndarray]:
        labels = list(model)
        logp = np.array([[sum(model[lab].get(w, 0.0) for w in words(t, options["lowercase"])) for lab in labels]
                         for t in texts]).reshape(len(texts), len(labels))
        p = np.exp(logp - logp.max(axis=1, keepdims=True))
        return labels, (p / p.sum(axis=1, keepdims=True)).astype(np.float32)

    def score(self, model, texts, label, options):
        labels, p = self._probs(model, texts, options)
        return p[:, labels.index(label)] if label in labels else np.zeros(len(texts), np.float32)

    def predict(self, model, texts, options):
        labels, p = self._probs(model, texts, options)
        return [labels[i] for i in p.argmax(axis=1)], p.max(axis=1)
