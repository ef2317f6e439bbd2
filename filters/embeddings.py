"""Document embeddings: the backend contract and its registry (`curate embeddings` lists it).

Why a module of its own: a probe, a semantic dedup and embedding clusters all need one
vector per document, and none of them should know which model makes it. A backend owns
the model; its callers get unit-length float32 vectors, one per text:

    load      the model, once per worker process (functools.cache), never downloaded
    identity  what names the model's bytes (its files' sha256), for step hashes and checks
    embed     texts -> (n, dim) float32, L2-normalised (an empty text: the zero vector)

`wordllama` (the default) is WordLlama's static token embeddings, shipped in its wheel
(`l2_supercat_256`, 256 dimensions): a document is the mean of its tokens' vectors. Its
own `WordLlamaInference.embed` pads every batch to its longest text and gathers a
(batch, longest, 256) array, so one long page costs its batch's every row: here each text
is tokenized without padding, cut at `max_tokens`, and pooled as one sparse (texts x
vocabulary) count matrix times the weights (the same means; bench/embed.py compares the
two). Batches are sized by characters (a proxy for tokens that needs no tokenizing first), so a
task's memory is bounded by `BATCH_CHARS`, not by its longest document.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from filters.registry import Registry

BATCH_CHARS = 1 << 20  # text per tokenizer call (~250k tokens: a few MB of ids and counts)
DEFAULT_MAX_TOKENS = 2048


class EmbeddingBackend:
    """Subclass, register with `@register_backend(name, version, libraries)`, implement
    load, identity and embed. Stateless: the loaded model is passed back in."""

    name: ClassVar[str]
    version: ClassVar[str] = "1"
    libraries: ClassVar[tuple[str, ...]] = ()
    description: ClassVar[str] = ""

    def load(self, model: str | None) -> Any:
        """The model (`model`: a local folder the user names, or None for the backend's
        default); cached per process by `loaded`."""
        raise NotImplementedError

    def identity(self, model: str | None) -> dict:
        """{"backend", "model", "dim", "files": {name: sha256}}: what a probe records and checks."""
        raise NotImplementedError

    def embed(self, handle: Any, texts: list[str], max_tokens: int) -> np.ndarray:
        raise NotImplementedError


BUILTIN_MODULES = {"wordllama": "filters.embeddings", "onnx": "filters.embeddings", "sentence-transformers": "filters.st_encoder"}
DEFAULT_BACKEND = "wordllama"
BACKENDS = Registry("embedding backend", BUILTIN_MODULES, hint=" (`curate embeddings` lists them)", builtin_first=True)


def register_backend(name: str, version: str = "1", libraries: tuple[str, ...] = ()):
    return BACKENDS.register(name, version, libraries)


@functools.cache
def backend(name: str) -> EmbeddingBackend:
    """The backend registered as `name`; a miss is a KeyError listing the known ones."""
    return BACKENDS.get(name)()


def resolve(ref: str) -> tuple[str, str | None]:
    """(backend, folder) of a model reference: a registered backend's name (its own model),
    a sentence-transformers model folder (modules.json: the sentence-transformers backend),
    or a local folder holding `model.onnx` and `tokenizer.json` (the onnx backend)."""
    if ref in BACKENDS.all():
        return ref, None
    if "/" in ref or Path(ref).is_dir():
        if (Path(ref) / "modules.json").is_file():
            return "sentence-transformers", ref
        if (Path(ref) / "model.onnx").is_file():
            return "onnx", ref
        raise ValueError(f"{ref}: neither modules.json nor model.onnx in this folder; a local embedding model is a "
                         "folder SentenceTransformer.save wrote, or one with model.onnx and tokenizer.json (an ONNX "
                         "export of a sentence encoder)")
    raise KeyError(f"unknown embedding {ref!r}; known backends: {', '.join(BACKENDS.all())} (`curate embeddings`), "
                   "or a local folder with model.onnx and tokenizer.json")


def check_ref(ref: str) -> str:
    """A config value naming an embedding: a backend's name, or a path (checked once it is
    resolved against the YAML file's folder: config/checks.py)."""
    if ref not in BACKENDS.all() and "/" not in ref:
        raise ValueError(f"unknown embedding {ref!r}; known backends: {', '.join(BACKENDS.all())} (`curate embeddings`), "
                         "or a local folder with model.onnx and tokenizer.json (a path with a '/')")
    return ref


@functools.lru_cache(maxsize=4)
def loaded(ref: str) -> Any:
    """A model, loaded once per worker process (not per batch or per shard)."""
    name, folder = resolve(ref)
    return backend(name).load(folder)


