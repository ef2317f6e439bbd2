"""Decontamination: remove training documents that contain eval items.

A mixture is only trusted when the data it will be judged on is not in it. Eval sets are
small (thousands to millions of n-grams), so they are not shuffled against the corpus but
broadcast: `decontaminate-index` (one task) reads the eval files named in
`decontaminate.against` and writes every item's distinct word n-grams as a sorted array of
64-bit hashes with the item each came from (12 bytes an n-gram; 10,000 items of 100 words:
~11 MB). `decontaminate` then runs once per document shard after dedup: it loads that
array, splits each kept document into units (paragraphs, or the whole document), hashes
each unit's n-grams and looks them up (numpy searchsorted). A unit is contaminated by an
item when at least `min_overlap` of its distinct n-grams are the item's; the document is
removed with `contaminated:<eval set>:<item id> (overlap=0.83)`, naming the unit with the
highest overlap. A 64-bit hash match is taken as a match: with a million eval n-grams a
false match has a chance of ~5e-14 per unit n-gram, and a unit needs half its n-grams to
match one item.

Words are those of fuzzy dedup (pipeline/shards/text.py `shingles`, without its digit
folding): the text lowercased, punctuation (datatrove's set) and whitespace turned into
spaces, split on spaces; so case, punctuation and spacing do not hide a copy, and numbers
still count. An n-gram is n consecutive words; hashing is vectorised over a batch of units.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NotRequired, TypedDict

import numpy as np
import orjson
import pyarrow as pa

from pipeline.plan import tokens
from pipeline.engine.cutoff import Prior, same_as_before
from pipeline.shards import apply, readkey
from pipeline.shards import text
from pipeline.engine.step import Step, shard_name
from pipeline.io import atomic, fs, readers
from pipeline.io.discover import format_from_name
from pipeline.shards import view
from pipeline.shards.documents import DocShard
from pipeline.plan.stage import Stage, texts

if TYPE_CHECKING:  # a worker does not load the config models
    from pipeline.plan.context import Context

OPTIONS = ("case", "punctuation")  # lowercased; punctuation (datatrove's set) and whitespace separate words


def unit_ngrams(texts: list[str], n: int, min_words: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each text, its distinct word n-gram hashes when it has at least `min_words` (and n)
    words: (hashes, text index, distinct n-grams per text), sorted by hash, then text."""
    if not texts:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    h, d = text.shingles(texts, n, OPTIONS, min_words=max(n, min_words))
    order = np.argsort(h, kind="stable")  # radix sort; shingles' output is text-major, so texts stay in order within a hash
    h, d = h[order], d[order]
    keep = np.ones(len(h), bool)
    keep[1:] = (h[1:] != h[:-1]) | (d[1:] != d[:-1])  # distinct within a text
    h, d = h[keep], d[keep]
    return h, d, np.bincount(d, minlength=len(texts))


def shared_ngrams(unit: str, item: str, n: int) -> list[str]:
    """The n-grams (as words) a unit shares with an eval item, in the unit's order: what
    `curate explain` shows. Words as above (fold without digits)."""
    def grams(t: str) -> list[str]:
        ws = bytes(text.fold([t], OPTIONS)).decode("utf-8", "replace").split()
        return [" ".join(ws[i:i + n]) for i in range(len(ws) - n + 1)]

    theirs = set(grams(item))
    out, seen = [], set()
    for g in grams(unit):
        if g in theirs and g not in seen:
            seen.add(g)
            out.append(g)
    return out


# ---------------------------------------------------------------- the eval index (one task)


def _items(path: str, fields: list[str], id_field: str | None):
    """(item id, text) of every record of one eval file."""
    name = fs.path(path).name
    fmt, comp = format_from_name(name)
    if fmt == "parquet":
        row = 0
        cols = fields + ([id_field] if id_field else [])
        for b in fs.parquet_file(path).iter_batches(columns=cols):
            for rec in b.to_pylist():
                yield (str(rec[id_field]) if id_field else f"{name}:{row}"), _join(rec, fields)
                row += 1
        return
    if comp is None and path.endswith((".gz", ".zst")):
        comp = "gzip" if path.endswith(".gz") else "zstd"
    for line_no, _, raw in readers.iter_lines(path, comp, {}):
        if not raw.strip():
            continue
        rec = orjson.loads(raw)
        yield (str(rec[id_field]) if id_field else f"{name}:{line_no}"), _join(rec, fields)


def _join(rec: dict, fields: list[str]) -> str:
    parts = []
    for f in fields:
        v = rec.get(f)
        if isinstance(v, list):
            parts += [str(x) for x in v]
        elif v is not None:
            parts.append(str(v))
    return "\n".join(parts)


