"""Reading a run's token files back: which document holds a token (`curate explain RUN
--token FILE:OFFSET`), and `curate verify-tokens RUN`, which checks the files against the
formats' own invariants (each format's `check`, pipeline/steps/tokenize/registry.py), the
manifest and the mixture's texts (a format that verifies itself, Levanter's caches: its
`verify` and `locate`).

verify-tokens, per format and file:
- the layout: Megatron's `.idx` header, version 1, dtype code, document indices 0..n,
  pointers and lengths that tile the `.bin`; datatrove's index ending at the `.ds`'s
  length; the memmap csv's last end at the `.npy`'s length; the provenance sidecar's
  ranges tiling the file;
- the counts: tokens and documents per file equal to the manifest's, their sum the format's;
- the vocabulary: the dtype holds every id the tokenizer has, and no id in the file is at
  or past the vocabulary's size;
- the specials: EOS (and BOS) exactly at every document's boundary and nowhere inside;
- the texts: a seeded sample of documents (`--sample`, default 200) decodes to its row of
  the mixture file;
a token file is read once, front to back, 16M tokens at a time (never whole: a file may be
many GB); what is held per file is its provenance sidecar (16 bytes a document) and index;
- the sources: every document's source is one the mixture mixes (never an eval source).
"""

from __future__ import annotations

import hashlib
import random
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from pipeline.errors import UsageError
from pipeline.io import atomic, fs
from pipeline.steps.tokenize import registry
from pipeline.steps.tokenize.tasks import PROVENANCE

_SPLIT = re.compile(r"^(.*part-\d{5})-\d{5}$")


def _tokenized(run_dir: Path) -> dict:
    m = atomic.read_json(run_dir / "manifest.json") if (run_dir / "manifest.json").exists() else {}
    if "tokenized" not in m:
        raise UsageError(f"{run_dir}: no token files (manifest.json has no `tokenized`); add a `tokenize:` section and run again")
    return m


def locate(run_dir: Path, where: str) -> dict:
    """FILE:OFFSET (a token file under tokenized/, its name with or without extension) ->
    the document holding that token: id, source, cell, epoch, row and its token range."""
    file, sep, off = where.rpartition(":")
    if not sep or not off.isdigit():
        raise UsageError(f"--token {where!r}: give FILE:OFFSET, e.g. tokenized/megatron/part-00000.bin:1234")
    p = Path(file)
    rel = p.relative_to(run_dir) if p.is_absolute() and p.is_relative_to(run_dir) else p
    stem = str(rel)
    parts = Path(stem).parts
    if len(parts) > 1 and parts[0] == "tokenized" and parts[1] in registry.names() and registry.get(parts[1]).locate:
        # not a file (a Levanter cache: tokenized/levanter/<cache>[/train]): the format finds the document
        fmt = registry.get(parts[1])
        return fmt.locate(run_dir, _tokenized(run_dir)["tokenized"]["formats"][fmt.name], stem, int(off))
    for ext in sorted({e for n in registry.names() for e in registry.get(n).extensions}, key=len, reverse=True):
        if stem.endswith(ext):
            stem = stem[: -len(ext)]
            break
    side = run_dir / (stem + PROVENANCE)
    if not side.exists():
        raise UsageError(f"{run_dir / stem}: no such token file (its {PROVENANCE} is missing); "
                         f"see {run_dir / 'tokenized'} for the run's files")
    t = pq.read_table(side)
    ends = t.column("end").to_numpy()
    k = int(np.searchsorted(ends, int(off), side="right"))
    if k >= t.num_rows:
        fmt = Path(stem).parts[1] if len(Path(stem).parts) > 2 else None
        data = run_dir / (stem + (registry.get(fmt).data if fmt in registry.names() else ""))
        if "piece" in t.column_names and fmt in registry.names() and data.is_file():  # packed: the last sequence's padding
            size = np.dtype(_tokenized(run_dir)["tokenized"]["formats"][fmt]["dtype"]).itemsize
            if int(off) < data.stat().st_size // size:
                raise UsageError(f"{stem}: token {off} is padding (EOS) at the end of the file's last sequence")
        raise UsageError(f"{stem}: offset {off} is past its last token ({int(ends[-1]) - 1 if len(ends) else -1})")
    row = t.slice(k, 1).to_pylist()[0]
    if int(off) < row["start"]:  # packed files pad their sequences: no document holds the token
        raise UsageError(f"{stem}: token {off} is padding (EOS) at the end of a packed sequence; the next document "
                         f"starts at {row['start']}")
    return {"file": stem, "offset": int(off), "document": k, **row}


