"""The classifier contract and the registry of classifier families.

Why: the classify stage (pipeline/steps/classify/) should not know which kind of model it
trains, so that a new kind (embeddings, a regression head ...) is one module and one
registration, as a filter type is (filters/base.py). The stage owns everything around the
model: which sources and files are examples, the seeded sample, the 90/10 split, the
steps and their hashes, thresholds, buckets, topics, `sample.parquet` and `eval.json`'s
example counts. A family owns the model:

    train     examples ((label, text) of the training split, in order) -> the model file
    load      a model file, once per worker process
    labels    a model file's labels, as topic names
    score     a batch of texts -> P(label) each (quality)
    predict   a batch of texts -> top label and its probability each (topics)
    evaluate  held-out examples -> eval.json's metrics (binary, or per topic)

and its parameters, `Params`: the `classifiers.<name>` mapping of `type: <family>`, whose
`type` is a Literal of the family's name (the config's discriminated union over the
registered families, pipeline/config/models.py). A family is registered by name:

    @register_classifier("fasttext")
    class FastText(ClassifierFamily):
        Params = FastTextParams
        def train(self, examples, params, seed, path): ...

`curate classifiers` lists the registry. Families take and give plain data (dicts of
parameters, lists of texts, numpy arrays): their calls run inside Ray tasks. This module
and the families import neither pipeline.config nor the stage (filters/ sits below them).
"""

from __future__ import annotations

import functools
import math
import typing
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from filters.registry import Registry


