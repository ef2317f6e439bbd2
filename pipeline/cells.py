"""Mixture cells: what `mixture.weights` weighs, a whole source or a range of its quality buckets.

The best mixtures are weighted by cells, not sources (Dolma's topic x quality vigintile
sample rates, Marin's (cluster, quality) weights). A weight key is

    web            the whole source
    web/q5         bucket 5 of the source's `quality.buckets` (or `edges`)
    web/q3-q4      buckets 3 to 4

Every kept document of a mixed source belongs to exactly one cell: the cells the YAML
names, and for a source with bucketed cells, one implicit cell (weight 0) per run of
buckets it leaves out, so `web/q1-q2` is named in the manifest and the ledger even when
the YAML only weights `web/q3-q5`. A source without cells is one cell named like it.

The mixture's budget, priorities, cutoffs and epochs work per cell exactly as they did per
source (pipeline/steps/mix.py); a cell's documents are chosen by the same seeded hash of
(source, id, epoch), so a source that is one cell gives the mixture it always gave.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

CELL = re.compile(r"^(?P<source>[A-Za-z0-9][A-Za-z0-9_.-]*)(?:/q(?P<lo>\d+)(?:-q(?P<hi>\d+))?)?$")


@dataclass(frozen=True)
class Cell:
    name: str
    source: str
    lo: int | None = None  # first bucket (1-based), None: every document of the source
    hi: int | None = None  # last bucket, inclusive
    named: bool = True  # False: the buckets no weight names (weight 0)

    def to_dict(self) -> dict:
        return {"name": self.name, "source": self.source, "lo": self.lo, "hi": self.hi}


def bucket_name(source: str, lo: int, hi: int) -> str:
    return f"{source}/q{lo}" if lo == hi else f"{source}/q{lo}-q{hi}"


def parse(key: str) -> tuple[str, int | None, int | None] | None:
    """(source, lo, hi) of a weight key, or None when it is not one."""
    m = CELL.match(key)
    if not m:
        return None
    lo = int(m["lo"]) if m["lo"] else None
    hi = int(m["hi"]) if m["hi"] else lo
    return m["source"], lo, hi


def problems(m, field: str = "weights") -> list[tuple[tuple, str]]:
    """What is wrong with the cell keys of `m` (a config.Mixture) under mixture.<field>
    (weights or sample_rates): (YAML location, message)."""
    w = getattr(m.mixture, field) or {}
    out: list[tuple[tuple, str]] = []
    defined = ", ".join(m.sources)
    taken: dict[str, list[tuple[int | None, int | None, str]]] = {}
    for key, value in w.items():
        loc = ("mixture", field, key)
        p = parse(key)
        if p is None:
            out.append((loc, f"{key!r} is not a cell: write a source (web), a bucket (web/q5) or a range of buckets (web/q3-q4)"))
            continue
        source, lo, hi = p
        if source not in m.sources:
            out.append((loc, f"{key} has weight {value} but no source named {source}; defined: {defined}"))
            continue
        spec = m.sources[source]
        if spec.role != "train":
            out.append((loc, f"{source} has role: {spec.role}, which is never mixed; remove its weight, or make it role: train"))
            continue
        if lo is not None:
            n = spec.quality.n_buckets() if spec.quality else None
            if n is None:
                out.append((loc, f"{key} names a quality bucket, but source {source} has no buckets; set "
                                 f"sources.{source}.quality.buckets (e.g. 5) or weight the whole source"))
                continue
            if not (1 <= lo <= hi <= n):
                out.append((loc, f"{key}: buckets of {source} are q1..q{n} (q1 the lowest scores); "
                                 f"a range is q<a>-q<b> with a <= b"))
                continue
        for olo, ohi, other in taken.get(source, []):
            if lo is None or olo is None or not (hi < olo or ohi < lo):
                out.append((loc, f"{key} overlaps {other}: a document may be in one cell only; "
                                 "weight the whole source or disjoint bucket ranges"))
                break
        else:
            taken.setdefault(source, []).append((lo, hi, key))
    return out


def cells(m) -> list[Cell]:
    """Every cell of the mixed sources, in YAML source order, then bucket order."""
    w = m.mixture.weights or m.mixture.sample_rates or {}
    excluded = m.excluded()
    named: dict[str, list[Cell]] = {}
    for key in w:
        p = parse(key)
        if p is not None and p[0] in m.sources:
            named.setdefault(p[0], []).append(Cell(key, p[0], p[1], p[2]))
    out = []
    for s in m.sources:
        if s in excluded:
            continue
        mine = named.get(s)
        if not mine or any(c.lo is None for c in mine):
            out.append(Cell(s, s))
            continue
        n = m.sources[s].quality.n_buckets()
        got = sorted(mine, key=lambda c: c.lo)
        filled, b = [], 1
        for c in got:
            if c.lo > b:
                filled.append(Cell(bucket_name(s, b, c.lo - 1), s, b, c.lo - 1, named=False))
            filled.append(c)
            b = c.hi + 1
        if b <= n:
            filled.append(Cell(bucket_name(s, b, n), s, b, n, named=False))
        out += filled
    return out


def rates(m, cell_list: list[Cell]) -> dict[str, float] | None:
    """Each cell's sample rate (0 where no key names it); None without sample_rates."""
    r = m.mixture.sample_rates
    if r is None:
        return None
    return {c.name: (r.get(c.name, 0.0) if c.named else 0.0) for c in cell_list}


def weights(m, cell_list: list[Cell]) -> dict[str, float] | None:
    """Each cell's weight (normalised when `mixture.normalize`); None without weights."""
    w = m.mixture.weights
    if w is None:
        return None
    got = {c.name: (w.get(c.name, 0.0) if c.named else 0.0) for c in cell_list}
    total = sum(got.values())
    return {k: v / total for k, v in got.items()} if m.mixture.normalize and total else got


def index(source_cells: list[dict], buckets: np.ndarray | None, n: int) -> np.ndarray:
    """For each of n rows of one source (its quality buckets, or None), the position of its
    cell in `source_cells` (dicts of Cell.to_dict)."""
    if len(source_cells) == 1 and source_cells[0]["lo"] is None:
        return np.zeros(n, np.int64)
    if buckets is None:
        raise ValueError("cells by quality bucket but the source's documents carry no bucket")
    his = np.array([c["hi"] for c in source_cells], np.int64)
    return np.searchsorted(his, buckets.astype(np.int64), side="left")