def verify(run_dir: Path, sample: int = 200, seed: int = 0) -> tuple[list[str], dict]:
    """(problems, summary) for every token file of the run."""
    from pipeline.plan import tokens

    m = _tokenized(run_dir)
    tz = m["tokenized"]
    mixed = set(m.get("sources", {}))
    problems: list[str] = []
    summary: dict = {}
    rng = random.Random(seed)
    enc = None
    try:
        enc = tokens.load(tz["tokenizer"])
    except UsageError as e:
        problems.append(f"the texts are not checked: {e}")
    for fmt, body in tz["formats"].items():
        f_ = registry.get(fmt)
        if f_.verify is not None:  # a format that reads itself back (Levanter's caches, as Levanter reads them)
            got, summary[fmt] = f_.verify(run_dir, tz, body, enc, sample, seed)
            problems += got
            continue
        dtype = np.dtype(body["dtype"])
        if dtype.itemsize == 2 and tz["vocab_size"] > 1 << 16:
            problems.append(f"{fmt}: dtype {body['dtype']} cannot hold the tokenizer's {tz['vocab_size']:,} ids")
        total = docs_seen = 0
        held_paths = {f["path"] for f in body.get("validation_files", [])}  # by the manifest: a phase may be named validation
        for f in body["files"] + body.get("validation_files", []):
            held = f["path"] in held_paths
            base = run_dir / f["path"]
            where = f["path"]
            data_path = base.with_name(base.name + f_.data)
            if not data_path.exists():
                problems.append(f"{where}{f_.data}: missing")
                continue
            size = data_path.stat().st_size
            if size % dtype.itemsize:
                problems.append(f"{where}{f_.data}: {size:,} bytes is not a whole number of {body['dtype']} tokens (truncated?)")
                continue
            n = size // dtype.itemsize
            side = pq.read_table(base.with_name(base.name + PROVENANCE))
            starts, ends = side.column("start").to_numpy(), side.column("end").to_numpy()
            seq_len = tz["pack"]["seq_len"] if tz.get("pack") else None
            layout = _layout(fmt, base, n, dtype, starts, ends, seq_len)
            problems += [f"{where}: {p}" for p in layout]
            rows_want = f.get("pieces", f["documents"])  # packed: a sidecar row a piece of a document
            if n != f["tokens"] or side.num_rows != rows_want:
                problems.append(f"{where}: {n:,} tokens and {side.num_rows:,} {'pieces' if seq_len else 'documents'}, "
                                f"the manifest says {f['tokens']:,} and {rows_want:,}")
            total += 0 if held else n
            if layout:  # the documents' places are not to be trusted: their contents are not read
                continue
            doc = _Docs(side, seq_len is not None, n)
            docs_seen += 0 if held else doc.count
            chosen = sorted(rng.sample(range(doc.count), min(sample, doc.count))) if enc is not None and sample else []
            picks = doc.pieces_of(chosen)
            scan = _Scan(doc.first, doc.last, tz["bos_id"], tz["eos_id"], picks, doc.gaps, starts, ends)
            digest = hashlib.sha256()
            for off, chunk in _chunks(data_path, dtype, n, digest):
                scan.add(off, chunk)
            problems += [f"{where}: {p}" for p in _digests(base, f.get("files", {}), data_path.name, digest.hexdigest())]
            if scan.max_id >= tz["vocab_size"]:
                problems.append(f"{where}: token id {scan.max_id:,} is past the vocabulary ({tz['vocab_size']:,})")
            problems += [f"{where}: {p}" for p in scan.problems()]
            bad = sorted(set(side.column("source").to_pylist()) - mixed) if mixed and not held else []  # validation: eval sources too
            if bad:
                problems.append(f"{where}: documents from sources the mixture does not mix: {bad}")
            if picks:
                problems += [f"{where}: {p}" for p in _texts(run_dir, f["path"], fmt, doc.whole(scan.docs, chosen),
                                                             side, tz, enc, f.get("mixture"), held)]
        if total != body["tokens"]:
            problems.append(f"{fmt}: {total:,} tokens in its files, the manifest says {body['tokens']:,}")
        summary[fmt] = {"files": len(body["files"]), "tokens": total, "documents": docs_seen}
    return problems, summary


