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


BUILTIN_MODULES = {"wordllama": "filters.embeddings"}
DEFAULT_BACKEND = "wordllama"
BACKENDS = Registry("embedding backend", BUILTIN_MODULES, hint=" (`curate embeddings` lists them)", builtin_first=True)


def register_backend(name: str, version: str = "1", libraries: tuple[str, ...] = ()):
    return BACKENDS.register(name, version, libraries)


@functools.cache
def backend(name: str) -> EmbeddingBackend:
    """The backend registered as `name`; a miss is a KeyError listing the known ones."""
    return BACKENDS.get(name)()


@functools.lru_cache(maxsize=4)
def loaded(name: str, model: str | None = None) -> Any:
    """A backend's model, loaded once per worker process (not per batch or per shard)."""
    return backend(name).load(model)


def embed(name: str, texts: list[str], max_tokens: int = DEFAULT_MAX_TOKENS, model: str | None = None) -> np.ndarray:
    """Unit-length float32 embeddings of `texts` with backend `name`, in batches of at most
    BATCH_CHARS characters of text (the first text of a batch whatever its length: its
    tokens are cut at `max_tokens` anyway)."""
    b, handle = backend(name), loaded(name, model)
    out = []
    lo = 0
    while lo < len(texts):
        hi, acc = lo + 1, len(texts[lo])
        while hi < len(texts) and acc + len(texts[hi]) <= BATCH_CHARS:
            acc += len(texts[hi])
            hi += 1
        out.append(b.embed(handle, texts[lo:hi], max_tokens))
        lo = hi
    dim = identity(name, model)["dim"]
    return np.concatenate(out) if out else np.zeros((0, dim), np.float32)


@functools.lru_cache(maxsize=4)
def identity(name: str, model: str | None = None) -> dict:
    return backend(name).identity(model)


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
    lines.append(f"classifiers.<name>.model picks one for `type: embedding` (default: {DEFAULT_BACKEND})")
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
