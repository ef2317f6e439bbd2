"""Paragraph dedup: a paragraph (or line) found in too many documents is cut from all but
the first `max_occurrences` of them.

map (per document shard): the xxh3-128 hash of every stripped paragraph of at least
    `min_chars` characters, once per document; each hash's first `max_occurrences`
    holders in the shard are hash-partitioned, the shard's other holders stay in its
    rest file (pipeline/shards/combine.py), so a boilerplate paragraph in 10% of the
    documents costs its reducer `max_occurrences` rows per shard.
reduce (per partition): exact counts per paragraph hash; where more than
    `max_occurrences` documents hold it, the documents after the first `max_occurrences`
    in (source priority, id) order (or place: `dedup.order`, shards/combine.tiebreak) get a cut decision.
apply (per document shard): the cuts are made (each cut paragraph goes with the
    separator after it), the removed spans and character counts are recorded, the text
    and its token count are rewritten; a document left empty, or shorter than
    `min_doc_chars`, is removed with `paragraph_dedup:empty`.
"""

from __future__ import annotations

import time
from typing import NotRequired, TypedDict

import numpy as np
import pyarrow as pa
import xxhash

from pipeline.plan import tokens
from pipeline.engine.cutoff import Prior, prior_table, same_as_before
from pipeline.shards import combine, readkey, shuffle
from pipeline.shards import text
from pipeline.shards.apply import write_attributes
from pipeline.engine.step import task
from pipeline.io import fs
from pipeline.shards import view
from pipeline.shards.documents import DocShard

_M64 = (1 << 64) - 1


def _hashes(t: str, unit: str, min_chars: int) -> list[tuple[int, int, int, int]]:
    """(h1, h2, start, end) of each long-enough segment."""
    out = []
    for s, e in text.segments(t, unit):
        seg = t[s:e].strip()
        if len(seg) >= min_chars:
            v = xxhash.xxh3_128_intdigest(seg)
            out.append((v >> 64, v & _M64, s, e))
    return out


class ParagraphMapSpec(TypedDict):
    """A `dedup-paragraph-map` shard (steps/dedup/plan.py `per_doc`): one document shard's paragraph hashes."""

    doc: DocShard
    params: dict  # the dedup.paragraph section (min_chars, max_occurrences, unit, min_doc_chars)
    partitions: int  # the reducers' count
    order: NotRequired[str]  # dedup.order when place (combine.tiebreak)
    describe: str
    prior: NotRequired[Prior]  # from the executor: the earlier shard of the same partial key


@task(version=combine.VERSION)
def map_shard(spec: ParagraphMapSpec, out) -> dict:
    doc, p = spec["doc"], spec["params"]
    rk, state = readkey.shard(doc)  # an earlier shard that read the same is linked
    if (st := same_as_before(spec, out, rk)) is not None:
        return st
    h1, h2, ids, gids = [], [], [], []
    ndocs = 0
    for rows, b in view.kept_batches(doc["documents"], doc["layers"], ["id", "text"], state=state):
        g = shuffle.gid(doc["src"], doc["part"], rows)
        for gg, i, t in zip(g.tolist(), b.column("id").to_pylist(), b.column("text").to_pylist()):
            seen = set()
            for a, c, _, _ in _hashes(t, p["unit"], p["min_chars"]):
                if (a, c) not in seen:
                    seen.add((a, c))
                    h1.append(a)
                    h2.append(c)
                    ids.append(i)
                    gids.append(gg)
        ndocs += len(rows)
    table = pa.table({"h1": np.array(h1, dtype=np.uint64), "h2": np.array(h2, dtype=np.uint64),
                      "rank": np.full(len(h1), doc["rank"], np.int32), "id": pa.array(ids, pa.string()),
                      "gid": np.array(gids, dtype=np.int64)})
    top, rest = combine.local_top(table, [], p["max_occurrences"], combine.tiebreak(spec))
    segments = shuffle.write_partitions(top, shuffle.partition_of(top.column("h1").to_numpy(), spec["partitions"]),
                                        spec["partitions"], shuffle.map_file(fs.path(out.dir) / "buckets", out.index))
    return {"rows": ndocs, "paragraphs": len(h1), "partitions": spec["partitions"], "segments": segments,
            "rest": combine.write_rest(rest, fs.path(out.dir) / "rest", out.index), "read_key": rk}


