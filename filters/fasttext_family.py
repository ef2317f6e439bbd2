"""The fastText classifier family (`classifiers.<name>.type: fasttext`, the default).

Why a module of its own: everything that knows fastText (its label syntax, its local-file
input, its parameters, its predict) is here, behind the family interface of
filters/classifiers.py, so the classify stage never calls fastText itself.

Preprocessing is DCLM's: the text's lines joined with single spaces (fastText reads one
example a line), lowercased when the classifier says so; and a word of the text that starts
with `__label__` loses one underscore, since fastText takes any such word in a training
line for a label (a page saying `__label__hq` would label itself). Scoring and prediction
preprocess the same way, so the model sees the text it was trained on. Training is fastText's
supervised mode with one thread and a fixed seed, so the same sample gives the same
model bytes. A score is the probability fastText gives the positive label (for softmax
with two labels, 1 - P(negative) when the positive label is not the top one).
"""

from __future__ import annotations

import functools
import os
import re
import tempfile
from typing import Literal

import numpy as np
from pydantic import Field

from filters.classifiers import ClassifierFamily, ClassifierParams, register_classifier

NEGATIVE_LABEL = "__label__cc"  # DCLM's name for the random-web class
PREFIX = "__label__"


class FastTextParams(ClassifierParams):
    """fastText (as DCLM's quality classifier), the default type: trained in the run from positive and negative
    examples (quality) or from labels (topics), or a pretrained `model`."""

    type: Literal["fasttext"] = Field("fasttext", description="the classifier kind")
    model: str | None = Field(None, description="a pretrained fastText model file (relative to the YAML file) instead of training")
    epochs: int = Field(5, ge=1, description="fastText epochs")
    lr: float = Field(0.1, gt=0, description="fastText learning rate")
    word_ngrams: int = Field(2, ge=1, description="fastText word n-grams")
    dim: int = Field(100, ge=1, description="fastText vector size")
    min_count: int = Field(1, ge=1, description="fastText minimum word count")
    loss: Literal["softmax", "hs", "ns", "ova"] = Field("softmax", description="fastText loss")
    bucket: int = Field(200_000, ge=1, description="fastText hash buckets for word n-grams (model size: bucket x dim x 4 bytes)")
    lowercase: bool = Field(False, description="lowercase text before training and scoring")


# `__label__` where fastText's tokenizer starts a word: after its whitespace (' ', \t, \n, \v, \f, \r, \0) or at the start
_LABEL_WORD = re.compile(r"(?<![^ \t\n\v\f\r\x00])" + PREFIX)


def preprocess(text: str, lowercase: bool) -> str:
    t = " ".join(text.strip().splitlines())
    t = t.lower() if lowercase else t
    return _LABEL_WORD.sub(PREFIX[1:], t) if PREFIX in t else t  # a text's own `__label__x` is a word, not a label


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
    return ([ls[0].removeprefix(PREFIX) if len(ls) else "" for ls in labels],
            np.clip(np.array([float(ps[0]) if len(ps) else 0.0 for ps in probs], np.float32), 0.0, 1.0))


# fastText trains in a process of its own: a second training of the same file in one process can give
# another model (with `bucket: 20000`, 1 of 3 in a bare process, and "Encountered NaN" after other
# work), so a model depended on what the worker had run before. The first training of a fresh
# process gives the same bytes every time (5 of 5); a child costs ~0.2 s, once per classifier.
_CHILD = """
import json, sys
import fasttext
a = json.loads(sys.argv[1])
try:
    model = fasttext.train_supervised(**a)
except RuntimeError as e:
    print(e, file=sys.stderr)
    sys.exit(3 if "NaN" in str(e) else 1)
model.save_model(sys.argv[2])
"""


def train(path: str, params: dict, seed: int, out: str):
    """fastText's supervised mode on a local file of `__label__x text` lines, in a fresh
    process (above), the model written to the local file `out` and loaded from it."""
    import json
    import subprocess
    import sys

    args = {"input": path, "epoch": params["epochs"], "lr": params["lr"], "wordNgrams": params["word_ngrams"],
            "dim": params["dim"], "minCount": params["min_count"], "loss": params["loss"], "bucket": params["bucket"],
            "thread": 1, "seed": seed, "verbose": 0}
    r = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(args), out], capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    if r.returncode == 3:
        from pipeline.errors import InputError

        raise InputError(
            f"fastText diverged while training (its loss became NaN) with lr {params['lr']}, dim {params['dim']}, "
            f"{params['epochs']} epochs: it happens on some example orders with a high learning rate or few dimensions; "
            "lower the classifier's `lr` (e.g. 0.05), raise `dim` (the default is 100), or change `seed`") from None
    if r.returncode != 0:
        raise RuntimeError(f"fastText's training process failed (exit {r.returncode}): {r.stderr.strip()[-2000:]}")
    return open_model(out)  # not `load`: its cache is keyed by a path that is about to be removed


def save(local: str, final) -> None:
    """The model file `local` at `final` (local or a URL), written to a temporary name and renamed into place."""
    from pipeline.io import atomic, fs

    tmp = atomic.tmp_path(final)
    fs.copy(local, tmp)
    atomic.commit(tmp, final)


@register_classifier("fasttext", version="2", libraries=("fasttext",))  # 2: a text's own `__label__` words escaped
class FastText(ClassifierFamily):
    """fastText supervised classifiers (as DCLM's quality filter): binary quality or multi-class topics."""

    Params = FastTextParams
    title = "fastText"
    negative_label = NEGATIVE_LABEL
    scores_alone = True  # fastText predicts each line by itself

    def class_label(self, name: str) -> str:
        return f"{PREFIX}{name}"

    def options(self, params: dict) -> dict:
        return {"lowercase": params["lowercase"]}

    def train(self, examples: list[tuple[str, str]], params: dict, seed: int, path):
        with tempfile.TemporaryDirectory(prefix="curate-train-") as d:  # fastText reads and writes local files
            with open(f"{d}/train.txt", "w", encoding="utf-8") as f:
                for lab, text in examples:
                    f.write(f"{lab} {preprocess(text, params['lowercase'])}\n")
            model = train(f"{d}/train.txt", params, seed, f"{d}/model.bin")
            save(f"{d}/model.bin", path)
        return model

    def load(self, path: str):
        return load(path)

    def labels(self, path: str) -> list[str]:
        return [lab.removeprefix(PREFIX) for lab in open_model(path).get_labels()]  # not kept in memory

    def score(self, model, texts: list[str], label: str, options: dict) -> np.ndarray:
        return scores(model, texts, label, options["lowercase"])

    def predict(self, model, texts: list[str], options: dict) -> tuple[list[str], np.ndarray]:
        return top_labels(model, texts, options["lowercase"])
