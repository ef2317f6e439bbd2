"""The `sentence-transformers` embedding backend: a sentence-transformers model folder
(MiniLM, BGE, FineWeb-Edu's classifier body saved with `SentenceTransformer.save`), read
from a local path, never from a hub.

Why a module of its own: a sentence-transformers folder is a pipeline (`modules.json`:
Transformer, then Pooling, then perhaps Normalize), and a user who saved one expects the
vectors that pipeline gives, not the onnx backend's mean over token outputs. The folder is
run the way it says:

- with its **ONNX export** (`onnx/model.onnx`, what `SentenceTransformer(path,
  backend="onnx").save(path)` writes, or `model.onnx`) through onnxruntime, one thread: no
  torch. The Pooling module's `config.json` decides the pooling (cls, mean, max,
  mean_sqrt_len, lasttoken; several are concatenated in sentence-transformers' order), and
  `sentence_bert_config.json`'s `max_seq_length` caps the tokens (with `max_tokens`),
  truncating as the library does, so the special tokens stay;
- without an export, through the `sentence_transformers` library itself (`pip install
  'curate[sentence-transformers]'`, which needs torch), on the CPU, with
  `local_files_only`.

Modules this cannot run as the library would (Dense, a weighted mean, a custom module) are an
error naming the module and the two ways out. Vectors are L2-normalised, as every backend's.

Example (a mixture):

    classifiers:
      edu: {type: regression, model: ./models/fineweb-edu-st, annotations: edu.csv}
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from filters.embeddings import EmbeddingBackend, normalise, onnx_pooled, register_backend

POOLING_ORDER = ("cls_token", "max_tokens", "mean_tokens", "mean_sqrt_len_tokens", "lasttoken")  # the library's concat order
UNSUPPORTED_POOLING = ("weightedmean_tokens",)


KNOWN_MODULES = {f"sentence_transformers.models.{k}": k for k in ("Transformer", "Pooling", "Normalize")}


def is_folder(folder: Path) -> bool:
    """A sentence-transformers model folder: it has a modules.json."""
    return (folder / "modules.json").is_file()


def _modules(folder: Path) -> tuple[dict, list[str]]:
    """(the Transformer module, the pooling modes) of a folder's pipeline; a ValueError names
    a module this backend cannot run."""
    mods = json.loads((folder / "modules.json").read_text())
    transformer, modes = None, ["mean_tokens"]
    for m in sorted(mods, key=lambda m: m.get("idx", 0)):
        typ = m.get("type", "")
        kind = KNOWN_MODULES.get(typ, "other" if re.fullmatch(r"sentence_transformers\.models\.[A-Za-z]\w*", typ) else None)
        if kind is None:  # by its whole path: `anypkg.Transformer` would have the library import anypkg
            raise ValueError(f"{folder}/modules.json: module {m.get('name')!r} has type {typ!r}; this backend runs "
                             f"only {', '.join(sorted(KNOWN_MODULES))} (a model folder never names code to import)")
        if kind == "Transformer":
            transformer = m
        elif kind == "Pooling":
            cfg = json.loads((folder / m["path"] / "config.json").read_text())
            bad = [p for p in UNSUPPORTED_POOLING if cfg.get(f"pooling_mode_{p}")]
            modes = [p for p in POOLING_ORDER if cfg.get(f"pooling_mode_{p}")]
            if bad or not modes:
                raise ValueError(f"{folder}: pooling {bad or 'none'} is not supported here; use cls, mean, max, "
                                 "mean_sqrt_len or lasttoken pooling")
        elif kind != "Normalize":
            raise ValueError(f"{folder}: module {m.get('name')} ({m.get('type')}) cannot run without the "
                             "sentence_transformers library; install it (pip install 'curate[sentence-transformers]') "
                             "and remove the folder's ONNX export, or use a model of Transformer, Pooling and Normalize")
    if transformer is None:
        raise ValueError(f"{folder}/modules.json has no Transformer module: not a sentence encoder this backend runs")
    return transformer, modes


def _onnx_file(folder: Path, transformer: dict) -> Path | None:
    base = folder / transformer.get("path", "")
    for p in (base / "onnx" / "model.onnx", base / "model.onnx"):
        if p.is_file():
            return p
    return None


def _max_seq_length(folder: Path) -> int | None:
    p = folder / "sentence_bert_config.json"
    return json.loads(p.read_text()).get("max_seq_length") if p.is_file() else None


def pool(out: np.ndarray, mask: np.ndarray, modes: list[str]) -> np.ndarray:
    """Token outputs (batch, seq, dim) pooled as a sentence-transformers Pooling module does,
    the modes concatenated in its order."""
    m = mask[..., None].astype(np.float32)
    n = np.maximum(m.sum(axis=1), 1.0)
    parts = []
    for mode in modes:
        if mode == "cls_token":
            parts.append(out[:, 0])
        elif mode == "max_tokens":
            parts.append(np.where(m > 0, out, -1e9).max(axis=1))
        elif mode == "mean_tokens":
            parts.append((out * m).sum(axis=1) / n)
        elif mode == "mean_sqrt_len_tokens":
            parts.append((out * m).sum(axis=1) / np.sqrt(n))
        elif mode == "lasttoken":
            last = np.maximum(mask.sum(axis=1) - 1, 0)
            parts.append(out[np.arange(len(out)), last])
    return np.concatenate(parts, axis=1).astype(np.float32)


@register_backend("sentence-transformers", version="1",
                  libraries=("tokenizers", "onnxruntime", "sentence_transformers", "torch"))
class SentenceTransformersBackend(EmbeddingBackend):
    """A sentence-transformers model folder (modules.json): its ONNX export through onnxruntime (`curate[onnx]`), else the library (`curate[sentence-transformers]`, torch); pooling as its Pooling module says."""

    def load(self, folder: str | None):
        if folder is None:
            raise ValueError("the sentence-transformers backend reads a local folder: set `model:` to a folder that "
                             "SentenceTransformer.save wrote (models are never downloaded at run time)")
        d = Path(folder)
        if not is_folder(d):
            raise FileNotFoundError(f"{folder}/modules.json is missing: not a sentence-transformers model folder")
        transformer, modes = _modules(d)
        cap = _max_seq_length(d)
        onnx = _onnx_file(d, transformer)
        if onnx is None:
            try:
                from sentence_transformers import SentenceTransformer
            except ImportError:
                raise ImportError(f"{folder} has no ONNX export (onnx/model.onnx) and sentence_transformers is not "
                                  "installed: export it once (SentenceTransformer(path, backend='onnx').save(path)) "
                                  "or pip install 'curate[sentence-transformers]'") from None
            import torch

            torch.set_num_threads(1)  # one core per task, as Ray schedules it
            return ("library", SentenceTransformer(str(d), device="cpu", local_files_only=True), cap)
        try:
            import onnxruntime as ort
        except ImportError:
            raise ImportError("running a sentence-transformers folder's ONNX export needs onnxruntime: "
                              "pip install 'curate[onnx]'") from None
        from tokenizers import Tokenizer

        tok_file = d / transformer.get("path", "") / "tokenizer.json"
        if not tok_file.is_file():
            raise FileNotFoundError(f"{tok_file} is missing: the folder's tokenizer (a fast tokenizer's tokenizer.json)")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        sess = ort.InferenceSession(str(onnx), opts, providers=["CPUExecutionProvider"])
        tok = Tokenizer.from_file(str(tok_file))
        tok.no_padding()
        return ("onnx", (tok, sess, [i.name for i in sess.get_inputs()], modes), cap)

    def identity(self, folder: str | None) -> dict:
        from filters.embeddings import folder_files, loaded

        d = Path(folder)
        kind, handle, _ = loaded(folder)
        # the width of what embed returns (an export's output may have a symbolic width, or pool already)
        dim = int(self.embed((kind, handle, None), ["a"], 8).shape[1]) if kind == "onnx" else \
            int(handle.get_sentence_embedding_dimension())
        return {"backend": "sentence-transformers", "model": d.name, "dim": dim,
                "files": folder_files(d)}  # every file: external ONNX weights too

    def embed(self, handle, texts: list[str], max_tokens: int) -> np.ndarray:
        kind, h, cap = handle
        limit = min(max_tokens, cap) if cap else max_tokens
        if kind == "library":
            h.max_seq_length = limit
            if not texts:
                return np.zeros((0, int(h.get_sentence_embedding_dimension())), np.float32)
            return normalise(np.asarray(h.encode(texts, batch_size=32, convert_to_numpy=True), np.float32))
        tok, sess, names, modes = h
        if not texts:
            return self.embed(handle, ["a"], 8)[:0]
        tok.enable_truncation(limit)  # as the library truncates: the special tokens stay
        ids = [e.ids for e in tok.encode_batch(texts)]
        return onnx_pooled(sess, names, ids, lambda out, mask: pool(out, mask, modes))