class ParagraphReduceSpec(shuffle.ReduceSpec):
    """A `dedup-paragraph-reduce` shard (steps/dedup/plan.py `reduce_specs`): one hash partition."""

    params: dict  # the dedup.paragraph section
    order: NotRequired[str]  # dedup.order when place (combine.tiebreak)
    describe: str


@task(version="2")  # 2: decisions partitioned by slot (Context.slot_offsets)
def reduce_shard(spec: ParagraphReduceSpec, out) -> dict:
    t = shuffle.read_partition(spec["inputs"], spec["maps"], spec["partition"])
    target = shuffle.map_file(fs.path(out.dir) / "to", out.index)
    if t is None or t.num_rows == 0:
        shuffle.write_empty(spec["ndocs"], target)
        return {"rows": 0, "repeated": 0, "cuts": 0}
    t = t.sort_by([("h1", "ascending"), ("h2", "ascending"), ("rank", "ascending"), (combine.tiebreak(spec), "ascending")])
    head, cut, emit, st = combine.reduce_groups(t, spec["params"]["max_occurrences"])
    sel = np.flatnonzero(emit)
    first = pa.array(head[sel])
    names = spec["rank_source"]
    dec = pa.table({"h1": t.column("h1").take(pa.array(sel)), "h2": t.column("h2").take(pa.array(sel)),
                    "cut": pa.array(cut[sel]), "extra": t.column("extra").take(pa.array(sel)),
                    "kept_in": t.column("id").take(first),
                    "kept_in_source": pa.array([names[r] for r in t.column("rank").take(first).to_pylist()], pa.string())})
    shuffle.write_to_shards(dec, t.column("gid").to_numpy()[sel], spec["offsets"], spec["ndocs"], target)
    return {"rows": t.num_rows, "holders": st["holders"], "repeated": st["repeated"], "cuts": st["past"]}


SPAN = pa.struct([("start", pa.int64()), ("end", pa.int64()), ("kept_in", pa.string())])


def _counted_before(spec: ParagraphApplySpec) -> dict[int, int]:
    """xxh3-128 of a cut text -> its token count, from the earlier shard of this one's partial
    key (engine/cutoff.prior_table: the same documents, tokenizer and parameters): a shard
    whose decisions moved counts only the cut texts it has not counted."""
    t = prior_table(spec, ["text", "n_tokens"])  # the layer's cut texts and their counts
    if t is None:
        return {}
    return {xxhash.xxh3_128_intdigest(x): int(n) for x, n in zip(t.column("text").to_pylist(), t.column("n_tokens").to_pylist(),
                                                                 strict=True) if x is not None and n is not None}


class ParagraphApplySpec(TypedDict):
    """A `dedup-paragraph` shard (steps/dedup/plan.py `apply_step`): one document shard and its cuts."""

    doc: DocShard
    decisions: str  # the reduce step's folder, or its merge tier's (steps/merge.py read_from)
    reducers: int | list[int]  # the files there (read_from)
    slot: int  # the document shard's decision slot (plan/context.py `slot_offsets`)
    columns: None
    params: dict  # the dedup.paragraph section
    tokenizer_id: str | None  # in the step's hash; `tokenizer` is what counts the cut texts (plan/tokens.py)
    tokenizer: str | None
    combined: bool  # key-level decisions with the map's rest file (shards/combine.py)
    rest: str | None  # that rest file (None: the map kept no rest rows)
    describe: str
    prior: NotRequired[Prior]  # from the executor: the earlier shard of the same partial key


