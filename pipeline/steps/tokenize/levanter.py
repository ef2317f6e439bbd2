"""Levanter caches (`tokenize.formats: [levanter]`): the mixture as the tensorstore arrays
Levanter's trainer reads, written in parallel a chunk file at a time.

A Levanter cache (levanter/store/: `TreeStore` of `JaggedArrayStore`s) is a folder

    <cache>/train/input_ids/data/      zarr v3, int32: the documents' ids back to back
    <cache>/train/input_ids/offsets/   zarr v3, int64: [0] the number of documents, [i + 1] the end of document i
    <cache>/train/shard_ledger.json    rows, rows per source shard, is_finished, the tokenizer's metadata

Both arrays have Levanter's own metadata (jagged_array._get_spec): shape 2^54, a chunk grid
of 134,217,728 elements (256 Ki x 512), each chunk one file (`c/<k>`) sharded
(`sharding_indexed`) into inner chunks of 262,144 elements compressed with blosc level 5.
Levanter opens an existing array with that metadata as a constraint, so it must be exactly
this; it reads any integer dtype the metadata names (its own writer stores the Python ints
of a Hugging Face tokenizer; int32 is what the trainer feeds the model).

How it is written: the `tokens-levanter` step writes pieces, the documents of a mixture
shard (layout mixture) or of a cell in a document shard (layout cells) as raw ids with
their specials (`.ids`, the encoded width) and the provenance sidecar; `tokens-levanter-cache`
then writes each chunk file of each array as its own task, from the pieces that overlap it
(the planner knows every piece's rows and tokens from the markers). A chunk file is written
once, whole, by one task: tasks never share a file, so they run in parallel, a retried task
rewrites the same bytes, and a cache of 10^12 tokens is 7,451 data tasks of 134 M tokens
each. A task streams its chunk file (zarr_shard.py: each inner chunk encoded by tensorstore
as it comes, the shard's index last), holding one inner chunk, not the chunk, and commits it
through pipeline/io/fs.py (a local folder or an object store). The cache folders,
`zarr.json`s and ledgers (a chunk task's files too) are assembled at publish by hard links
(copies on object stores), so a weights edit with layout cells relinks the same files and
rewrites `levanter-data.yaml` only.
"""

from __future__ import annotations

import itertools
import json
from typing import NotRequired, TypedDict

import numpy as np

from pipeline.engine.step import shard_name, task
from pipeline.io import atomic, fs
from pipeline.mixing import cells as cellmod
from pipeline.shards import view
from pipeline.shards.documents import DocShard, slim
from pipeline.steps.tokenize import zarr_shard

INNER = 256 * 1024  # levanter.store.jagged_array.DEFAULT_CHUNK_SIZE
CHUNK = INNER * 512  # DEFAULT_WRITE_CHUNK_SIZE: the chunk grid, one file a chunk
BLOCK = INNER * 8  # ids a task reads from a piece at a time (2 Mi)
SHAPE = 2 ** 54
DTYPES = {"data": "int32", "offsets": "int64"}
LEDGER = "shard_ledger.json"