def _layout(fmt: str, base: Path, n_tokens: int, dtype: np.dtype, starts: np.ndarray, ends: np.ndarray,
            seq_len: int | None = None) -> list[str]:
    out = []
    piece_ends = ends  # the memmap csv has a row a document, or a piece of one when packed
    if seq_len is None and len(starts) and (starts[0] != 0 or np.any(starts[1:] != ends[:-1]) or ends[-1] != n_tokens):
        out.append(f"its {PROVENANCE} ranges do not tile the file's {n_tokens:,} tokens")
    if seq_len is not None:  # packed: pieces in order, apart, inside the file; the file whole sequences
        if n_tokens % seq_len or (len(starts) and (np.any(starts[1:] < ends[:-1]) or np.any(ends <= starts)
                                                   or ends[-1] > n_tokens or starts[0] < 0)):
            out.append(f"its {n_tokens:,} tokens are not whole sequences of {seq_len:,} holding its {PROVENANCE} pieces")
        seq = np.full(n_tokens // seq_len, seq_len, np.int64)
        starts, ends = np.cumsum(seq) - seq, np.cumsum(seq)  # the sequences: what the index must list
    check = registry.get(fmt).check
    return out + (check(base, n_tokens, dtype, starts, ends, piece_ends, seq_len) if check is not None else [])


CHUNK_TOKENS = 1 << 24  # tokens read at a time: a token file is streamed, never held (32-64 MB a chunk)


def _chunks(path, dtype: np.dtype, n: int, digest=None, size: int = CHUNK_TOKENS):
    """(first token, its tokens) of a token file, `size` tokens at a time, from the start;
    `digest` (a hashlib object) takes every byte on the way (the file is read once)."""
    with fs.open_read(path) as f:
        off = 0
        while off < n:
            raw = f.read(min(size, n - off) * dtype.itemsize)
            if not raw:
                break
            if digest is not None:
                digest.update(raw)
            chunk = np.frombuffer(raw, dtype.newbyteorder("<"))
            yield off, chunk
            off += len(chunk)


class _Docs:
    """A file's documents from its sidecar: a row a document, or (packed) a row a piece, a
    document's pieces sharing its mixture row. `first`/`last`: where each document starts
    and ends in the file (BOS and EOS go there); `gaps`: the padding between pieces."""

    def __init__(self, side, packed: bool, n_tokens: int):
        starts, ends = side.column("start").to_numpy(), side.column("end").to_numpy()
        self.packed = packed
        if not packed:
            self.count, self.first, self.last = side.num_rows, starts, ends
            self.gaps = (np.zeros(0, np.int64), np.zeros(0, np.int64))
            self.by_doc = None
            return
        row, piece = side.column("row").to_numpy(), side.column("piece").to_numpy()
        order = np.lexsort((piece, row))  # each document's pieces together, in piece order
        new = np.r_[True, row[order][1:] != row[order][:-1]]
        self.by_doc = np.split(order, np.flatnonzero(new)[1:]) if len(order) else []
        self.count = len(self.by_doc)
        self.first = np.sort(np.array([starts[g[0]] for g in self.by_doc], np.int64))
        self.last = np.sort(np.array([ends[g[-1]] for g in self.by_doc], np.int64))
        bounds_a, bounds_b = np.r_[0, ends], np.r_[starts, n_tokens]
        keep = bounds_b > bounds_a
        self.gaps = (bounds_a[keep], bounds_b[keep])

    def pieces_of(self, docs: list[int]) -> list[int]:
        return docs if not self.packed else sorted(int(k) for d in docs for k in self.by_doc[d])

    def whole(self, pieces: dict[int, list[np.ndarray]], docs: list[int]) -> dict[int, list[np.ndarray]]:
        """Each chosen document's tokens, its pieces joined in order, keyed by a row of it."""
        if not self.packed:
            return pieces
        return {int(self.by_doc[d][0]): [c for k in self.by_doc[d] for c in pieces[int(k)]] for d in docs}


class _Scan:
    """One pass over a token file's chunks: the largest id, the specials at and away from the
    documents' boundaries (`starts`, `ends`: where documents begin and end; padding, in
    `gaps`, must be EOS and may be), and the tokens of the sampled pieces (`picks`, rows of
    the sidecar whose ranges are `ranges`)."""

    def __init__(self, starts: np.ndarray, ends: np.ndarray, bos: int | None, eos: int | None, picks: list[int],
                 gaps: tuple[np.ndarray, np.ndarray] | None = None, pstarts=None, pends=None):
        self.max_id = -1
        self.checks = [(name, tid, at) for name, tid, at in (("EOS", eos, ends - 1), ("BOS", bos, starts))
                       if tid is not None and len(starts)]
        self.wrong = {name: [0, None] for name, _, _ in self.checks}  # count, first document
        self.inside: dict[str, int | None] = {name: None for name, _, _ in self.checks}  # first token
        self.starts = starts if pstarts is None else pstarts
        self.ends = ends if pends is None else pends
        self.picks = picks
        self.gaps = gaps if gaps is not None else (np.zeros(0, np.int64), np.zeros(0, np.int64))
        self.eos = eos
        self.bad_pad: int | None = None  # the first padding token that is not EOS
        self.docs: dict[int, list[np.ndarray]] = {k: [] for k in picks}

    def _padding(self, off: int, hi: int) -> np.ndarray:
        """Positions of padding in [off, hi)."""
        ga, gb = self.gaps
        lo_i, hi_i = np.searchsorted(gb, off, side="right"), np.searchsorted(ga, hi)
        parts = [np.arange(max(int(a), off), min(int(b), hi)) for a, b in zip(ga[lo_i:hi_i], gb[lo_i:hi_i])]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def add(self, off: int, chunk: np.ndarray) -> None:
        hi = off + len(chunk)
        if len(chunk):
            self.max_id = max(self.max_id, int(chunk.max()))
        pads = self._padding(off, hi) if len(self.gaps[0]) else np.zeros(0, np.int64)
        if len(pads) and self.bad_pad is None:
            wrong = np.flatnonzero(chunk[pads - off] != self.eos)
            if len(wrong):
                self.bad_pad = int(pads[wrong[0]])
        for name, tid, at in self.checks:
            lo_i, hi_i = np.searchsorted(at, off), np.searchsorted(at, hi)
            here = at[lo_i:hi_i]
            bad = np.flatnonzero(chunk[here - off] != tid)
            if len(bad):
                w = self.wrong[name]
                w[0] += len(bad)
                w[1] = int(lo_i + bad[0]) if w[1] is None else w[1]
            hits = np.flatnonzero(chunk == tid) + off
            same = [a[np.searchsorted(a, off):np.searchsorted(a, hi)] for _, t, a in self.checks if t == tid]
            stray = np.setdiff1d(hits, np.concatenate(same + [pads]))  # BOS and EOS may be one token; padding is EOS
            if len(stray) and self.inside[name] is None:
                self.inside[name] = int(stray[0])
        for k in self.picks:
            a, b = max(int(self.starts[k]), off), min(int(self.ends[k]), hi)
            if a < b:
                self.docs[k].append(chunk[a - off:b - off].copy())

    def problems(self) -> list[str]:
        out = []
        for name, tid, _ in self.checks:
            count, first = self.wrong[name]
            if count:
                out.append(f"{count:,} documents lack {name} ({tid}) at their boundary, the first document {first}")
            if self.inside[name] is not None:
                out.append(f"{name} ({tid}) inside a document at token {self.inside[name]:,}")
        if self.bad_pad is not None:
            out.append(f"padding at token {self.bad_pad:,} is not EOS ({self.eos})")
        return out


def _digests(base: Path, files: dict, data_name: str, data_sha: str) -> list[str]:
    """Each file of a token file's set against the manifest's sha256: the data file's digest
    comes from the scan's pass, the others (index, sidecar: small) are read here."""
    out = []
    for name, info in sorted(files.items()):
        want = info.get("sha256") if isinstance(info, dict) else None
        if want is None:
            continue
        p = base.with_name(name)
        if name == data_name:
            got = data_sha
        elif p.exists():
            got = atomic.file_digest(p)[1]
        else:
            out.append(f"{name}: missing")
            continue
        if got != want:
            out.append(f"{name}: sha256 {got[:12]}… is not the manifest's {want[:12]}… (changed since the run wrote it)")
    return out


def _texts(run_dir: Path, rel: str, fmt: str, docs: dict, side, tz: dict, enc, named: str | None = None,
           held: bool = False) -> list[str]:
    """The sampled documents (`docs`: their tokens, from the scan), decoded against the
    mixture file's text (`named`: the mixture file the manifest names, `layout: cells`)."""
    stem = rel[len(f"tokenized/{fmt}/"):]
    mm = _SPLIT.match(stem)
    if named is not None:
        mixture = run_dir / "mixture" / named
    elif held:  # a held-out file: its texts are validation/<source>/part-XXXXX.parquet
        mixture = run_dir / f"{stem}.parquet"
    else:
        mixture = run_dir / "mixture" / f"{mm.group(1) if mm else stem}.parquet"
    if not mixture.exists():
        return [f"its mixture file {mixture} is missing"]
    texts = pq.read_table(mixture, columns=["text"]).column("text")
    rows = side.column("row").to_numpy()
    lo = 1 if tz["bos_id"] is not None else 0
    hi = 1 if tz["eos_id"] is not None else 0
    for k, parts in docs.items():
        whole = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        ids = whole[lo: len(whole) - hi].tolist()
        text = enc.decode(ids) if tz["tokenizer"] == "gpt2" else enc.decode(ids, skip_special_tokens=False)
        if text != texts[int(rows[k])].as_py():
            return [f"document {k} (mixture row {int(rows[k])}) does not decode to its mixture text"]
    return []