def apply_shard(spec: ParagraphApplySpec, out) -> dict:
    doc, p = spec["doc"], spec["params"]
    n = view.num_rows(doc["documents"])
    dec = combine.resolve(shuffle.decisions(spec["decisions"], spec["slot"], spec["reducers"]), spec.get("rest"),
                          ["kept_in", "kept_in_source"])
    rk, state = readkey.shard(doc, view.OVERRIDES, dec)
    if (got := same_as_before(spec, out, rk)) is not None:
        return got
    cuts: dict[int, dict[tuple[int, int], str]] = {}
    if dec is not None:
        for r, a, c, k, ks in zip(*(dec.column(x).to_pylist() for x in ("row", "h1", "h2", "kept_in", "kept_in_source"))):
            cuts.setdefault(r, {})[(a, c)] = f"{ks}:{k}"
    seen = np.zeros(n, bool)
    keep = np.zeros(n, bool)
    reason: list = [None] * n
    new_text: list = [None] * n
    new_chars: list = [None] * n
    spans: list = [None] * n
    cut_chars: list = [None] * n
    st = {"docs_in": 0, "docs_out": 0, "chars_in": 0, "chars_out": 0, "tokens_in": 0, "tokens_out": 0,
          "paragraphs_cut": 0, "chars_cut": 0, "docs_rewritten": 0}
    chars_all = np.zeros(n, np.int64)
    toks_all = np.zeros(n, np.int64)
    changed: list[int] = []
    for rows, b in view.kept_batches(doc["documents"], doc["layers"], ["id", "text", "n_chars", "n_tokens"], state=state):
        seen[rows] = keep[rows] = True
        chars_all[rows] = b.column("n_chars").to_numpy(zero_copy_only=False)
        toks_all[rows] = b.column("n_tokens").fill_null(0).to_numpy(zero_copy_only=False)
        if not cuts:
            continue
        texts = b.column("text").to_pylist()
        for k, r in enumerate(rows.tolist()):
            mine = cuts.get(r)
            if not mine:
                continue
            t = texts[k]
            removed, pieces, last = [], [], 0
            for a, c, s, e in _hashes(t, p["unit"], p["min_chars"]):
                if (a, c) in mine:
                    pieces.append(t[last:s])
                    removed.append({"start": s, "end": e, "kept_in": mine[(a, c)]})
                    last = e
            if not removed:
                continue
            pieces.append(t[last:])
            nt = "".join(pieces).rstrip()
            spans[r] = removed
            cut_chars[r] = len(t) - len(nt)
            st["paragraphs_cut"] += len(removed)
            st["chars_cut"] += len(t) - len(nt)
            if len(nt.strip()) == 0 or len(nt) < p["min_doc_chars"]:
                keep[r] = False
                reason[r] = "paragraph_dedup:empty"
            else:
                new_text[r] = nt
                new_chars[r] = len(nt)
                changed.append(r)
    new_toks: list = [None] * n
    tok_cpu, counted_before = 0.0, 0
    if changed:  # a cut text's tokens, counted again (BPE counts do not subtract)
        c0 = time.process_time()
        before = _counted_before(spec) if spec.get("tokenizer") is not None else {}
        keys = [xxhash.xxh3_128_intdigest(new_text[r]) for r in changed]
        todo = [k for k, h in enumerate(keys) if h not in before]  # the earlier shard's counts of the same texts
        counts = tokens.count(spec.get("tokenizer"), [new_text[changed[k]] for k in todo]) if todo else []
        got = dict(zip(todo, counts if counts is not None else [0] * len(todo), strict=True))
        tok_cpu = time.process_time() - c0
        counted_before = len(changed) - len(todo)
        for k, r in enumerate(changed):
            new_toks[r] = int(got[k]) if k in got else before[keys[k]]
    ids = fs.read_table(doc["documents"], columns=["id"]).column("id")
    table = pa.table({
        "id": ids, "keep": pa.array(np.where(seen, keep, False), pa.bool_(), mask=~seen),
        "reason": pa.array(reason, pa.string()), "text": pa.array(new_text, pa.string()),
        "n_chars": pa.array(new_chars, pa.int64()), "n_tokens": pa.array(new_toks, pa.int64()),
        "cut_chars": pa.array(cut_chars, pa.int64()), "cut_spans": pa.array(spans, pa.list_(SPAN)),
    })
    write_attributes(out.dir, doc, table)
    rows_in = np.flatnonzero(seen)
    out_rows = np.flatnonzero(keep)
    chars_out = chars_all.copy()
    toks_out = toks_all.copy()
    for r in changed:
        chars_out[r] = new_chars[r]
        toks_out[r] = new_toks[r]
    st.update({"docs_in": len(rows_in), "docs_out": len(out_rows), "chars_in": int(chars_all[rows_in].sum()),
               "chars_out": int(chars_out[out_rows].sum()), "tokens_in": int(toks_all[rows_in].sum()),
               "tokens_out": int(toks_out[out_rows].sum()), "docs_rewritten": len(changed)})
    empty = int(sum(1 for x in reason if x))
    return {"rows": len(rows_in), "source": doc["source"], "part": doc["part"], **st, "tokenizer_seconds": round(tok_cpu, 3),
            "counted_before": counted_before, "removed": {"paragraph_dedup:empty": empty} if empty else {}, "read_key": rk}
