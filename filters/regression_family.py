"""The regression classifier family (`classifiers.<name>.type: regression`): a graded
score (FineWeb-Edu's 0-5 style) predicted from document embeddings.

Why: FineWeb-Edu, Nemotron-CC and Marin grade pages on a scale with an LLM, then train a
head on frozen embeddings to grade the corpus; a binary classifier cannot learn "how
educational", only "which side". The annotations are a file of `id, score, text` (CSV,
JSONL or Parquet; pipeline/steps/classify/graded.py reads it, holds out every tenth by a
seeded hash and writes eval.json: Spearman, Pearson and MAE on the held-out tenth). The
head is ridge regression (default) or a small MLP (scikit-learn, one hidden ReLU layer),
over standardised embeddings (filters/embeddings.py), seeded.

The score attribute is the prediction divided by `scale` (default: the largest score in
the annotations) and clipped to [0, 1], so the stage's thresholds, exact keep fractions
and quantile buckets work unchanged: with grades 0-5, `min_score: 0.6` keeps predictions
of 3 and above, and `edges: [0.4, 0.6, 0.8]` makes cells of grades 2-3, 3-4, 4 and up.
The model file (`head.json`) is plain JSON, the same bytes for the same annotations.
"""

from __future__ import annotations

import functools
from typing import ClassVar, Literal

import numpy as np
from pydantic import Field, field_validator

from filters import embeddings
from filters.classifiers import ClassifierFamily, ClassifierParams, register_classifier

FORMAT = "curate-regression-head"


class RegressionParams(ClassifierParams):
    """A regression head on document embeddings, trained from graded annotations (`id, score, text`), FineWeb-Edu
    style; the score is the prediction over `scale`."""

    type: Literal["regression"] = Field("regression", description="the classifier kind")
    annotations: str | None = Field(None, description="a file of graded documents (CSV, JSONL or Parquet with columns "
                                    "id, score, text; relative to the YAML file)")
    model: str = Field(embeddings.DEFAULT_BACKEND, description="the embedding: a backend name (`curate embeddings` "
                       "lists them) or a local folder: a sentence-transformers model, or model.onnx and tokenizer.json")
    probe: str | None = Field(None, description="a head file this family wrote before (head.json) instead of training")
    head: Literal["ridge", "mlp"] = Field("ridge", description="ridge regression, or an MLP with one hidden layer")
    alpha: float = Field(1.0, gt=0, description="L2 penalty (ridge's alpha, the MLP's weight decay)")
    hidden: int = Field(64, ge=1, description="the MLP's hidden units")
    scale: float | None = Field(None, gt=0, description="the score a document scores 1.0 at; default: the largest "
                                "score in the annotations")
    max_tokens: int = Field(embeddings.DEFAULT_MAX_TOKENS, ge=1, description="tokens of a document embedded")
    dtype: Literal["float16", "int8"] = Field("float16", description="the vectors as the embed-<source> attribute stores "
                                              "them (float16, or int8 with a scale a row): trained and scored as stored")

    pretrained_key: ClassVar[str] = "probe"
    graded: ClassVar[bool] = True

    @field_validator("model")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        return embeddings.check_ref(v)


def predict_raw(model: dict, texts: list[str]) -> np.ndarray:
    """The head's predictions, in the annotations' units (float64)."""
    return predict_of(model, embeddings.head_vectors(model, texts))


def predict_of(model: dict, x: np.ndarray) -> np.ndarray:
    """The head's predictions from stored embeddings (float64)."""
    z = (x.astype(np.float64) - model["mean"]) / model["scale_x"]
    if model["head"] == "ridge":
        return z @ model["coef"] + model["intercept"]
    h = np.maximum(0.0, z @ model["w1"] + model["b1"])
    return (h @ model["w2"] + model["b2"]).ravel()


@functools.lru_cache(maxsize=4)
def load(path: str) -> dict:
    """A head file, once per worker process and path; its embedding checked against the installed one."""
    return embeddings.read_head(path, FORMAT, "a head of the regression family (head.json)", "probe")


@register_classifier("regression", version="2", libraries=("wordllama", "sklearn"))  # 2: float16 vectors, as stored
class Regression(ClassifierFamily):
    """Regression heads (ridge or a small MLP) on document embeddings, trained from graded annotations (FineWeb-Edu style)."""

    Params = RegressionParams
    title = "a regression head"
    model_file = "head.json"
    reads_vectors = True

    def options(self, params: dict) -> dict:
        return {"embedding": params["model"], "max_tokens": params["max_tokens"], "dtype": params["dtype"]}

    def train(self, examples: list[tuple[float, str]], params: dict, seed: int, path) -> dict:
        y = np.array([float(s) for s, _ in examples])
        x = embeddings.stored(params["model"], [t for _, t in examples], params["max_tokens"], params["dtype"]).astype(np.float64)
        mean, sx = x.mean(axis=0), x.std(axis=0)
        sx[sx == 0] = 1.0
        z = (x - mean) / sx
        head = {"format": FORMAT, "version": 1, "embedding": embeddings.identity(params["model"]),
                "max_tokens": params["max_tokens"], "dtype": params["dtype"], "head": params["head"], "mean": mean, "scale_x": sx,
                "scale": float(params["scale"] or max(float(y.max()), 1e-9))}
        if params["head"] == "ridge":
            from sklearn.linear_model import Ridge

            r = Ridge(alpha=params["alpha"]).fit(z, y)
            head.update(coef=r.coef_, intercept=float(r.intercept_))
        else:
            from sklearn.neural_network import MLPRegressor

            r = MLPRegressor(hidden_layer_sizes=(params["hidden"],), alpha=params["alpha"], random_state=seed,
                             max_iter=500, early_stopping=False).fit(z, y)
            head.update(w1=r.coefs_[0], b1=r.intercepts_[0], w2=r.coefs_[1], b2=r.intercepts_[1])
        embeddings.write_head(path, head)
        return load.__wrapped__(str(path))

    def load(self, path: str) -> dict:
        return load(path)

    def labels(self, path: str) -> list[str]:
        return []

    def score(self, model: dict, texts: list[str], label: str, options: dict) -> np.ndarray:
        return self.score_vectors(model, embeddings.head_vectors(model, texts),
                                  label, options)

    def score_vectors(self, model: dict, x: np.ndarray, label: str, options: dict) -> np.ndarray:
        embeddings.check_dtype(model, options)
        if not len(x):
            return np.zeros(0, np.float32)
        out = np.clip((predict_of(model, x) / model["scale"]).astype(np.float32), 0.0, 1.0)
        out[out <= 0] = 0.0  # never -0.0: thresholds compare the float bits
        return out

    def predict(self, model, texts, options):
        raise ValueError("a regression head grades documents; it has no topics (use it under `quality:`)")

    def evaluate_graded(self, model: dict, texts: list[str], truth: np.ndarray) -> dict:
        """eval.json of a regression: Spearman and Pearson correlation and mean absolute error of the
        predictions (in the annotations' units) on held-out annotations."""
        from scipy.stats import pearsonr, spearmanr

        pred = predict_raw(model, texts)
        r = lambda v: None if v is None or not np.isfinite(v) else round(float(v), 6)  # noqa: E731
        return {"spearman": r(spearmanr(pred, truth).statistic) if len(truth) > 2 else None,
                "pearson": r(pearsonr(pred, truth).statistic) if len(truth) > 2 else None,
                "mae": r(np.abs(pred - truth).mean()) if len(truth) else None, "validation": len(truth),
                "scale": model["scale"]}
