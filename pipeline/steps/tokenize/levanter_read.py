"""Reading a run's Levanter caches back (pipeline/views/tokens.py's part for `levanter`):
`curate explain RUN --token tokenized/levanter/<cache>:OFFSET` and `curate verify-tokens`.

A cache is read as Levanter reads it (levanter/store/jagged_array.py): each array opened
with tensorstore and Levanter's metadata as a constraint, `offsets[0]` the row count,
`offsets[i + 1]` the end of row i. Which document holds which tokens comes from the pieces'
provenance sidecars the manifest lists with their first token in the cache.

verify-tokens, per cache: the ledger finished and its rows, `offsets[0]`, the manifest's
documents and the sidecars' agreeing; the offsets equal to the sidecars' ends moved by
each piece's start; the data's size the manifest's tokens; EOS (and BOS) at every
boundary and nowhere inside; no id past the vocabulary; a seeded sample of documents
decoding to their text in the mixture file (layout mixture) or to their kept text (layout
cells: a cell holds documents the mixture did not choose). The data is read 16M ids at a time.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from pipeline.errors import UsageError
from pipeline.io import atomic, fs

READ = 16 << 20  # ids read at a time


def _open(path: Path, array: str):
    import tensorstore as ts

    from pipeline.steps.tokenize.levanter import array_spec

    return ts.open(array_spec({"driver": "file", "path": str(path / "input_ids" / array)}), open=True).result()


def locate(run_dir: Path, caches: dict, stem: str, off: int) -> dict:
    """The document at token `off` of the cache named by `stem` (its folder, with or without /train)."""
    hit = next(((n, c) for n, c in caches.items() if stem.rstrip("/") in (c["path"], c["path"].rsplit("/", 1)[0])), None)
    if hit is None:
        raise UsageError(f"{stem}: no such Levanter cache; the run's are "
                         f"{', '.join(c['path'] for c in caches.values())}")
    name, c = hit
    if off >= c["tokens"]:
        raise UsageError(f"{c['path']}: offset {off} is past its last token ({c['tokens'] - 1})")
    starts = np.array([p["start"] for p in c["pieces"]], np.int64)
    k = int(np.searchsorted(starts, off, side="right")) - 1
    while c["pieces"][k]["tokens"] == 0:  # an empty piece shares its start with the next
        k += 1
    p = c["pieces"][k]
    side = pq.read_table(run_dir / p["provenance"])
    ends = side.column("end").to_numpy()
    j = int(np.searchsorted(ends, off - p["start"], side="right"))
    row = side.slice(j, 1).to_pylist()[0]
    before = sum(q["documents"] for q in c["pieces"][:k])
    # layout cells: a piece is a cell's documents of a document shard, its rows that shard's
    of = "mixture" if name in ("mixture", "validation") else f"document shard {p['piece']}'s"
    return {"file": c["path"], "offset": off, "document": before + j, "piece": p["piece"], "row_of": of,
            **{**row, "start": row["start"] + p["start"], "end": row["end"] + p["start"]}}


def verify(run_dir: Path, tz: dict, body: dict, enc, sample: int, seed: int) -> tuple[list[str], dict]:
    problems: list[str] = []
    rng = random.Random(seed)
    total = docs = 0
    picked: list[tuple[str, object, int, int, dict]] = []  # (cache, data, start, end, document)
    for name, c in body["caches"].items():
        where = c["path"]
        folder = run_dir / c["path"]
        try:
            led = atomic.read_json(folder / "shard_ledger.json")
            offsets, data = _open(folder, "offsets"), _open(folder, "data")
        except (OSError, ValueError) as e:
            problems.append(f"{where}: cannot be opened as Levanter opens it: {str(e)[:300]}")
            continue
        rows = int(offsets[0].read().result())
        if not led.get("is_finished") or led.get("total_num_rows") != rows or rows != c["documents"]:
            problems.append(f"{where}: ledger rows {led.get('total_num_rows')} (finished: {led.get('is_finished')}), "
                            f"offsets[0] {rows}, manifest {c['documents']}")
            continue
        ends = offsets[1:rows + 1].read().result().astype(np.int64) if rows else np.zeros(0, np.int64)
        sides = [pq.read_table(run_dir / p["provenance"]) for p in c["pieces"]]
        want = np.concatenate([s.column("end").to_numpy() + p["start"] for s, p in zip(sides, c["pieces"])] or
                              [np.zeros(0, np.int64)])
        if len(want) != rows or not np.array_equal(want, ends):
            problems.append(f"{where}: offsets do not match the provenance sidecars' document ends")
            continue
        size = int(ends[-1]) if rows else 0
        if size != c["tokens"]:
            problems.append(f"{where}: {size:,} tokens, the manifest says {c['tokens']:,}")
        problems += [f"{where}: {p}" for p in _scan(data, ends, size, tz)]
        total += size if name != "validation" else 0
        docs += rows if name != "validation" else 0
        meta = [r for s in sides for r in s.select(["id", "source"]).to_pylist()]
        picks = sorted(rng.sample(range(rows), min(sample, rows))) if enc is not None and sample else []
        picked += [(where, data, 0 if i == 0 else int(ends[i - 1]), int(ends[i]), {**meta[i], "i": i}) for i in picks]
    texts = _texts(run_dir, {(m["source"], m["id"]) for *_, m in picked})
    unchecked = 0
    for where, data, a, b, m in picked:
        text = texts.get((m["source"], m["id"]))
        if text is None:  # layout cells: a document the mixture did not choose
            unchecked += 1
            continue
        ids = data[a:b].read().result().tolist()
        body_ids = ids[(tz["bos_id"] is not None):len(ids) - (tz["eos_id"] is not None)]
        if enc.decode(body_ids) != text:
            problems.append(f"{where}: document {m['i']} ({m['source']}/{m['id']}) does not decode to its text")
    if total != body["tokens"]:
        problems.append(f"levanter: {total:,} tokens in its caches, the manifest says {body['tokens']:,}")
    return problems, {"files": len(body["caches"]), "tokens": total, "documents": docs, "texts_unchecked": unchecked}


def _scan(data, ends: np.ndarray, size: int, tz: dict) -> list[str]:
    """EOS/BOS at the boundaries only, ids below the vocabulary: the data read READ ids at a time."""
    out, eos, bos = [], tz["eos_id"], tz["bos_id"]
    last = ends - 1
    first = np.r_[0, ends[:-1]] if len(ends) else ends
    for a in range(0, size, READ):
        chunk = data[a:min(size, a + READ)].read().result()
        if len(chunk) and int(chunk.max()) >= tz["vocab_size"]:
            out.append(f"token id {int(chunk.max()):,} is past the vocabulary ({tz['vocab_size']:,})")
        for special, at in ((eos, last), (bos, first)):
            if special is None:
                continue
            hits = np.flatnonzero(chunk == special) + a
            where = at[(at >= a) & (at < a + len(chunk))]
            if not np.array_equal(np.intersect1d(hits, where), where):
                out.append(f"a document boundary lacks the special {special}")
            if len(np.setdiff1d(hits, at)):
                out.append(f"the special {special} inside a document, at token {int(np.setdiff1d(hits, at)[0])}")
    return sorted(set(out))


def _texts(run_dir: Path, wanted: set[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """(source, id) -> text of the wanted documents in the mixture's and the validation files
    (the texts the caches hold): a file's id columns read, then its wanted rows only."""
    out = {}
    for folder in ("mixture", "validation"):
        for p in sorted(fs.path(run_dir / folder).rglob("*.parquet")) if wanted else []:
            t = pq.read_table(p, columns=["id", "source"])
            keys = list(zip(t.column("source").to_pylist(), t.column("id").to_pylist()))
            rows = [i for i, k in enumerate(keys) if k in wanted]
            if rows:
                got = pq.read_table(p, columns=["text"]).column("text").take(rows).to_pylist()
                out.update(zip([keys[i] for i in rows], got))
    return out