class IndexSpec(TypedDict):
    """The `decontaminate-index` step's one shard (decontam.py `plan`): the eval sets and eval sources."""

    sets: list[dict]  # per eval set: name, files, text_fields, id_field, sha256
    sources: list[dict]  # an eval source's document shards: source, documents, layers
    ngram: int
    describe: str


def index_shard(spec: IndexSpec, out) -> dict:
    """`decontaminate-index`: every eval item's distinct n-gram hashes, sorted, with the item's number."""
    n = spec["ngram"]
    sets, ids, texts = [], [], []
    for es in spec["sets"]:
        for path in es["files"]:
            for item_id, t in _items(path, es["text_fields"], es["id_field"]):
                sets.append(es["name"])
                ids.append(item_id)
                texts.append(t)
    for d in spec.get("sources", []):  # eval sources: their documents after filters and dedup
        for _, b in view.kept_batches(d["documents"], d["layers"], ["id", "text"]):
            ids += b.column("id").to_pylist()
            texts += b.column("text").to_pylist()
            sets += [d["source"]] * b.num_rows
    h, d, counts = unit_ngrams(texts, n, n)
    order = np.lexsort((d, h))
    atomic.write_table(pa.table({"h": h[order], "item": d[order].astype(np.int32)}), out.path(".parquet", "index"),
                   compression="zstd")
    atomic.write_table(pa.table({"item": np.arange(len(ids), dtype=np.int32), "set": sets, "id": ids,
                             "ngrams": counts.astype(np.int64), "text": [t[:4000] for t in texts]}),
                   out.path(".parquet", "items"), compression="zstd")
    per_set: dict[str, dict] = {}
    for s_, c in zip(sets, counts.tolist(), strict=True):
        e = per_set.setdefault(s_, {"items": 0, "ngrams": 0, "too_short": 0})
        e["items"] += 1
        e["ngrams"] += c
        e["too_short"] += c == 0
    return {"rows": len(ids), "ngrams": int(len(h)), "index_bytes": int(len(h)) * 12, "sets": per_set}


# ---------------------------------------------------------------- per document shard


class Index:
    """The eval n-grams of one run, loaded once per worker process (`Index.of`): the index
    step's folder is named by its hash and never changes once committed, and Ray reuses a
    worker process for many tasks, so at 10^5 document shards the index is read about once
    per core, not once per shard."""

    _last: tuple[str, "Index"] | None = None  # the one index this process holds (a run checks against one)

    @classmethod
    def of(cls, step_dir: str) -> tuple["Index", bool]:
        """(the index of `step_dir`, whether this call read it)."""
        if cls._last is not None and cls._last[0] == step_dir:
            return cls._last[1], False
        cls._last = None  # the previous one's memory goes before the next is read
        idx = cls(step_dir)
        cls._last = (step_dir, idx)
        return idx, True

    def __init__(self, step_dir: str):
        t = fs.read_table(fs.path(step_dir) / "index" / "part-00000.parquet")
        self.h = t.column("h").to_numpy()
        self.item = t.column("item").to_numpy()
        items = fs.read_table(fs.path(step_dir) / "items" / "part-00000.parquet", columns=["set", "id"])
        self.sets = items.column("set").to_pylist()
        self.ids = items.column("id").to_pylist()

    def best(self, h: np.ndarray, unit: np.ndarray, n_units: int) -> tuple[np.ndarray, np.ndarray]:
        """Per unit, the item sharing most of its distinct n-grams (-1 if none; ties: the
        smallest item number) and how many. `h`, `unit`: distinct (hash, unit) pairs."""
        best_item = np.full(n_units, -1, np.int64)
        best_n = np.zeros(n_units, np.int64)
        if not len(self.h) or not len(h):
            return best_item, best_n
        lo = np.searchsorted(self.h, h, "left")
        hit = self.h[np.minimum(lo, len(self.h) - 1)] == h
        if not hit.any():
            return best_item, best_n
        lo, u = lo[hit], unit[hit]
        cnt = np.searchsorted(self.h, h[hit], "right") - lo  # an n-gram several items share
        starts = np.repeat(lo - np.concatenate([[0], np.cumsum(cnt)[:-1]]), cnt) + np.arange(cnt.sum())
        items = self.item[starts].astype(np.int64)
        units = np.repeat(u, cnt)
        pair, counts = np.unique(units * (len(self.sets) + 1) + items, return_counts=True)
        pu, pi = pair // (len(self.sets) + 1), pair % (len(self.sets) + 1)
        order = np.lexsort((pi, -counts, pu))  # per unit: most n-grams first, then the smallest item
        first = np.ones(len(order), bool)
        first[1:] = pu[order][1:] != pu[order][:-1]
        sel = order[first]
        best_item[pu[sel]] = pi[sel]
        best_n[pu[sel]] = counts[sel]
        return best_item, best_n


