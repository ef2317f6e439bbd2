"""The ensemble classifier family (`classifiers.<name>.type: ensemble`): members'
scores, each mapped to its percentile rank, combined by a weighted mean, a max or a min.

Why percentile ranks: members of different families score on different scales (a
fastText probability piles up near 0 and 1, a probe's spreads, a regression's is a grade
over its scale); a mean of raw scores lets the most extreme member decide. Each member's
score is mapped through the distribution of its scores on the ensemble's own training
examples (1,001 quantiles kept in the model file), so every member counts as its weight
says (Marin's ensembles of quality classifiers, marin#615).

Training fits nothing: it scores the training examples with every member (each loaded by
its own family from the model file the plan hands over), keeps the quantiles, and writes
`ensemble.json` (members' types, model files and their sha256, labels, options, weights,
quantiles). eval.json is the stage's binary metrics of the ensemble's score, plus each
member's ROC AUC and F1 on the same held-out examples, so "at least as good as its best
member" is read off one file.
"""

from __future__ import annotations

import functools
from typing import ClassVar, Literal

import numpy as np
import orjson
from pydantic import Field

from filters.classifiers import ClassifierFamily, ClassifierParams, binary_metrics, family, register_classifier

FORMAT = "curate-ensemble"
QUANTILES = 1001


class EnsembleParams(ClassifierParams):
    """An ensemble of other classifiers: their scores as percentile ranks, combined by a weighted mean, max or min."""

    type: Literal["ensemble"] = Field("ensemble", description="the classifier kind")
    members: dict[str, float] = Field(min_length=1, description="the classifiers combined (names under `classifiers`) "
                                      "and their weights")
    combine: Literal["mean", "max", "min"] = Field("mean", description="a weighted mean of the members' percentile "
                                                   "ranks, or their max or min")

    members_key: ClassVar[str] = "members"


def _score_members(ens: dict, texts: list[str], x: np.ndarray | None = None, ref: tuple | None = None) -> np.ndarray:
    """(members, texts) percentile ranks of each member's score; a member on the embedding
    `ref` scores the stored embeddings `x` instead of embedding the texts again (the same
    scores: heads score the vectors as stored)."""
    out = []
    for m in ens["members"]:
        fam = family(m["type"])
        o = m["options"]
        if x is not None and fam.reads_vectors and (o.get("embedding"), o.get("max_tokens"), o.get("dtype", "float16")) == tuple(ref):
            s = fam.score_vectors(fam.load(m["path"]), x, m["label"], o).astype(np.float64)
        else:
            s = fam.score(fam.load(m["path"]), texts, m["label"], o).astype(np.float64)
        q = np.asarray(m["quantiles"])
        # the share of the reference at or below the score, interpolated between quantiles
        out.append(np.interp(s, q, np.linspace(0.0, 1.0, len(q))))
    return np.array(out)


def combined(ens: dict, texts: list[str], x: np.ndarray | None = None, ref: tuple | None = None) -> np.ndarray:
    r = _score_members(ens, texts, x, ref)
    w = np.array([m["weight"] for m in ens["members"]], np.float64)
    if ens["combine"] == "max":
        s = r.max(axis=0)
    elif ens["combine"] == "min":
        s = r.min(axis=0)
    else:
        s = (w[:, None] * r).sum(axis=0) / w.sum()
    out = np.clip(s.astype(np.float32), 0.0, 1.0)
    out[out <= 0] = 0.0
    return out


@functools.lru_cache(maxsize=4)
def load(path: str) -> dict:
    from pipeline.errors import InputError
    from pipeline.io import atomic, fs

    raw = orjson.loads(fs.path(path).read_bytes())
    if raw.get("format") != FORMAT:
        raise InputError(f"{path} is not an ensemble file (no \"format\": {FORMAT!r}); point `model` at an "
                         "ensemble.json a run of `type: ensemble` wrote, or remove it")
    for m in raw["members"]:
        try:
            sha = atomic.file_digest(fs.path(m["path"]))[1]
        except FileNotFoundError:
            raise InputError(f"{path}: member {m['name']}'s model {m['path']} is gone (a gc?); run again to retrain "
                             "it") from None
        if sha != m["sha256"]:
            raise InputError(f"{path}: member {m['name']}'s model {m['path']} changed since the ensemble was built; "
                             "run again to rebuild the ensemble")
    return raw


@register_classifier("ensemble", version="1")
class Ensemble(ClassifierFamily):
    """Ensembles of other classifiers: percentile ranks of their scores, combined by a weighted mean, max or min."""

    Params = EnsembleParams
    title = "an ensemble"
    model_file = "ensemble.json"
    mixed_inputs = True

    def options(self, params: dict) -> dict:
        return {}

    def train(self, examples: list[tuple[str, str]], params: dict, seed: int, path) -> dict:
        from pipeline.io import atomic, fs

        texts = [t for _, t in examples]
        members = []
        for name, m in sorted(params["member_models"].items()):
            fam = family(m["type"])
            s = fam.score(fam.load(m["path"]), texts, m["label"], m["options"]).astype(np.float64)
            members.append({"name": name, "type": m["type"], "path": m["path"], "label": m["label"],
                            "options": m["options"], "weight": params["members"][name],
                            "sha256": atomic.file_digest(fs.path(m["path"]))[1],
                            "quantiles": np.quantile(s, np.linspace(0, 1, QUANTILES)).round(7).tolist()})
        ens = {"format": FORMAT, "version": 1, "combine": params["combine"], "members": members}
        atomic.write_bytes(path, orjson.dumps(ens, option=orjson.OPT_SORT_KEYS))
        return load.__wrapped__(str(path))

    def load(self, path: str) -> dict:
        return load(path)

    def labels(self, path: str) -> list[str]:
        return []

    def score(self, model: dict, texts: list[str], label: str, options: dict) -> np.ndarray:
        if not texts:
            return np.zeros(0, np.float32)
        return combined(model, texts)

    def score_mixed(self, model: dict, texts: list[str], x: np.ndarray, ref: tuple, label: str, options: dict) -> np.ndarray:
        if not texts:
            return np.zeros(0, np.float32)
        return combined(model, texts, x, ref)

    def predict(self, model, texts, options):
        raise ValueError("an ensemble scores documents; it has no topics (use it under `quality:`)")

    def evaluate(self, model, texts: list[str], positive: np.ndarray, label: str, options: dict) -> dict:
        ev = binary_metrics(positive, self.score(model, texts, label, options))
        ev["members"] = {}
        for m in model["members"]:
            fam = family(m["type"])
            mv = binary_metrics(positive, fam.score(fam.load(m["path"]), texts, m["label"], m["options"]))
            ev["members"][m["name"]] = {"roc_auc": mv["roc_auc"], "f1": mv["f1"]}
        return ev
