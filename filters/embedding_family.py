"""The embedding classifier family (`classifiers.<name>.type: embedding`): a linear probe
on document embeddings.

Why: a fastText model learns its own features from the examples, which for a few thousand
examples means mostly their words. A probe on a pretrained embedding (filters/embeddings.py,
WordLlama's by default) starts from features that already place paraphrases and related
topics together, so a small example set generalises further; and the same vectors serve
semantic dedup and clusters. Binary (quality: positive against negative) or multinomial
(topics: one class per label), scikit-learn's logistic regression over standardised
embeddings, with a fixed solver and seed, so the same sample gives the same probe bytes.

The probe file (`probe.json`) is plain JSON: the embedding's identity (backend, model,
files' sha256), `max_tokens`, the classes, the standardisation and the coefficients. A probe
scored with another embedding than it was trained on is an error naming both.
"""

from __future__ import annotations

import functools
from typing import ClassVar, Literal

import numpy as np
from pydantic import Field, field_validator

from filters import embeddings
from filters.classifiers import ClassifierFamily, ClassifierParams, register_classifier

FORMAT = "curate-embedding-probe"


class EmbeddingParams(ClassifierParams):
    """A logistic probe on document embeddings (WordLlama's by default): quality from positive and negative
    examples, or topics from labels."""

    type: Literal["embedding"] = Field("embedding", description="the classifier kind")
    model: str = Field(embeddings.DEFAULT_BACKEND, description="the embedding: a backend name (`curate embeddings` "
                       "lists them) or a local folder: a sentence-transformers model, or model.onnx and tokenizer.json")
    probe: str | None = Field(None, description="a probe file this family wrote before (probe.json in the train step's "
                              "folder; relative to the YAML file) instead of training")
    max_tokens: int = Field(embeddings.DEFAULT_MAX_TOKENS, ge=1, description="tokens of a document embedded (the rest "
                            "is cut, so one huge page costs no more than a long one)")
    dtype: Literal["float16", "int8"] = Field("float16", description="the vectors as the embed-<source> attribute stores "
                                              "them (float16, or int8 with a scale a row): trained and scored as stored")
    c: float = Field(1.0, gt=0, description="inverse regularisation strength of the logistic regression (higher: "
                     "fits the examples closer)")
    max_iter: int = Field(1000, ge=10, description="the solver's iterations at most")

    pretrained_key: ClassVar[str] = "probe"

    @field_validator("model")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        return embeddings.check_ref(v)


def _logits(probe: dict, x: np.ndarray) -> np.ndarray:
    z = (x.astype(np.float64) - probe["mean"]) / probe["scale"]
    return z @ probe["coef"].T + probe["intercept"]


def probabilities(probe: dict, texts: list[str]) -> np.ndarray:
    """(texts, classes) probabilities, float64."""
    return probabilities_of(probe, embeddings.head_vectors(probe, texts))


def probabilities_of(probe: dict, x: np.ndarray) -> np.ndarray:
    """(documents, classes) probabilities of stored embeddings, float64."""
    z = _logits(probe, x)
    if len(probe["classes"]) == 2:  # scikit-learn's binary model: one row of coefficients, for classes[1]
        p1 = 1.0 / (1.0 + np.exp(-z[:, 0]))
        return np.stack([1.0 - p1, p1], axis=1)
    z -= z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _f32(p: np.ndarray) -> np.ndarray:
    out = np.clip(p.astype(np.float32), 0.0, 1.0)
    out[out <= 0] = 0.0  # never -0.0: thresholds compare the float bits
    return out


@functools.lru_cache(maxsize=4)
def load(path: str) -> dict:
    """A probe file, once per worker process and path; its embedding checked against the installed one."""
    return embeddings.read_head(path, FORMAT, "a probe of the embedding family (probe.json)", "probe")


@register_classifier("embedding", version="2", libraries=("wordllama", "sklearn"))  # 2: float16 vectors, as stored
class Embedding(ClassifierFamily):
    """Logistic probes on document embeddings (WordLlama's by default): binary quality or multinomial topics."""

    Params = EmbeddingParams
    title = "an embedding probe"
    model_file = "probe.json"
    reads_vectors = True

    def options(self, params: dict) -> dict:
        return {"embedding": params["model"], "max_tokens": params["max_tokens"], "dtype": params["dtype"]}

    def train(self, examples: list[tuple[str, str]], params: dict, seed: int, path) -> dict:
        from sklearn.linear_model import LogisticRegression

        labels = [lab for lab, _ in examples]
        x = embeddings.stored(params["model"], [t for _, t in examples], params["max_tokens"], params["dtype"]).astype(np.float64)
        mean, scale = x.mean(axis=0), x.std(axis=0)
        scale[scale == 0] = 1.0
        lr = LogisticRegression(C=params["c"], max_iter=params["max_iter"], solver="lbfgs", random_state=seed)
        lr.fit((x - mean) / scale, labels)
        probe = {"format": FORMAT, "version": 1, "embedding": embeddings.identity(params["model"]),
                 "max_tokens": params["max_tokens"], "dtype": params["dtype"], "classes": [str(c) for c in lr.classes_],
                 "mean": mean, "scale": scale, "coef": lr.coef_, "intercept": lr.intercept_}
        embeddings.write_head(path, probe)
        return load.__wrapped__(str(path))

    def load(self, path: str) -> dict:
        return load(path)

    def labels(self, path: str) -> list[str]:
        return list(load.__wrapped__(path)["classes"])

    def score(self, model: dict, texts: list[str], label: str, options: dict) -> np.ndarray:
        return self.score_vectors(model, embeddings.head_vectors(model, texts),
                                  label, options)

    def score_vectors(self, model: dict, x: np.ndarray, label: str, options: dict) -> np.ndarray:
        embeddings.check_dtype(model, options)
        if not len(x):
            return np.zeros(0, np.float32)
        if label not in model["classes"]:
            raise ValueError(f"the probe's classes are {model['classes']}, not {label!r}: set the classifier's `label` "
                             "to one of them")
        return _f32(probabilities_of(model, x)[:, model["classes"].index(label)])

    def predict(self, model: dict, texts: list[str], options: dict) -> tuple[list[str], np.ndarray]:
        return self.predict_vectors(model, embeddings.head_vectors(model, texts),
                                    options)

    def predict_vectors(self, model: dict, x: np.ndarray, options: dict) -> tuple[list[str], np.ndarray]:
        embeddings.check_dtype(model, options)
        if not len(x):
            return [], np.zeros(0, np.float32)
        p = probabilities_of(model, x)
        top = p.argmax(axis=1)
        return [model["classes"][i] for i in top.tolist()], _f32(p[np.arange(len(top)), top])