def embed(ref: str, texts: list[str], max_tokens: int = DEFAULT_MAX_TOKENS) -> np.ndarray:
    """Unit-length float32 embeddings of `texts` with the model `ref` (a backend's name or a
    local folder), in batches of at most BATCH_CHARS characters of text (the first text of
    a batch whatever its length: its tokens are cut at `max_tokens` anyway)."""
    b, handle = backend(resolve(ref)[0]), loaded(ref)
    out = []
    lo = 0
    while lo < len(texts):
        hi, acc = lo + 1, len(texts[lo])
        while hi < len(texts) and acc + len(texts[hi]) <= BATCH_CHARS:
            acc += len(texts[hi])
            hi += 1
        out.append(b.embed(handle, texts[lo:hi], max_tokens))
        lo = hi
    v = np.concatenate(out) if out else np.zeros((0, identity(ref)["dim"]), np.float32)
    bad = np.flatnonzero(~np.isfinite(v).all(axis=1)) if len(v) else []
    if len(bad):  # one NaN row puts every document of a k-means in one cluster and keeps copies apart
        raise NonFiniteEmbedding(ref, bad)
    return v


class NonFiniteEmbedding(ValueError):
    """A model gave NaN or infinite vectors (an fp16 or quantised export overflowing); `rows`:
    their places in the texts given."""

    def __init__(self, ref: str, rows):
        self.rows = [int(r) for r in rows]
        super().__init__(f"the embedding model {ref} gave {len(self.rows)} non-finite vector(s) (NaN or inf), for "
                         f"text(s) {self.rows[:5]}: the model overflows on them (an fp16 or quantised export?); "
                         "use a float32 export of the model")


DTYPES = ("float16", "int8")  # how the embed-<source> attribute stores a vector


def quantize(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 rows, float32 scales): q = round(v / s) with s = the row's largest |v| / 127 (0
    for a zero row), so v ~ q * s. A scale a row, not one for the corpus: unit vectors'
    largest components vary from ~0.1 to 1 between documents."""
    s = (np.abs(v).max(axis=1) / np.float32(127.0)).astype(np.float32) if len(v) else np.zeros(0, np.float32)
    q = np.zeros(v.shape, np.int8)
    nz = s > 0
    q[nz] = np.clip(np.rint(v[nz] / s[nz, None]), -127, 127).astype(np.int8)
    return q, s


def dequantize(q: np.ndarray, s: np.ndarray) -> np.ndarray:
    return q.astype(np.float32) * s[:, None]


def as_stored(v: np.ndarray, dtype: str) -> np.ndarray:
    """Vectors as the attribute gives them back (float32): float16 rounded, or int8 with its
    row scale (`quantize`)."""
    if dtype == "int8":
        return dequantize(*quantize(v))
    return v.astype(np.float16).astype(np.float32)


def stored(ref: str, texts: list[str], max_tokens: int = DEFAULT_MAX_TOKENS, dtype: str = "float16") -> np.ndarray:
    """`embed`'s vectors as the `embed-<source>` step stores them (`dtype`), back in float32:
    what the heads train and score on, so a score from the step's attribute is the score
    from the text."""
    return as_stored(embed(ref, texts, max_tokens), dtype)


def head_vectors(head: dict, texts: list[str]) -> np.ndarray:
    """The texts' embeddings as a head (a probe, a regression) was trained on them: its
    embedding, token cap and the attribute's dtype (float16 for heads from before int8)."""
    return stored(model_ref(head), texts, head["max_tokens"], head.get("dtype", "float16"))


def check_dtype(head: dict, options: dict) -> None:
    """A head scores stored vectors of the dtype it was trained on: a pretrained head file
    (`probe:`) of int8 vectors under a float16 config (or the reverse) is an error, not
    scores of the wrong vectors."""
    have, want = head.get("dtype", "float16"), options.get("dtype")
    if want is not None and have != want:
        raise ValueError(f"the head was trained on {have} vectors, the run stores {want} ones: set the classifier's "
                         f"`dtype: {have}` (and the run's embedding's), or train it again")


@functools.lru_cache(maxsize=4)
def identity(ref: str) -> dict:
    """{"backend", "model", "dim", "files", "ref"}: what names the model's bytes."""
    name, folder = resolve(ref)
    return {**backend(name).identity(folder), "ref": ref}


def model_ref(model: dict) -> str:
    """The embedding a head's model file was trained on: a backend's name or a local folder."""
    return model["embedding"].get("ref", model["embedding"]["backend"])