class ClassifierParams(BaseModel):
    """What every family's `classifiers.<name>` has: the stage's part (examples, sample, a
    pretrained model); a family adds its own keys and narrows `type` to its name."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)  # .nan, .inf: config errors
    type: str
    positive: list[str] = Field(default_factory=list, description="sources (after their filters and dedup) or files "
                                "(.txt a line each, .jsonl with `text`, .parquet; relative to the YAML file) of positive examples")
    negative: list[str] = Field(default_factory=list, description="sources or files of negative examples")
    labels: dict[str, list[str]] | None = Field(None, description="a multi-class (topic) classifier instead of positive/"
                                                "negative: label -> the sources or files of its examples")
    model: str | None = Field(None, description="a pretrained model file of the family (relative to the YAML file) "
                              "instead of training")
    label: str = Field("__label__hq", description="the positive label")
    max_examples_per_class: int = Field(20_000, ge=1, description="cap on training examples per class")
    seed: int = Field(0, description="sampling seed")

    pretrained_key: ClassVar[str] = "model"  # the key naming a pretrained model file of the family (then no training)
    graded: ClassVar[bool] = False  # trained from an `annotations` file of graded documents, not from classes

    @property
    def pretrained(self) -> str | None:
        """The pretrained model file the classifier scores with instead of training, or None."""
        return getattr(self, self.pretrained_key)


class ClassifierFamily:
    """Subclass, set `Params`, implement train, load, labels, score and predict; `evaluate`
    and `evaluate_topics` compute eval.json's metrics from score and predict. Stateless:
    every call gets what it needs (`params`: the classifier's parameters as JSON, `options`:
    what `options(params)` picked from them)."""

    name: ClassVar[str]
    version: ClassVar[str] = "1"  # register_classifier(version=...): bumped when a model or a score changes
    libraries: ClassVar[tuple[str, ...]] = ()  # register_classifier(libraries=...): the packages it trains and scores with
    Params: ClassVar[type[ClassifierParams]]
    description: ClassVar[str] = ""
    title: ClassVar[str] = ""  # the family's name in messages ("fastText"); default: its registered name
    model_file: ClassVar[str] = "model.bin"  # the file training writes in its step directory
    negative_label: ClassVar[str] = "negative"  # a binary classifier's negative class, as the model names it
    # a text's score is the same bits whichever texts it is scored with (no batch padding, no batch
    # statistics): a variant's scoring then scores only the texts an earlier shard did not (steps/classify)
    scores_alone: ClassVar[bool] = False

    def class_label(self, name: str) -> str:
        """A topic's name as the model's label (labels() and predict() give the name back)."""
        return name

    def options(self, params: dict) -> dict:
        """What of the classifier's parameters changes a score or a prediction: it enters the
        scoring and topic steps' configs beside `model` and `label` (so no option takes those
        names) and reaches score and predict through the shard spec's `options`."""
        return {}

    def train(self, examples: list[tuple[str, str]], params: dict, seed: int, path) -> Any:
        """A model trained on `examples` ((label, text), in this order), written to `path`
        (committed atomically); returns the model for evaluation."""
        raise NotImplementedError

    def load(self, path: str) -> Any:
        """A model file (local or a URL), loaded once per worker process and path."""
        raise NotImplementedError

    def labels(self, path: str) -> list[str]:
        """The labels of a model file, as topic names, without keeping the model in memory."""
        raise NotImplementedError

    def score(self, model, texts: list[str], label: str, options: dict) -> np.ndarray:
        """P(label) of each text: float32 in [0, 1], never -0.0 (thresholds compare the bits)."""
        raise NotImplementedError

    def predict(self, model, texts: list[str], options: dict) -> tuple[list[str], np.ndarray]:
        """The top label (a topic name) of each text and its probability (float32 in [0, 1])."""
        raise NotImplementedError

    # Families on document embeddings (reads_vectors): the scoring and topic steps hand them the
    # `embed-<source>` attribute's vectors (float16 as stored, in float32) instead of the texts,
    # when the run embeds that source with the embedding of `options` ({"embedding", "max_tokens", "dtype"})
    reads_vectors: ClassVar[bool] = False

    def score_vectors(self, model, x: np.ndarray, label: str, options: dict) -> np.ndarray:
        """As `score`, from the documents' stored embeddings (n, dim)."""
        raise NotImplementedError

    def predict_vectors(self, model, x: np.ndarray, options: dict) -> tuple[list[str], np.ndarray]:
        """As `predict`, from the documents' stored embeddings (n, dim)."""
        raise NotImplementedError

    # A family that scores with other families (an ensemble) takes both: the texts, and the
    # stored embeddings of `ref` ((model, max_tokens, dtype)) for its members on that embedding
    mixed_inputs: ClassVar[bool] = False

    def score_mixed(self, model, texts: list[str], x: np.ndarray, ref: tuple, label: str, options: dict) -> np.ndarray:
        return self.score(model, texts, label, options)

    def evaluate(self, model, texts: list[str], positive: np.ndarray, label: str, options: dict) -> dict:
        """eval.json of a binary classifier: `positive` says which held-out texts are positive."""
        return binary_metrics(positive, self.score(model, texts, label, options))

    def evaluate_topics(self, model, texts: list[str], truth: list[str], labels: list[str], options: dict) -> dict:
        """eval.json of a topic classifier: `truth` is each held-out text's topic."""
        pred, _ = self.predict(model, texts, options)
        return label_metrics(truth, pred, labels)


# The module that registers each built-in family (registry() imports them all; a worker only
# the one it uses); the first is the default `type`. tests/filters/test_classifiers.py checks
# it against the registrations.
BUILTIN_MODULES = {"fasttext": "filters.fasttext_family", "embedding": "filters.embedding_family",
                   "regression": "filters.regression_family", "ensemble": "filters.ensemble_family"}
DEFAULT_TYPE = next(iter(BUILTIN_MODULES))
FAMILIES = Registry("classifier", BUILTIN_MODULES, hint=" (`curate classifiers` lists them with their parameters)",
                    builtin_first=True)
_REGISTRY = FAMILIES.types  # name -> class, as registered so far


def _params_type_is(name: str, cls: type[ClassifierFamily]) -> None:
    if typing.get_args(cls.Params.model_fields["type"].annotation) != (name,):
        raise ValueError(f"classifier type {name!r}: {cls.Params.__qualname__}.type must be Literal[{name!r}] "
                         "(the YAML `type:` picks the family by it)")