COLUMNS = {"eval_set": pa.string(), "eval_id": pa.string(), "overlap": pa.float64(), "units_flagged": pa.int32(),
           "ngrams_matched": pa.int32(), "unit_start": pa.int32(), "unit_end": pa.int32()}


class DecontamSpec(TypedDict):
    """A `decontaminate` shard (decontam.py `plan`): one document shard, checked against the eval index."""

    doc: DocShard
    index: str  # the decontaminate-index step's folder
    ngram: int
    unit: str  # paragraph or document
    min_overlap: float
    min_unit_words: int | None  # None: ngram
    train: list[str]  # the sources checked (role: train)
    action: str  # remove or cut
    tokenizer: str | None  # what a cut document's tokens are counted with (plan/tokens.py)
    describe: str
    prior: NotRequired[Prior]  # from the executor: the earlier shard of the same partial key


def apply_shard(spec: DecontamSpec, out) -> dict:
    """`decontaminate`, per document shard: an attribute file with `keep`, `reason` and the
    eval item each removed document contains (its set, id, overlap, the unit's span)."""
    doc, n = spec["doc"], spec["ngram"]
    rk, state = readkey.shard(doc)  # the kept texts: an earlier shard that read the same is linked
    if (got := same_as_before(spec, out, rk)) is not None:
        return got
    min_words = spec["min_unit_words"] or n
    idx, read = Index.of(spec["index"])
    total = view.num_rows(doc["documents"])
    rows, chars, toks = apply.sizes(doc, state)
    keep = np.zeros(total, bool)
    keep[rows] = True
    seen = keep.copy()
    cols = {c: [None] * total for c in COLUMNS}
    reason: list[str | None] = [None] * total
    removed: dict[str, int] = {}
    stats_sets: dict[str, dict] = {}
    items_hit: set[int] = set()
    cut = spec.get("action") == "cut"
    new_text: dict[int, str] = {}
    cut_stats = {"paragraphs_cut": 0, "chars_cut": 0, "docs_rewritten": 0}
    batches = view.kept_batches(doc["documents"], doc["layers"], ["text"], state=state) if doc["source"] in spec["train"] else []
    for r, b in batches:  # eval and reference sources pass: they are what is checked against
        units, owner, spans = [], [], []
        texts = dict(zip(r.tolist(), b.column("text").to_pylist(), strict=True))
        first: dict[int, range] = {}  # row -> its units' numbers (a document's units are consecutive)
        for row, t in texts.items():
            k0 = len(units)
            for a, e in ([(0, len(t))] if spec["unit"] == "document" else text.segments(t, "paragraph")):
                units.append(t[a:e])
                owner.append(row)
                spans.append((a, e))
            first[row] = range(k0, len(units))
        h, u, distinct = unit_ngrams(units, n, min_words)
        item, matched = idx.best(h, u, len(units))
        with np.errstate(divide="ignore", invalid="ignore"):
            overlap = np.where(distinct > 0, matched / np.maximum(distinct, 1), 0.0)
        flagged = np.flatnonzero((item >= 0) & (overlap >= spec["min_overlap"]))
        per_doc: dict[int, list[int]] = {}
        for k in flagged.tolist():
            per_doc.setdefault(owner[k], []).append(k)
        for row, ks in per_doc.items():
            k = max(ks, key=lambda x: (overlap[x], -x))  # the unit with the highest overlap, the first of equals
            it = int(item[k])
            items_hit.update(int(item[x]) for x in ks)
            es = idx.sets[it]
            why = f"contaminated:{es}:{idx.ids[it]} (overlap={overlap[k]:.2f})"
            if cut:  # drop the contaminated units; a document left empty is removed
                t = texts[row]
                gone = set(ks)
                left = "".join(t[spans[j][0]:spans[j][1]] for j in first[row] if j not in gone).rstrip()
                cut_stats["paragraphs_cut"] += len(ks)
                cut_stats["chars_cut"] += len(t) - len(left)
                if left.strip():
                    new_text[row] = left
                    cut_stats["docs_rewritten"] += 1
                    why = None
            if why is not None:
                keep[row] = False
                reason[row] = why
            vals = (es, idx.ids[it], round(float(overlap[k]), 6), len(ks), int(matched[ks].sum()), spans[k][0], spans[k][1])
            for c, v in zip(COLUMNS, vals, strict=True):
                cols[c][row] = v
            if why is not None:
                removed[f"contaminated:{es}"] = removed.get(f"contaminated:{es}", 0) + 1
            st = stats_sets.setdefault(es, {"documents": 0, "units": 0, "ngrams": 0})
            st["documents"] += 1
            st["units"] += len(ks)
            st["ngrams"] += int(matched[ks].sum())
    ids = fs.read_table(doc["documents"], columns=["id"]).column("id")
    rewrite = {}
    if cut:  # the text after the cut, with its counts, as paragraph dedup writes them
        changed = sorted(new_text)
        counts = tokens.count(spec.get("tokenizer"), [new_text[x] for x in changed]) if changed else None
        nt: list[str | None] = [None] * total
        nc: list[int | None] = [None] * total
        nk: list[int | None] = [None] * total
        chars_in, toks_in = int(chars.sum()), int(toks.sum())  # before the rewritten counts replace the old
        pos = {x: j for j, x in enumerate(rows.tolist())}
        for j, x in enumerate(changed):
            nt[x], nc[x] = new_text[x], len(new_text[x])
            nk[x] = int(counts[j]) if counts is not None else 0
            chars[pos[x]], toks[pos[x]] = nc[x], nk[x]  # what leaves the stage
        rewrite = {"text": pa.array(nt, pa.string()), "n_chars": pa.array(nc, pa.int64()), "n_tokens": pa.array(nk, pa.int64())}
    table = pa.table({"id": ids, "keep": pa.array(np.where(seen, keep, False), pa.bool_(), mask=~seen),
                      "reason": pa.array(reason, pa.string()),
                      **{c: pa.array(v, COLUMNS[c]) for c, v in cols.items()}, **rewrite})
    apply.write_attributes(out.dir, doc, table)
    st = apply.stage_stats(doc, rows, chars, toks, keep[rows], removed)
    if cut:
        st["chars_in"], st["tokens_in"] = chars_in, toks_in
        st.update(cut_stats)
    st["contamination"] = dict(sorted(stats_sets.items()))
    st["items_hit"] = sorted(items_hit)
    st["read_key"] = rk
    st["index_read"] = read  # the eval index read by this task (else held by its worker process from an earlier one)
    return st