def write_head(path, head: dict) -> None:
    """A head on embeddings (a probe, a regression) as plain JSON, written atomically: the
    same bytes for the same arrays."""
    import orjson

    from pipeline.io import atomic

    head = {k: np.ascontiguousarray(v) if isinstance(v, np.ndarray) else v for k, v in head.items()}
    atomic.write_bytes(path, orjson.dumps(head, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY))


def read_head(path: str, fmt: str, what: str, key: str) -> dict:
    """A head's model file, checked: its `format` is `fmt`, and the embedding it was trained
    on has the installed files' sha256; lists become arrays. `what` names the file in
    messages, `key` the config key that points at it."""
    import orjson

    from pipeline.errors import InputError
    from pipeline.io import fs

    raw = orjson.loads(fs.path(path).read_bytes())
    if raw.get("format") != fmt:
        raise InputError(f"{path} is not {what} (no \"format\": {fmt!r}); point `{key}` at one a run wrote, or remove "
                         "it to train one")
    have = identity(model_ref(raw))
    if have["files"] != raw["embedding"]["files"]:
        raise InputError(f"{path} was trained on embeddings of {raw['embedding']['model']} with files "
                         f"{raw['embedding']['files']}, but the installed {have['backend']} has {have['files']}: "
                         f"install the version it was trained with, or train it again (remove `{key}`)")
    return {k: np.array(v) if isinstance(v, list) and k != "classes" else v for k, v in raw.items()}