def register_classifier(name: str, version: str = "1", libraries: tuple[str, ...] = ()):
    """Class decorator: register a classifier family under `name` (the YAML `type:`).
    `version` and the installed versions of `libraries` (import names) enter the hashes of
    the steps that train, score and predict with it."""
    register = FAMILIES.register(name, version, libraries, check=_params_type_is)

    def wrap(cls: type[ClassifierFamily]) -> type[ClassifierFamily]:
        cls = register(cls)
        cls.title = cls.title or name
        return cls

    return wrap


def registry() -> dict[str, type[ClassifierFamily]]:
    """Every registered family, the built-in ones first in BUILTIN_MODULES' order (the first
    is the default `type`), then the others by name."""
    return FAMILIES.all()


@functools.cache
def family(name: str) -> ClassifierFamily:
    """The family registered as `name`; an unknown name is a KeyError listing the known ones."""
    return FAMILIES.get(name)()


def embeddings_of(classifiers: dict, c) -> list[tuple[str, int, str]]:
    """(model, max_tokens, dtype) of the embeddings classifier `c` scores from: its own, or its
    members' (an ensemble; `classifiers`: the mixture's, by name)."""
    if family(c.type).reads_vectors:
        return [(c.model, c.max_tokens, c.dtype)]
    return [r for n in (getattr(c, "members", None) or {}) for r in embeddings_of(classifiers, classifiers[n])]


def describe_registry() -> str:
    """Every classifier family with its parameters and defaults (`curate classifiers`)."""
    from filters.base import type_name

    lines = []
    for name, cls in registry().items():
        lines.append(f"{name} (v{cls.version}): {cls.description}")
        for fname, f in cls.Params.model_fields.items():
            if fname == "type":
                continue
            default = "required" if f.is_required() else f"default {f.get_default(call_default_factory=True)!r}"
            lines.append(f"    {fname}: {type_name(f.annotation)}, {default}" + (f". {f.description}" if f.description else ""))
        lines.append("")
    lines.append("classifiers.<name>.type picks the family (default: the first listed); sources use a classifier "
                 "with quality: {classifier: <name>} or topic: {classifier: <name>}")
    return "\n".join(lines)


# ---------------------------------------------------------------- eval.json's metrics


def _r(v):
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else round(float(v), 6)


def binary_metrics(y: np.ndarray, s: np.ndarray) -> dict:
    """Precision, recall and F1 at 0.5 and ROC AUC (ties counted half) of scores s for labels y."""
    y = y.astype(bool)
    pred = s >= 0.5
    tp, fp, fn = int((pred & y).sum()), int((pred & ~y).sum()), int((~pred & y).sum())
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    auc = None
    if n_pos and n_neg:
        order = np.argsort(s, kind="stable")
        ranks = np.empty(len(s))
        sorted_s = s[order]
        i = 0
        while i < len(s):  # average ranks over ties
            j = i
            while j + 1 < len(s) and sorted_s[j + 1] == sorted_s[i]:
                j += 1
            ranks[order[i : j + 1]] = (i + j) / 2 + 1
            i = j + 1
        auc = (ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
    return {"precision": _r(precision), "recall": _r(recall), "f1": _r(f1), "roc_auc": _r(auc),
            "accuracy": _r((pred == y).mean()), "positives": n_pos, "negatives": n_neg}


def label_metrics(truth: list[str], pred: list[str], labels: list[str]) -> dict:
    """Per label precision, recall, F1 and support of top-1 predictions, and accuracy."""
    out = {}
    for lab in labels:
        tp = sum(1 for t, p in zip(truth, pred, strict=True) if t == lab and p == lab)
        fp = sum(1 for t, p in zip(truth, pred, strict=True) if t != lab and p == lab)
        fn = sum(1 for t, p in zip(truth, pred, strict=True) if t == lab and p != lab)
        prec = tp / (tp + fp) if tp + fp else 0.0
        rec = tp / (tp + fn) if tp + fn else 0.0
        out[lab] = {"precision": _r(prec), "recall": _r(rec), "f1": _r(2 * prec * rec / (prec + rec) if prec + rec else 0.0),
                    "support": tp + fn}
    acc = sum(1 for t, p in zip(truth, pred, strict=True) if t == p) / len(truth) if truth else 0.0
    return {"labels": out, "accuracy": _r(acc), "validation": len(truth)}