def plan(ctx: Context) -> list[Step]:
    """The eval index (one task), then one task per document shard after dedup; the
    latter is a global layer. The eval files' sha256 enter the index step's hash, so
    editing an eval file re-runs decontamination and what follows; eval sources (role:
    eval) enter through their steps' hashes. The index task reads every eval source whole:
    eval sets are small (benchmarks), unlike the corpora it checks."""
    from pipeline.config import eval_files  # planning only: a worker does not load the config models

    dc = ctx.mixture.decontaminate
    if dc is None:
        return []
    base, layers = ctx.base(), ctx.layers
    sets, sources = [], []
    for e in dc.against:
        if isinstance(e, str):  # a source with role: eval, read after its filters and dedup
            sources.append(e)
            continue
        files = [f for p in e.paths for f in eval_files(ctx.lm, p)]
        sets.append({"name": e.name, "files": files, "text_fields": e.text_fields, "id_field": e.id_field,
                     "sha256": [atomic.file_digest(fs.path(f))[1] for f in files]})
    hashed = [{k: v for k, v in s.items() if k != "files"} for s in sets]  # contents, not where the files are
    prev = list(layers)

    def index_shards(st, stats) -> list[IndexSpec]:
        docs = [{"source": d["source"], "documents": d["documents"], "layers": d["layers"]}
                for d in (ctx.doc_shards(stats, prev) if sources else []) if d["source"] in sources]
        return [{"sets": sets, "sources": docs, "ngram": dc.ngram, "describe": "eval index"}]

    index = Step("decontaminate-index", "decontaminate-index", {"ngram": dc.ngram, "sets": hashed, "sources": sources},
                 (base + prev) if sources else [], index_shard, shards=index_shards)
    train = [s for s, v in ctx.mixture.sources.items() if v.role == "train"]
    params = {"ngram": dc.ngram, "unit": dc.unit, "min_overlap": dc.min_overlap, "min_unit_words": dc.min_unit_words,
              "train": train}  # eval and reference sources are references, never checked

    def shards(st, stats):
        return ({"doc": d, "index": str(index.dir(ctx.store)), **params, "action": dc.action, "tokenizer": ctx.tokenizer,
                 "describe": f"{d['source']}/{shard_name(d['part'])}"}
                for d in ctx.doc_shards(stats, prev))

    cfg = {**params, "action": dc.action, **({"tokenizer_id": ctx.tokenizer_id} if dc.action == "cut" else {})}
    layer = Step("decontaminate", "decontaminate", cfg, base + prev + [index],
                 apply_shard, shards=shards, position_free=True, read_keyed=("layers",))
    ctx.add_layer(layer, "decontaminate")
    ctx.declare("decontaminate", layer)
    ctx.declare("decontaminate_index", index)
    return [index, layer]


STAGE = Stage("decontam", plan, tasks=texts("decontaminate"), label="decontaminate")
