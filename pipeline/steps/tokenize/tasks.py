"""The tokenize stage's tasks: encode once per document shard, then write token files per
mixture shard by gathering, never encoding again.

`encode_shard` (steps `tokenize-<source>`) writes each kept document's ids (after the
filters' rewrites and the global layers, paragraph dedup's included: the text the
mixture holds) as `part-XXXXX.parquet` (`row`, `tokens`) beside the document shard: a
document's ids are one binary value, little-endian in the narrowest width that holds the
vocabulary (`ids_dtype`: uint16 up to 65,536 ids), not a list of ints. A list column costs
Parquet a repetition level per token and a dictionary attempt: writing and reading it back
took 38 ms for 1.1 M tokens of wiki pages against 7.5 ms as binary uint16 (code: 230 against
62 ms), and the files are 20-30% smaller. The mixture's routing (mix-route) carries them to the mixture shards with the text,
and `write_shard` (steps `tokens-<format>`) reads a mixture shard's partition, orders it as
`mix` orders the mixture file, adds the specials and writes the format's files
(pipeline/steps/tokenize/formats.py). A weights, phase or cell edit re-runs the routing
and the writers only.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import NotRequired, TypedDict


import numpy as np
import pyarrow as pa

from pipeline.engine.step import shard_name, task
from pipeline.io import atomic, fs
from pipeline.plan import tokens
from pipeline.engine.cutoff import Prior, key_array, prior_rows, same_as_before, text_keys
from pipeline.shards.documents import MIX_ORDER, DocShard
from pipeline.shards import readkey, shuffle, view
from pipeline.steps.tokenize import formats, pack, registry

# ids back to back, `ids_dtype` little-endian; text_key: xxh3-128 of the text encoded (a variant's lookup)
SCHEMA = pa.schema([("row", pa.int64()), ("tokens", pa.large_binary()), ("text_key", pa.binary(16))])  # xxh3-128
PROVENANCE = ".docs.parquet"  # beside every token file: which document holds which tokens
_SAFE_CELL = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")


def ids_dtype(vocab: int) -> np.dtype:
    """The width of the stored ids: uint16 when every id fits, else uint32 (little-endian)."""
    return np.dtype("<u2" if vocab <= 1 << 16 else "<u4")


def pack_ids(lengths: np.ndarray, flat: np.ndarray, dtype: np.dtype) -> pa.Array:
    """Documents' ids (`lengths` of them back to back in `flat`) as one binary value each."""
    if len(flat) and int(flat.max()) > np.iinfo(dtype).max:  # a tokenizer.json with ids past its vocabulary's size
        raise ValueError(f"token id {int(flat.max()):,} does not fit the {dtype} the vocabulary's size chose; "
                         "the tokenizer has ids past its size: use a tokenizer whose ids are below its vocabulary size")
    data = np.ascontiguousarray(flat, dtype=dtype)
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    offsets *= dtype.itemsize
    return pa.Array.from_buffers(pa.large_binary(), len(lengths), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def unpack_ids(col, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """(offsets in ids, ids back to back) of a `tokens` column `pack_ids` wrote, without a
    copy: document i's ids are `ids[offsets[i]:offsets[i + 1]]`."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if len(col) == 0:
        return np.zeros(1, np.int64), np.zeros(0, dtype)
    bufs = col.buffers()
    o = np.frombuffer(bufs[1], np.int64)[col.offset: col.offset + len(col) + 1]
    data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    return (o - o[0]) // dtype.itemsize, data[o[0]:o[-1]].view(dtype)


class EncodeSpec(TypedDict):
    """A `tokenize-<source>` shard (steps/tokenize/plan.py)."""

    doc: DocShard
    tokenizer: dict  # plan/tokens' spec of the tokenizer
    ids: str  # the stored ids' numpy dtype (ids_dtype)
    describe: str
    prior: NotRequired[Prior]  # from the executor: the earlier shard of the same partial key


@task(version="4")  # 4: 128-bit text keys; 3: text_key, and the texts an earlier shard encoded looked up, not encoded again
def encode_shard(spec: EncodeSpec, out) -> dict:
    """One document shard's kept documents -> their token ids (no specials). A text the
    earlier shard of this one's partial key encoded (spec `prior`: the same documents and
    tokenizer, other layers) is looked up by its text key, not encoded again: a new page
    that removes one old page re-encodes nothing else of that shard."""
    d = spec["doc"]
    rk, state = readkey.shard(d, ("text",))  # the kept texts: an earlier shard that read the same is linked
    if (st := same_as_before(spec, out, rk)) is not None:
        return st
    dtype = np.dtype(spec["ids"])
    before = prior_rows(spec, ["text_key", "tokens"])  # the earlier shard's ids by text
    n = total = looked_up = 0
    final = out.path(".parquet")
    dest = atomic.Out(final)
    # binary values compress with zstd at level 1 to ~1.3 bytes a uint16 id; no dictionary (ids are not categories)
    with dest.parquet(SCHEMA, compression="zstd", compression_level=1, use_dictionary=False) as w:
        for rows, b in view.kept_batches(d["documents"], d["layers"], ["text"], state=state):
            texts = b.column("text").to_pylist()
            keys = text_keys(texts)
            at = before.find(keys) if before is not None else np.full(len(texts), -1)
            hit, miss = np.flatnonzero(at >= 0), np.flatnonzero(at < 0)
            lengths, flat = tokens.encode_flat(spec["tokenizer"], [texts[j] for j in miss.tolist()] if len(hit) else texts)
            col = pack_ids(lengths, flat, dtype)  # no int per token
            if len(hit):  # the earlier ids taken as they are, then each row put back in its place
                both = pa.concat_arrays([before.table.column("tokens").take(pa.array(at[hit])).combine_chunks(), col])
                place = np.empty(len(texts), np.int64)
                place[hit], place[miss] = np.arange(len(hit)), len(hit) + np.arange(len(miss))
                col = both.take(pa.array(place))
            w.write_table(pa.table({"row": pa.array(rows, pa.int64()), "tokens": col, "text_key": key_array(keys)}, schema=SCHEMA))
            n += len(texts)
            looked_up += len(hit)
            total += int(unpack_ids(col, dtype)[0][-1])
    dest.commit()
    return {"rows": n, "documents": n, "tokens": total, "read_key": rk, "encoded_before": looked_up}


class TokensSpec(TypedDict):
    """A `tokens-<format>` shard (steps/tokenize/write.py, levanter.py): one mixture shard (steps/mix/plan.py `write_shards`)."""

    inputs: str  # the route's (or its merge tier's) `to` folder
    maps: int | list[int]  # the files there (steps/merge.py read_from)
    partition: int
    phase: str | None
    file: str | None  # the mixture file: <phase>/part-XXXXX.parquet; None: part-<shard>
    format: str
    params: dict  # dtype, bos_id, eos_id, max_file_tokens, tokenizer_name, ids; layout, pack, format_module when set
    describe: str


@task(version="2")
def write_shard(spec: TokensSpec, out) -> dict:
    """One mixture shard's documents, in the mixture's order, as token files of one format:
    `<format>/[<phase>/]part-XXXXX.*`, split as part-XXXXX-YYYYY past `max_file_tokens`; with
    `layout: cells`, one file per cell: `<format>/[<phase>/]<cell>/part-XXXXX.*`."""
    t = shuffle.read_partition(spec["inputs"], spec["maps"], spec["partition"])
    fmt, p = spec["format"], spec["params"]
    name = spec["file"][: -len(".parquet")] if spec.get("file") else shard_name(out.index)
    if t is None or t.num_rows == 0:
        ids, lengths, cells, meta, epochs = np.zeros(0, np.uint32), np.zeros(0, np.int64), [], [], np.zeros(0, np.int64)
    else:
        t = t.sort_by(MIX_ORDER)
        offs, vals = unpack_ids(t.column("tokens"), np.dtype(p["ids"]))
        ids, lengths = with_specials(offs, vals, p["bos_id"], p["eos_id"])
        cells = t.column("cell").to_pylist()
        meta = list(zip(t.column("id").to_pylist(), t.column("source").to_pylist(), range(t.num_rows)))
        epochs = t.column("epoch").to_numpy()
    mixture = spec.get("file") or f"{shard_name(out.index)}.parquet"  # the mixture file these documents are rows of
    if p.get("layout") == "cells":  # a dataset per cell: the cell's documents of this shard, in the mixture's order
        head, _, shard = name.rpartition("/")
        by_cell: dict[str, list[int]] = {}
        for i, c in enumerate(cells):
            by_cell.setdefault(c, []).append(i)
        bad = [c for c in by_cell if not _SAFE_CELL.match(c or "") or ".." in c.split("/")]
        if bad:  # a cell is a folder: a topic label of a pretrained model could be anything
            raise ValueError(f"cells {bad[:3]} cannot be folder names under tokenized/{fmt}/ (letters, digits, "
                             "'_', '.', '-', '/' only); rename the topic model's labels or use tokenize.layout: mixture")
        runs = [(c, f"{head + '/' if head else ''}{c}/{shard}", np.array(ix, np.int64)) for c, ix in sorted(by_cell.items())]
    else:
        runs = [(None, name, None)]  # type: ignore[list-item]  # every document, as it is (no cell)
    files, per_cell, total = [], {}, 0
    for cell, stem0, ix in runs:
        sub_ids, sub_len = (ids, lengths) if ix is None else gather(ids, lengths, ix)
        pick_all = np.arange(len(lengths)) if ix is None else ix
        split = _split(sub_len, p["max_file_tokens"])
        for k, (tok, seqs, pc) in enumerate(_pieces(sub_ids, sub_len, p, split)):
            stem = stem0 if len(split) == 1 else f"{stem0}-{k:05d}"
            base = fs.path(out.dir) / fmt / stem
            docs = pick_all[pc["doc"]]  # each piece's document in this shard
            entry = _write_file(fmt, base, f"{fmt}/{stem}", tok, seqs, pc, [meta[i] for i in docs.tolist()],
                                [cells[i] for i in docs.tolist()], epochs[docs] if len(docs) else np.zeros(0, np.int64),
                                p, len(np.unique(docs)))
            files.append({**entry, **({"cell": cell, "mixture": mixture} if cell is not None else {})})
            total += entry["tokens"]
    for c, n in zip(cells, lengths.tolist()):
        e = per_cell.setdefault(c, {"documents": 0, "tokens": 0})
        e["documents"] += 1
        e["tokens"] += n
    return {"rows": len(lengths), "tokens": total, "files": files, "phase": spec.get("phase"), "per_cell": per_cell}


class TokensValidationSpec(TypedDict):
    """A `tokens-<format>-validation` shard (steps/tokenize/write.py, levanter.py): one held-out file."""

    input: str  # the validation step's docs/<source>/part-XXXXX.parquet
    name: str  # that file relative to docs/
    format: str
    params: dict  # as TokensSpec's
    tokenizer: str  # what encodes its texts (plan/tokens.py)
    describe: str


@task(version="2")
def validation_shard(spec: TokensValidationSpec, out) -> dict:
    """One held-out file of validation/ (`<source>/part-XXXXX.parquet`) as token files of one
    format under `<format>/validation/`: encoded here (held-out documents are not in the
    mixture's routing), with the same specials and a provenance sidecar."""
    fmt, p = spec["format"], spec["params"]
    t = fs.read_table(spec["input"], columns=["id", "source", "text"])
    n, flat = tokens.encode_flat(spec["tokenizer"], t.column("text").to_pylist())
    ids, lengths = with_specials(np.r_[0, np.cumsum(n)], flat, p["bos_id"], p["eos_id"])
    meta = list(zip(t.column("id").to_pylist(), t.column("source").to_pylist(), range(t.num_rows)))
    base = fs.path(out.dir) / fmt / "validation" / spec["name"][: -len(".parquet")]
    ((tok, seqs, pc),) = _pieces(ids, lengths, {**p, "max_file_tokens": None})  # one file a held-out file
    pm = [meta[i] for i in pc["doc"].tolist()]
    entry = _write_file(fmt, base, f"{fmt}/validation/{spec['name'][: -len('.parquet')]}", tok, seqs, pc, pm,
                        [None] * len(pm), np.zeros(len(pm), np.int64), p, len(lengths))
    return {"rows": len(lengths), "tokens": entry["tokens"], "files": [entry]}


def _write_file(fmt: str, base, rel: str, tok, seqs, pc: dict, pm: list, cells: list, epochs, p: dict, documents: int) -> dict:
    """One token file set and its provenance sidecar; its entry in the step's marker (with
    sequences, pieces and padding when packed). `pm`: each piece's (id, source, row)."""
    module = p.get("format_module")  # a format registered outside Curate's built-ins: imported here
    rows = ([(int(x), int(y), m[0], m[1], m[2]) for x, y, m in zip(pc["start"], pc["end"], pm)]
            if registry.get(fmt, module).needs_rows else None)
    res = formats.write(fmt, base, tok, seqs, p["dtype"], p["tokenizer_name"], rows, module)
    res["files"].update(_provenance(base, pc, pm, cells, epochs, packed="pack" in p))
    entry = {"file": rel, "documents": documents, "tokens": res["tokens"], "files": res["files"]}
    if "pack" in p:  # sequences of seq_len: pieces of documents and padding
        entry.update({"sequences": len(seqs), "pieces": len(pm), "padding": res["tokens"] - int((pc["end"] - pc["start"]).sum())})
    return entry


def with_specials(offs: np.ndarray, vals: np.ndarray, bos: int | None, eos: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(ids, lengths): each document's ids (`vals[offs[i]:offs[i+1]]`) with BOS before and
    EOS after, back to back in one array built in a few vector operations (not a
    concatenation a document, nor an array a document), as narrow as the ids and specials
    allow (the stored uint16 ids stay uint16: a uint16 file is written without a cast)."""
    n = len(offs) - 1
    a, z = int(bos is not None), int(eos is not None)
    lens = np.diff(offs).astype(np.int64) + a + z
    ends = np.cumsum(lens)
    out = np.empty(int(ends[-1]) if n else 0, np.promote_types(vals.dtype, np.min_scalar_type(max(bos or 0, eos or 0))))
    body = np.ones(len(out), bool)
    if a:
        body[ends - lens] = False
        out[ends - lens] = bos
    if z:
        body[ends - 1] = False
        out[ends - 1] = eos
    out[body] = vals[offs[0]:offs[-1]] if n else vals[:0]
    return out, lens


def gather(ids: np.ndarray, lengths: np.ndarray, ix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The documents `ix` (in that order) of packed (ids, lengths)."""
    starts = np.r_[0, np.cumsum(lengths)[:-1]] if len(lengths) else np.zeros(0, np.int64)
    sub = lengths[ix]
    if not len(ix):
        return ids[:0], sub
    # each picked document's positions: its start plus 0..len-1, in one vector
    pos = np.repeat(starts[ix] - np.r_[0, np.cumsum(sub)[:-1]], sub) + np.arange(int(sub.sum()))
    return ids[pos], sub


def _provenance(base, pc: dict, meta, cells, epochs, packed: bool = False) -> dict:
    """`<file>.docs.parquet` beside a token file: a row a document (a piece of one when
    packed, with its `piece` number), in file order: its Curate id, source, cell, epoch, row
    in the mixture file and token range [start, end) in the file, so that any token offset
    names its document (`curate explain RUN --token FILE:OFFSET`)."""
    cols = {"id": pa.array([m[0] for m in meta], pa.string()), "source": pa.array([m[1] for m in meta], pa.string()),
            "cell": pa.array(cells, pa.string()), "epoch": pa.array(np.asarray(epochs, np.int64)),
            "row": pa.array([m[2] for m in meta], pa.int64()), "start": pa.array(np.asarray(pc["start"], np.int64)),
            "end": pa.array(np.asarray(pc["end"], np.int64))}
    if packed:
        cols["piece"] = pa.array(np.asarray(pc["piece"], np.int64))
    p = base.with_name(base.name + PROVENANCE)
    atomic.write_table(pa.table(cols), p, compression="zstd")
    size, sha = atomic.file_digest(p)
    return {p.name: {"bytes": size, "sha256": sha}}


def _pieces(ids: np.ndarray, lengths: np.ndarray, p: dict, runs: list[tuple[int, int]] | None = None
            ) -> Iterator[tuple[np.ndarray, np.ndarray, dict]]:
    """The token files of a run of documents, one at a time (a file is written before the
    next is packed): (tokens, sequence lengths, pieces), split past `max_file_tokens` between
    documents (`runs`: _split's, when the caller needs their count; a document is never in
    two files). Unpacked, a sequence and a piece are a document; with `pack`, each file's
    documents are packed on their own into sequences of seq_len (pipeline/steps/tokenize/
    pack.py). Pieces: {"doc" (index into `lengths`), "piece", "start", "end" (in the file)}."""
    lengths = np.asarray(lengths, np.int64)
    bounds = np.r_[0, np.cumsum(lengths)]
    for a, b in runs if runs is not None else _split(lengths, p["max_file_tokens"]):
        tok, n = ids[int(bounds[a]):int(bounds[b])], lengths[a:b]
        if "pack" in p:
            seq_len = p["pack"]["seq_len"]
            tok, pc = pack.pack(tok, n, seq_len, p["pack"]["strategy"], p["eos_id"])
            seqs = np.full(len(tok) // seq_len, seq_len, np.int64)
            pc["doc"] = pc["doc"] + a
        else:  # every document, empty ones too
            seqs, ends = n, np.cumsum(n)
            pc = {"doc": np.arange(a, b), "piece": np.zeros(b - a, np.int64), "start": ends - n, "end": ends}
        yield tok, seqs, pc


def _split(lengths: np.ndarray, most: int | None) -> list[tuple[int, int]]:
    """Runs of documents of at most `most` tokens each (a longer document alone); one run
    (maybe empty) without a limit."""
    if not most or not len(lengths):
        return [(0, len(lengths))]
    out, start, size = [], 0, 0
    for i, n in enumerate(lengths.tolist()):
        if size and size + n > most:
            out.append((start, i))
            start, size = i, 0
        size += n
    out.append((start, len(lengths)))
    return out
