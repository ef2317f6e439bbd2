"""fastText quality classifiers: preprocessing, training, scoring, evaluation.

Preprocessing is DCLM's: the text's lines joined with single spaces (fastText reads one
example a line), lowercased when the classifier says so. Training is fastText's
supervised mode with one thread and a fixed seed, so the same sample gives the same
model bytes. A score is the probability fastText gives the positive label (for softmax
with two labels, 1 - P(negative) when the positive label is not the top one).
"""

from __future__ import annotations

import functools
import math

import numpy as np

NEGATIVE_LABEL = "__label__cc"  # DCLM's name for the random-web class


def preprocess(text: str, lowercase: bool) -> str:
    t = " ".join(text.strip().splitlines())
    return t.lower() if lowercase else t


def open_model(path: str):
    """A fastText model (a URL is copied to a local file first: fastText only opens local files)."""
    from fasttext.FastText import (
        _FastText,  # fasttext.load_model without its stderr warning
    )

    from pipeline.io import fs

    with fs.local_file(path) as local:
        return _FastText(model_path=str(local))


@functools.lru_cache(maxsize=4)
def load(path: str):
    """One model per worker process and path."""
    return open_model(path)


def scores(model, texts: list[str], label: str, lowercase: bool) -> np.ndarray:
    """P(label) for each text, batched through fastText's predict."""
    if not texts:
        return np.zeros(0, np.float32)
    labels, probs = model.predict([preprocess(t, lowercase) for t in texts], k=-1, threshold=0.0)
    out = np.empty(len(texts), np.float32)
    for i, (ls, ps) in enumerate(zip(labels, probs, strict=True)):
        out[i] = next((float(p) for lab, p in zip(ls, ps, strict=True) if lab == label), 0.0)
    out = np.clip(out, 0.0, 1.0)
    out[out <= 0] = 0.0  # never -0.0: thresholds compare the float bits
    return out


def top_labels(model, texts: list[str], lowercase: bool) -> tuple[list[str], np.ndarray]:
    """The top label (without `__label__`) and its probability for each text."""
    if not texts:
        return [], np.zeros(0, np.float32)
    labels, probs = model.predict([preprocess(t, lowercase) for t in texts], k=1, threshold=0.0)
    return ([ls[0].removeprefix("__label__") if len(ls) else "" for ls in labels],
            np.clip(np.array([float(ps[0]) if len(ps) else 0.0 for ps in probs], np.float32), 0.0, 1.0))


def evaluate_labels(truth: list[str], pred: list[str], labels: list[str]) -> dict:
    """Per label precision, recall, F1 and support of top-1 predictions, and accuracy."""
    r = lambda v: round(float(v), 6)  # noqa: E731
    out = {}
    for lab in labels:
        tp = sum(1 for t, p in zip(truth, pred, strict=True) if t == lab and p == lab)
        fp = sum(1 for t, p in zip(truth, pred, strict=True) if t != lab and p == lab)
        fn = sum(1 for t, p in zip(truth, pred, strict=True) if t == lab and p != lab)
        prec = tp / (tp + fp) if tp + fp else 0.0
        rec = tp / (tp + fn) if tp + fn else 0.0
        out[lab] = {"precision": r(prec), "recall": r(rec), "f1": r(2 * prec * rec / (prec + rec) if prec + rec else 0.0),
                    "support": tp + fn}
    acc = sum(1 for t, p in zip(truth, pred, strict=True) if t == p) / len(truth) if truth else 0.0
    return {"labels": out, "accuracy": r(acc), "validation": len(truth)}


def train(path: str, params: dict, seed: int):
    import fasttext

    try:
        return fasttext.train_supervised(
            input=path, epoch=params["epochs"], lr=params["lr"], wordNgrams=params["word_ngrams"], dim=params["dim"],
            minCount=params["min_count"], loss=params["loss"], bucket=params["bucket"], thread=1, seed=seed, verbose=0,
        )
    except RuntimeError as e:
        if "NaN" not in str(e):
            raise
        from pipeline.errors import InputError

        raise InputError(
            f"fastText diverged while training (its loss became NaN) with lr {params['lr']}, dim {params['dim']}, "
            f"{params['epochs']} epochs: it happens on some example orders with a high learning rate or few dimensions; "
            "lower the classifier's `lr` (e.g. 0.05), raise `dim` (the default is 100), or change `seed`") from None


def evaluate(y: np.ndarray, s: np.ndarray) -> dict:
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
        # average ranks over ties
        i = 0
        while i < len(s):
            j = i
            while j + 1 < len(s) and sorted_s[j + 1] == sorted_s[i]:
                j += 1
            ranks[order[i : j + 1]] = (i + j) / 2 + 1
            i = j + 1
        auc = (ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
    r = lambda v: None if v is None or (isinstance(v, float) and math.isnan(v)) else round(float(v), 6)
    return {"precision": r(precision), "recall": r(recall), "f1": r(f1), "roc_auc": r(auc), "accuracy": r((pred == y).mean()),
            "positives": n_pos, "negatives": n_neg}