def normalise(v: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length in place (a zero row stays zero)."""
    n = np.linalg.norm(v, axis=1, keepdims=True)
    np.divide(v, n, out=v, where=n > 0)
    return v


def describe_registry() -> str:
    lines = []
    for name, cls in BACKENDS.all().items():
        lines.append(f"{name} (v{cls.version}): {cls.description}")
    lines.append("")
    lines.append(f"classifiers.<name>.model (type: embedding or regression), dedup.semantic.model and "
                 f"sources.<name>.topics.model pick one (default: {DEFAULT_BACKEND}), or name a local folder with "
                 "a sentence-transformers model folder (modules.json) or one with model.onnx and tokenizer.json (the onnx backend)")
    return "\n".join(lines)


# ---------------------------------------------------------------- wordllama


def _wordllama_dir() -> Path:
    import wordllama

    return Path(wordllama.__file__).parent


WORDLLAMA_CONFIG = "l2_supercat"
WORDLLAMA_DIM = 256


@register_backend("wordllama", version="1", libraries=("wordllama",))
class WordLlamaBackend(EmbeddingBackend):
    """WordLlama's static token embeddings (l2_supercat, 256 dimensions) from its wheel, mean-pooled; no torch, no download."""

    def _files(self) -> dict[str, Path]:
        d = _wordllama_dir()
        return {"weights": d / "weights" / f"{WORDLLAMA_CONFIG}_{WORDLLAMA_DIM}.safetensors",
                "tokenizer": d / "tokenizers" / f"{WORDLLAMA_CONFIG}_tokenizer_config.json"}

    def load(self, model: str | None):
        if model is not None:
            raise ValueError("the wordllama backend uses the weights its wheel ships; remove `embedding_model`")
        for what, p in self._files().items():
            if not p.is_file():
                raise FileNotFoundError(f"WordLlama's {what} file {p} is missing from its installed wheel: reinstall it "
                                        "with `pip install --force-reinstall wordllama` (models are never downloaded at run time)")
        from wordllama import WordLlama

        # WordLlama.load looks for `tokenizer/`, the wheel ships `tokenizers/`: pointing cache_dir at the package
        # finds both files; disable_download makes a miss an error instead of a download
        wl = WordLlama.load(config=WORDLLAMA_CONFIG, dim=WORDLLAMA_DIM, cache_dir=_wordllama_dir(), disable_download=True)
        tok = wl.tokenizer
        tok.no_padding()  # WordLlamaInference turns padding on; each text is pooled over its own tokens here
        return tok, np.ascontiguousarray(wl.embedding, dtype=np.float32)

    def identity(self, model: str | None) -> dict:
        from filters.models import sha256

        return {"backend": "wordllama", "model": WORDLLAMA_CONFIG, "dim": WORDLLAMA_DIM,
                "files": {what: sha256(p) for what, p in self._files().items()}}

    def embed(self, handle, texts: list[str], max_tokens: int) -> np.ndarray:
        tok, table = handle
        out = np.zeros((len(texts), table.shape[1]), np.float32)
        if not texts:
            return out
        from scipy import sparse

        ids = [e.ids[:max_tokens] for e in tok.encode_batch(texts, add_special_tokens=False)]
        lengths = np.fromiter((len(x) for x in ids), np.int64, len(ids))
        if lengths.any():  # sums of each text's token vectors: a (texts x vocabulary) count matrix times the table
            flat = np.fromiter((t for x in ids for t in x), np.int32, int(lengths.sum()))
            np.clip(flat, 0, table.shape[0] - 1, out=flat)  # as WordLlama does
            indptr = np.concatenate([[0], np.cumsum(lengths)])
            counts = sparse.csr_matrix((np.ones(len(flat), np.float32), flat, indptr), shape=(len(texts), table.shape[0]))
            out = np.asarray(counts @ table, dtype=np.float32)
            out /= np.maximum(lengths, 1)[:, None].astype(np.float32)
        return normalise(out)


# ---------------------------------------------------------------- onnx (a local folder)


def folder_files(d: Path) -> dict[str, str]:
    """{relative path: sha256} of every file of a model folder (hidden ones aside): what the
    runtime may load, external weights (`model.onnx_data`) included, whatever their names."""
    from filters.models import sha256

    files = sorted(p for p in d.rglob("*") if p.is_file() and not any(x.startswith(".") for x in p.relative_to(d).parts))
    return {p.relative_to(d).as_posix(): sha256(p) for p in files}


@register_backend("onnx", version="1", libraries=("onnxruntime", "tokenizers"))
class OnnxBackend(EmbeddingBackend):
    """A sentence encoder exported to ONNX, from a local folder (model.onnx, tokenizer.json); token outputs mean-pooled. Needs `pip install curate[onnx]`."""

    def load(self, folder: str | None):
        if folder is None:
            raise ValueError("the onnx backend reads a local folder: set `model:` to a folder with model.onnx and tokenizer.json")
        try:
            import onnxruntime as ort
        except ImportError:
            raise ImportError("the onnx embedding backend needs onnxruntime: pip install 'curate[onnx]'") from None
        from tokenizers import Tokenizer

        for f in ("model.onnx", "tokenizer.json"):
            if not (Path(folder) / f).is_file():
                raise FileNotFoundError(f"{folder}/{f} is missing: a local embedding model is a folder with model.onnx and "
                                        "tokenizer.json (models are never downloaded at run time)")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1  # one core per task, as Ray schedules it
        opts.inter_op_num_threads = 1
        sess = ort.InferenceSession(str(Path(folder) / "model.onnx"), opts, providers=["CPUExecutionProvider"])
        tok = Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))
        tok.no_padding()
        tok.no_truncation()
        return tok, sess, [i.name for i in sess.get_inputs()]

    def identity(self, folder: str | None) -> dict:
        tok, sess, _ = loaded(folder) if folder else (None, None, None)
        dim = sess.get_outputs()[0].shape[-1]
        return {"backend": "onnx", "model": Path(folder).name, "dim": int(dim), "files": folder_files(Path(folder))}

    def embed(self, handle, texts: list[str], max_tokens: int) -> np.ndarray:
        tok, sess, names = handle
        dim = int(sess.get_outputs()[0].shape[-1])
        if not texts:
            return np.zeros((0, dim), np.float32)
        ids = [e.ids[:max_tokens] for e in tok.encode_batch(texts)]
        return onnx_pooled(sess, names, ids, mean_pool)


ONNX_BATCH = 32  # texts an ONNX call: each call pads to its longest text, so a (batch, longest, dim) array stays small


def mean_pool(out: np.ndarray, mask: np.ndarray) -> np.ndarray:
    m = mask[..., None].astype(np.float32)
    return (out * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1.0)


def onnx_pooled(sess, names: list[str], ids: list[list[int]], pool) -> np.ndarray:
    """Token ids through an ONNX encoder, ONNX_BATCH texts a call, its token outputs pooled by
    `pool(outputs, mask)` (a 2-d output is a pooled one already), as unit rows."""
    parts = []
    for lo in range(0, len(ids), ONNX_BATCH):
        chunk = ids[lo:lo + ONNX_BATCH]
        width = max(1, max(len(x) for x in chunk))
        input_ids = np.zeros((len(chunk), width), np.int64)
        mask = np.zeros((len(chunk), width), np.int64)
        for i, x in enumerate(chunk):
            input_ids[i, : len(x)] = x
            mask[i, : len(x)] = 1
        feed = {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": np.zeros_like(input_ids)}
        out = sess.run(None, {k: v for k, v in feed.items() if k in names})[0].astype(np.float32)
        parts.append(out if out.ndim == 2 else pool(out, mask))
    return normalise(np.ascontiguousarray(np.concatenate(parts), dtype=np.float32))