def array_spec(kvstore: dict) -> dict:
    """Levanter's tensorstore spec of a jagged array's `data` or `offsets` (jagged_array._get_spec)."""
    return {"driver": "zarr3", "kvstore": kvstore, "metadata": {
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [CHUNK]}},
        "codecs": [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": [INNER], "codecs": [{"name": "blosc", "configuration": {"clevel": 5}}]}}]}}


def _memory_array(array: str):
    import tensorstore as ts

    return ts.open(array_spec({"driver": "memory"}), dtype=DTYPES[array], shape=[SHAPE], create=True).result()


def metadata(array: str) -> bytes:
    """The `zarr.json` tensorstore writes for Levanter's spec (the same bytes every run)."""
    a = _memory_array(array)
    return a.kvstore.read("zarr.json").result().value


def plan_chunks(cache: str, pieces: list[dict]) -> list[dict]:
    """The chunk tasks of one cache from its pieces in order (each {"path", "rows",
    "tokens"}, `path` the piece without extension): per array, per chunk of CHUNK elements,
    the pieces' ranges it holds. Element e of `offsets` (e >= 1) is the end of row e - 1;
    element 0 the number of rows. Chunk 0 of each array is always planned (its task also
    yields the zarr.json)."""
    rows = sum(p["rows"] for p in pieces)
    tokens = sum(p["tokens"] for p in pieces)
    out = []
    for array, size, count in (("data", tokens, "tokens"), ("offsets", rows + 1, "rows")):
        bounds, r0, t0 = [], 0, 0  # each piece's first element in this array, and its token base
        for p in pieces:
            first = t0 if array == "data" else r0 + 1
            bounds.append((first, first + p[count], t0))
            r0, t0 = r0 + p["rows"], t0 + p["tokens"]
        ends = [b for _, b, _ in bounds]
        first = 0  # the first piece ending past this chunk's start: the pieces are in order, so linear in all
        for k in range(max(1, -(-size // CHUNK))):
            lo, hi = k * CHUNK, min((k + 1) * CHUNK, size)
            while first < len(pieces) and ends[first] <= lo:
                first += 1
            inputs, j = [], first
            while j < len(pieces) and bounds[j][0] < hi:
                a, b, base = bounds[j]
                if b > lo:  # (an empty piece holds no element)
                    # the file it reads, named whole: a shard's key digests the files its spec names
                    read = pieces[j]["path"] + (".ids" if array == "data" else ".docs.parquet")
                    inputs.append({"path": read, "skip": max(lo, a) - a, "take": min(hi, b) - max(lo, a),
                                   "at": max(lo, a), "base": base})
                j += 1
            out.append({"cache": cache, "array": array, "chunk": k, "lo": lo, "hi": hi, "rows": rows, "inputs": inputs,
                        "describe": f"levanter {cache} {array} chunk {k}"})
    return out


def _segments(spec: dict, ids_dtype: str):
    """(global element, values) of the chunk's inputs, in order, at most BLOCK values at a time."""
    if spec["array"] == "offsets" and spec["lo"] == 0:
        yield 0, np.array([spec["rows"]], np.int64)
    for inp in spec["inputs"]:
        if spec["array"] == "data":
            size = np.dtype(ids_dtype).itemsize
            with fs.open_read(inp["path"]) as f:  # the piece's .ids
                f.seek(inp["skip"] * size)
                done = 0
                while done < inp["take"]:
                    n = min(BLOCK, inp["take"] - done)
                    yield inp["at"] + done, np.frombuffer(f.read(n * size), dtype=np.dtype(ids_dtype).newbyteorder("<"))
                    done += n
        else:  # the ends of the piece's documents, in its tokens, moved to the cache's
            ends = fs.read_table(inp["path"], columns=["end"]).column("end").to_numpy()  # its .docs.parquet
            yield inp["at"], ends[inp["skip"]: inp["skip"] + inp["take"]].astype(np.int64) + inp["base"]


class ChunkSpec(TypedDict):
    """A `tokens-levanter-cache` shard (levanter.py `plan_chunks`, `chunk_shards`): one chunk file of a cache's array."""

    cache: str  # the cache's name (a cell's, mixture or validation)
    array: str  # data or offsets
    chunk: int
    lo: int  # its elements: [lo, hi)
    hi: int
    rows: int  # the cache's documents
    inputs: list[dict]  # the pieces' ranges it holds: path (the piece's .ids, or .docs.parquet for offsets), skip, take, at, base
    ids: str  # the pieces' ids dtype
    ledger: NotRequired[dict]  # offsets chunk 0: the cache's ledger (shard_rows, meta)
    describe: str


@task(version="3")  # 2: streamed (zarr_shard.py); 3: its inputs name the files read (.ids, .docs.parquet)
def cache_chunk(spec: ChunkSpec, out) -> dict:
    """One chunk file of a cache's `data` or `offsets`: `<array>/c/<k>` (and `zarr.json` for chunk 0)."""
    array = spec["array"]
    base = fs.path(out.dir) / spec["cache"]
    files = []  # relative to the cache's folder
    parts = zarr_shard.shard(_inner_blocks(spec), DTYPES[array], INNER, CHUNK // INNER)
    first = next(parts, None)
    if first is not None:  # a chunk of fill values only (an empty cache's data) is not stored
        atomic.write_stream(base / "input_ids" / array / "c" / str(spec["chunk"]), itertools.chain([first], parts))
        files.append(f"input_ids/{array}/c/{spec['chunk']}")
    if spec["chunk"] == 0:
        atomic.write_bytes(base / "input_ids" / array / "zarr.json", metadata(array))
        files.append(f"input_ids/{array}/zarr.json")
    if spec.get("ledger"):  # the offsets' first chunk task: the cache's ledger, last (it says the cache is finished)
        atomic.write_bytes(base / LEDGER, ledger(spec["rows"], spec["ledger"]["shard_rows"], spec["ledger"]["meta"]))
        files.append(LEDGER)
    return {"rows": 0, "cache": spec["cache"], "array": array, "chunk": spec["chunk"], "files": files}


def _inner_blocks(spec: dict):
    """The chunk's inner chunks in order, INNER values each (the last zero-padded), from its inputs."""
    array, lo, hi = spec["array"], spec["lo"], spec["hi"]
    buf = np.zeros(INNER, DTYPES[array])
    at, fill = lo, 0
    for start, vals in _segments(spec, spec["ids"]):
        if start != at + fill:
            raise RuntimeError(f"levanter {spec['cache']} {array}: a gap at element {start:,} (expected {at + fill:,})")
        while len(vals):
            n = min(INNER - fill, len(vals))
            buf[fill:fill + n] = vals[:n]
            fill, vals = fill + n, vals[n:]
            if fill == INNER:
                yield buf
                at, fill = at + INNER, 0
    if at + fill != hi:
        raise RuntimeError(f"levanter {spec['cache']} {array} chunk {spec['chunk']}: {at + fill - lo:,} of {hi - lo:,} elements")
    if fill:
        buf[fill:] = 0
        yield buf


class CellsSpec(TypedDict):
    """The `tokens-levanter-cells` step's one shard: each source's cells (layout cells)."""

    sources: dict[str, list[dict]]
    describe: str


@task(version="1")
def cells_shard(spec: CellsSpec, out) -> dict:
    """Each source's cells as `cells/<source>.json`: what a `tokens-levanter` shard reads."""
    for source, cl in spec["sources"].items():
        atomic.write_json(fs.path(out.dir) / "cells" / f"{source}.json", cl)
    return {"rows": 0}


class CellPiecesSpec(TypedDict):
    """A `tokens-levanter` shard with layout cells (levanter.py `plan`): one document shard's kept documents."""

    doc: DocShard
    params: dict  # dtype, bos_id, eos_id, max_file_tokens, tokenizer_name, ids
    cells: str | list[dict]  # tokens-levanter-cells' cells/<source>.json (or the cells): the source's cells
    tokens: str  # the shard's token ids (tokenize-<source>)
    describe: str


@task(version="3")  # 2: no piece for a cell the shard has no document of; 3: its cells from the file its spec names
def cell_pieces(spec: CellPiecesSpec, out) -> dict:
    """Layout cells: one document shard's kept documents, per cell, as pieces
    (`<cell>/<source>-part-XXXXX.ids` with its sidecar), in the shard's row order; every
    kept document once, whatever the weights (they are the trainer's)."""
    from pipeline.steps.tokenize import tasks

    if isinstance(spec["cells"], str):  # tokens-levanter-cells' cells/<source>.json (Levanter takes no phases)
        spec = {**spec, "cells": atomic.read_json(spec["cells"])}
    d, p = spec["doc"], spec["params"]
    tok = fs.read_table(spec["tokens"], columns=["row", "tokens"])
    rows = tok.column("row").to_numpy()
    offs, vals = tasks.unpack_ids(tok.column("tokens"), np.dtype(p["ids"]))
    ids: list[str] = []
    for r, b in view.kept_batches(d["documents"], d["layers"], ["id"]):
        ids += b.column("id").to_pylist()
    if len(ids) != len(rows):
        raise RuntimeError(f"{spec['tokens']}: {len(rows):,} encoded documents, {len(ids):,} kept; its tokenize step is stale")
    buckets, topics = view.shard_buckets(d), view.shard_topics(d)
    values = view.shard_axes(d, cellmod.source_axes(spec["cells"]))
    where = cellmod.index(spec["cells"], None if buckets is None else buckets[rows], len(rows),
                          None if topics is None else topics[rows], view.rows_of(values, rows))
    all_ids, lengths = tasks.with_specials(offs, vals, p["bos_id"], p["eos_id"])
    pieces = []
    for pos, c in enumerate(spec["cells"]):
        ix = np.flatnonzero(where == pos)
        if not len(ix):  # a piece only where the shard has documents of the cell: not cells x shards files
            continue
        sub_ids, sub_len = tasks.gather(all_ids, lengths, ix)
        name = f"{c['name'].replace('/', '__')}/{d['source']}-{shard_name(d['part'])}"
        base = fs.path(out.dir) / "levanter" / name
        ends = np.cumsum(sub_len)
        pc = {"doc": ix, "piece": np.zeros(len(ix), np.int64), "start": ends - sub_len, "end": ends}
        meta = [(ids[i], d["source"], int(rows[i])) for i in ix.tolist()]
        entry = tasks._write_file("levanter", base, f"levanter/{name}", sub_ids, sub_len, pc, meta,
                                  [c["name"]] * len(ix), np.zeros(len(ix), np.int64), p, len(ix))
        pieces.append({**entry, "cell": c["name"]})
    return {"rows": len(rows), "files": pieces}


NO_MAX_LENGTH = int(1e30)  # what a Hugging Face tokenizer without a model_max_length says (VERY_LARGE_INTEGER)


def ledger(rows: int, shard_rows: dict[str, int], meta: dict) -> bytes:
    """shard_ledger.json as Levanter's `CacheLedger.to_json()` writes it (dataclass_json, its field order)."""
    meta = {**meta, "max_length": NO_MAX_LENGTH if meta.get("max_length") is None else meta["max_length"]}
    return json.dumps({"total_num_rows": rows, "shard_rows": shard_rows, "is_finished": True,
                       "finished_shards": list(shard_rows), "field_counts": {},
                       "metadata": {"preprocessor_metadata": meta}}).encode()


def preprocessor_metadata(tokenizer: str, vocab: int, bos: bool, eos: bool) -> dict:
    """What Levanter's `BatchTokenizer.metadata` records (a mismatch is a warning when it loads).
    A tokenizer.json has no max length: None here, NO_MAX_LENGTH in the ledger (a step's config
    is hashed as JSON of 64-bit integers at most: 10^30 in it failed every levanter run with a
    tokenizer.json, found by the edit fuzzer)."""
    return {"tokenizer": tokenizer, "vocab_size": vocab, "return_attention_mask": False, "padding": False,
            "max_length": 1024 if tokenizer == "gpt2" else None, "append_bos": bos, "append_eos": eos}


def cache_name(cell: str | None) -> str:
    return "mixture" if cell is None else cell.replace("/", "__")


def data_config(root: str, tokenizer: str, caches: dict[str, float], validation: bool) -> str:
    """levanter-data.yaml: an `LMMixtureDatasetConfig` (levanter.data.text) over the caches."""
    import yaml

    configs = {c: {"cache_dir": f"{root}/{c}"} for c in caches}
    weights = dict(caches)
    if validation:
        configs["validation"] = {"cache_dir": f"{root}/validation"}
        weights["validation"] = 0.0
    head = ("# Levanter's data: section (LMMixtureDatasetConfig): a cache per component at <cache_dir>/train,\n"
            "# the held-out documents at validation/validation. Change train_weights and train: no new files.\n")
    return head + yaml.safe_dump({"tokenizer": tokenizer, "cache_dir": root, "configs": configs,
                                  "train_weights": weights}, sort_keys=False)



def plan(ctx, st: dict, write_shard, validation_shard) -> list:
    """The Levanter steps: `tokens-levanter` (pieces), `tokens-levanter-validation` (the
    held-out documents' pieces) and `tokens-levanter-cache` (the chunk files)."""
    from pipeline.engine.step import Step
    from pipeline.errors import UsageError
    from pipeline.steps.tokenize.registry import standard_dtype

    tz, mx = ctx.mixture.tokenize, ctx.mixture.mixture
    if tz.pack is not None:
        raise UsageError(f"{ctx.lm.where(('tokenize', 'pack'))}: a Levanter cache holds documents (its trainer packs "
                         "them into sequences itself); remove pack or the levanter format")
    if mx.phases:
        raise UsageError(f"{ctx.lm.where(('mixture', 'phases'))}: the levanter format does not write phased mixtures yet "
                         "(Levanter's train_weights change by training step, which a mixture's phases do not know); "
                         "use megatron, datatrove or memmap, or one phase")
    params = {"dtype": standard_dtype("uint32")("auto", st["vocab_size"]),  # the pieces: as narrow as the ids
              "bos_id": st["bos_id"], "eos_id": st["eos_id"], "max_file_tokens": None, "tokenizer_name": st["tokenizer"],
              "ids": st["ids"]}
    cfg = {"format": "levanter", "params": params, "tokenizer": st["identity"]}
    if tz.layout == "cells":
        cell_list = [c.to_dict() for c in ctx.mix.phases[0]["cells"]]
        if "validation" in {cache_name(c["name"]) for c in cell_list}:  # the held-out documents' cache has that name
            raise UsageError(f"{ctx.lm.where(('sources',))}: a cell named `validation` would share its Levanter cache "
                             "folder with the held-out documents'; rename the source")
        tok = ctx.providers("token_ids")

        by_source: dict[str, list[dict]] = {}
        for c in ctx.mix.phases[0]["cells"]:
            by_source.setdefault(c.source, []).append(c.to_dict())
        # each source's cells, from the config alone, as a file the pieces' specs name (keyed by its bytes): no
        # spec carries a cell (not cells x shards in the driver), and a weights edit moves neither file nor folder
        members = Step("tokens-levanter-cells", "tokens-cells", {"sources": by_source}, [], cells_shard,
                       shards=lambda step, stats: [{"sources": by_source, "describe": "levanter: the cells of each source"}],
                       cpus=0)

        def shards(step, stats):
            return ({"doc": slim(d), "params": params, "cells": str(members.dir(ctx.store) / "cells" / f"{d['source']}.json"),
                     "tokens": str(tok[d["source"]].dir(ctx.store) / f"{shard_name(d['index'])}.parquet"),
                     "describe": f"levanter: {d['source']}/{shard_name(d['part'])}"} for d in ctx.mix.docs(stats))

        pieces = Step("tokens-levanter", "tokens", {**cfg, "layout": "cells", "cells": cell_list},
                      [s for s in ctx.mix.priority.inputs if s is not ctx.mix.budget] + [members] + list(tok.values()),
                      cell_pieces, shards=shards,
                      position_free=True)
    else:
        write = ctx.mix.write

        def shards(step, stats):
            return [{**{k: v for k, v in sp.items() if k != "describe"}, "format": "levanter", "params": params,
                     "describe": f"levanter: {sp['describe']}"} for sp in write.shards(write, stats)]

        pieces = Step("tokens-levanter", "tokens", cfg, list(write.inputs), write_shard, shards=shards)
    out = [pieces]
    tname = st["tokenizer"]
    meta = preprocessor_metadata(tname.rsplit("/", 1)[0] if tname.endswith("tokenizer.json") else tname, st["vocab_size"],
                                 st["bos_id"] is not None, st["eos_id"] is not None)
    held = ctx.step("validation")
    if held is not None:
        def vshards(step, stats):
            return [{"input": str(held.dir(ctx.store) / "docs" / m["held"]["file"]), "name": m["held"]["file"],
                     "format": "levanter", "params": params, "tokenizer": st["tokenizer"],
                     "describe": f"levanter: validation/{m['held']['file']}"}
                    for m in sorted(stats[held.name].values(), key=lambda m: (m["source"], m["part"])) if m.get("held")]

        out.append(Step("tokens-levanter-validation", "tokens", {**cfg, "split": "validation"}, [held], validation_shard,
                        shards=vshards))

    def chunk_shards(step, stats):
        specs = []
        for name, ps in caches(ctx, out, stats).items():
            led = {"shard_rows": {p["piece"]: p["rows"] for p in ps}, "meta": meta}
            specs += [{**sp, "ids": params["dtype"], **({"ledger": led} if sp["array"] == "offsets" and sp["chunk"] == 0 else {})}
                      for sp in plan_chunks(name, ps)]
        return specs

    out.append(Step("tokens-levanter-cache", "tokens-cache", {"format": "levanter", "chunk": CHUNK, "inner": INNER, "meta": meta},
                    list(out), cache_chunk, shards=chunk_shards, preload=("tensorstore",)))
    return ([members] if tz.layout == "cells" else []) + out


def caches(ctx, steps: list, stats: dict) -> dict[str, list[dict]]:
    """Cache name -> its pieces in order ({"path", "rows", "tokens", "sidecar"}); "validation" for the held-out documents."""
    out: dict[str, list[dict]] = {}
    if ctx.mixture.tokenize.layout == "cells":
        for c in ctx.mix.phases[0]["cells"]:
            out[cache_name(c.name)] = []
    for s in steps:
        for i in sorted(stats.get(s.name, {})):
            for f in stats[s.name][i]["files"]:
                name = "validation" if s.config.get("split") else cache_name(f.get("cell"))
                rest = f["file"].split("/", 2 if f.get("cell") or s.config.get("split") else 1)[-1]  # after its cache's folder
                out.setdefault(name, []).append({"path": str(s.dir(ctx.store) / f["file"]), "rows": f["documents"],
                                                 "tokens": f["tokens"], "piece": rest.replace("/", "-")})
    return out
