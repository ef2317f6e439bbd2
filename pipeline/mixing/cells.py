"""Mixture cells: what `mixture.weights` weighs, a whole source or a range of its quality buckets.

The best mixtures are weighted by cells, not sources (Dolma's topic x quality vigintile
sample rates, Marin's (cluster, quality) weights). A weight key is

    web            the whole source
    web/q5         bucket 5 of the source's `quality.buckets` (or `edges`)
    web/q3-q4      buckets 3 to 4
    web/code       the documents of topic `code` (the source's `topic` classifier's top label)
    web/code/q5    both
    web/lang=fr    the documents of an axis value: `lang` (a language filter's detected
                   language; `lang=other` the languages no key names) or any axis a stage
                   declares (its layer's column named after the axis: `web/perplexity=3`),
                   combinable with buckets (`web/lang=fr/q5`), a topic (`web/topic=code`
                   is `web/code`) and other axes, in any order: `web/lang=fr/toxicity=t1/q2`
                   (every key of a source names the same axes; `other` per axis)

Every kept document of a mixed source belongs to exactly one cell: the cells the YAML
names, and for a source with bucketed cells, one implicit cell (weight 0) per run of
buckets it leaves out, so `web/q1-q2` is named in the manifest and the ledger even when
the YAML only weights `web/q3-q5`. A source without cells is one cell named like it.

The mixture's budget, priorities, cutoffs and epochs work per cell exactly as they did per
source (pipeline/steps/mix/tasks.py); a cell's documents are chosen by the same seeded hash of
(source, id, epoch), so a source that is one cell gives the mixture it always gave.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

import numpy as np

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # a source, a topic, an axis value
AXIS = re.compile(r"^(?P<axis>[a-z][a-z0-9_]*)=(?P<value>[A-Za-z0-9][A-Za-z0-9_.-]*)$")
BUCKETS = re.compile(r"^q(?P<lo>\d+)(?:-q(?P<hi>\d+))?$")


@dataclass(frozen=True)
class Cell:
    name: str
    source: str
    lo: int | None = None  # first bucket (1-based), None: every bucket
    hi: int | None = None  # last bucket, inclusive
    named: bool = True  # False: what no weight names (weight 0)
    topic: str | None = None  # None: every topic
    # (axis, value, others) per axis, in the source's axis order: `lang` or an axis a stage declares;
    # value "other": the values of that axis no cell of the source names (others)
    axes: tuple[tuple[str, str, tuple[str, ...]], ...] = ()

    @property
    def lang(self) -> str | None:
        return next((v for a, v, _ in self.axes if a == "lang"), None)

    def to_dict(self) -> dict:
        d = {"name": self.name, "source": self.source, "topic": self.topic, "lo": self.lo, "hi": self.hi,
             "named": self.named}
        if len(self.axes) == 1:  # a mixture of one axis (or none) keeps its config: language cells theirs
            axis, value, others = self.axes[0]
            d.update({"lang": value} if axis == "lang" else {"axis": axis, "value": value})
            d["others"] = list(others)
        elif self.axes:
            d["axes"] = [[a, v, list(o)] for a, v, o in self.axes]
        return d


def cell_axes(c: dict) -> list[tuple[str, str, list]]:
    """(axis, value, others) per axis of a cell's dict (Cell.to_dict), in the source's axis order."""
    if c.get("lang") is not None:
        return [("lang", c["lang"], c.get("others", []))]
    if c.get("axis") is not None:
        return [(c["axis"], c["value"], c.get("others", []))]
    return [(a, v, o) for a, v, o in c.get("axes", ())]


def source_axes(source_cells: list[dict]) -> list[str]:
    """The axes a source's cells are cut by (the same for each of its cells), or []."""
    return next(([a for a, _, _ in ax] for c in source_cells if (ax := cell_axes(c))), [])


@dataclass(frozen=True)
class Key:
    """A weight key, parsed: its axes as written (topic and buckets apart)."""

    source: str
    axes: tuple[tuple[str, str], ...] = ()
    topic: str | None = None
    lo: int | None = None
    hi: int | None = None


def parse_key(key: str) -> Key | None:
    """`source[/<axis>=<value>...][/<topic>][/q<a>[-q<b>]]`, the axes and the topic in any order
    (`topic=<label>` names the topic too), the buckets last; None when it is not a key."""
    source, *rest = key.split("/")
    if not NAME.match(source):
        return None
    lo = hi = None
    if rest and (b := BUCKETS.match(rest[-1])):
        lo = int(b["lo"])
        hi = int(b["hi"]) if b["hi"] else lo
        rest = rest[:-1]
    axes: list[tuple[str, str]] = []
    topic = None
    for part in rest:
        if (a := AXIS.match(part)) and a["axis"] != "topic":
            if any(x == a["axis"] for x, _ in axes):
                return None
            axes.append((a["axis"], a["value"]))
            continue
        label = a["value"] if a else part
        if topic is not None or BUCKETS.match(part) or not NAME.match(label):
            return None
        topic = label
    return Key(source, tuple(axes), topic, lo, hi)


def bucket_name(source: str, lo: int, hi: int, topic: str | None = None) -> str:
    head = f"{source}/{topic}" if topic else source
    return f"{head}/q{lo}" if lo == hi else f"{head}/q{lo}-q{hi}"


def axes_name(source: str, axes, topic: str | None = None, lo: int | None = None, hi: int | None = None) -> str:
    """The key of a cell: `source/<axis>=<value>.../<topic>/q<lo>-q<hi>` (axes: (axis, value, ...) each)."""
    head = source + "".join(f"/{a}={v}" for a, v, *_ in axes) + (f"/{topic}" if topic else "")
    return head if lo is None else bucket_name(head, lo, hi)


def topics_of(m) -> dict[str, list[str] | None]:
    """Per source with `topic:`, its classifier's labels (None: a pretrained model's, known at plan time)."""
    out = {}
    for s, spec in m.sources.items():
        if spec.topic and spec.topic.classifier in m.classifiers:
            labels = m.classifiers[spec.topic.classifier].labels
            out[s] = list(labels) if labels else None
        elif spec.topics:  # embedding clusters
            out[s] = cluster_labels(spec.topics.clusters)
    return out


def cluster_labels(k: int) -> list[str]:
    """The topics of a source's embedding clusters: c0 .. c<k-1>."""
    return [f"c{i}" for i in range(k)]


def cells(m, topics: dict | None = None, keys: dict | None = None) -> list[Cell]:
    """Every cell of the mixed sources, in YAML source order, then topic and bucket order.
    Documents no key names form cells of weight 0: per topic (when keys name topics), the
    runs of buckets (when keys name buckets) no key covers. `keys`: a phase's weights or
    sample rates (default: the mixture's)."""
    w = keys if keys is not None else (m.mixture.weights or m.mixture.sample_rates or {})
    topics = topics_of(m) if topics is None else topics
    excluded = m.excluded()
    named: dict[str, list[Cell]] = {}
    for key in w:
        k = parse_key(key)
        if k is not None and k.source in m.sources:
            named.setdefault(k.source, []).append(Cell(key, k.source, k.lo, k.hi, topic=k.topic,
                                                       axes=tuple((a, v, ()) for a, v in k.axes)))
    out = []
    for s in m.sources:
        if s in excluded:
            continue
        mine = named.get(s)
        if mine and any(c.axes for c in mine):
            out += _axis_cells(m, s, mine, topics)
            continue
        if not mine or any(c.lo is None and c.topic is None for c in mine):
            out.append(Cell(s, s))
            continue
        by_topic = any(c.topic for c in mine)
        by_bucket = any(c.lo is not None for c in mine)
        labels = list(topics.get(s) or []) if by_topic else [None]  # the plan passes every classifier's labels
        n = m.sources[s].quality.n_buckets() if by_bucket else 1
        rank = {t: i for i, t in enumerate(labels)}
        filled = list(mine)
        for t in labels:
            for b, e in _uncovered([c for c in mine if c.topic is None or c.topic == t], n):
                if by_bucket and not (b == 1 and e == n):
                    filled.append(Cell(bucket_name(s, b, e, t), s, b, e, named=False, topic=t))
                else:
                    filled.append(Cell(f"{s}/{t}" if t else s, s, None, None, named=False, topic=t))
        out += sorted(filled, key=lambda c: (rank.get(c.topic, -1), c.lo or 0))
    return out


def _axis_cells(m, s: str, mine: list[Cell], topics: dict) -> list[Cell]:
    """A source weighted by axes (its language, a stage's, or several): its named cells, and
    for each combination of the named values of every axis (and `other` per axis, the values
    no key names), per topic when keys name topics (`web/lang=fr/code/q5`), the runs of
    buckets no key covers, weight 0. The source's axis order is its first key's."""
    order = [a for a, _, _ in mine[0].axes]

    def values_of(c: Cell) -> tuple[str, ...]:
        got = {a: v for a, v, _ in c.axes}
        return tuple(got[a] for a in order)
    per_axis = [list(dict.fromkeys(values_of(c)[i] for c in mine if values_of(c)[i] != "other")) for i in range(len(order))]
    by_bucket = any(c.lo is not None for c in mine)
    by_topic = any(c.topic for c in mine)
    labels = list(topics.get(s) or []) if by_topic else [None]
    rank = {t: i for i, t in enumerate(labels)}
    n = m.sources[s].quality.n_buckets() if by_bucket else 1
    out = []
    for combo in itertools.product(*[vs + ["other"] for vs in per_axis]):
        own = [c for c in mine if values_of(c) == combo]
        axes = tuple((a, v, tuple(per_axis[i]) if v == "other" else ()) for i, (a, v) in enumerate(zip(order, combo)))
        named = [Cell(c.name, s, c.lo, c.hi, topic=c.topic, axes=axes) for c in sorted(own, key=lambda c: c.lo or 0)]
        filled = []
        for t in labels:
            for b, e in _uncovered([c for c in own if c.topic is None or c.topic == t], n):
                whole = not by_bucket or (b == 1 and e == n)
                filled.append(Cell(axes_name(s, axes, t, None if whole else b, None if whole else e), s,
                                   None if whole else b, None if whole else e, named=False, topic=t, axes=axes))
        # without topics: the named cells, then the uncovered (the order language cells always had)
        out += named + filled if not by_topic else sorted(named + filled, key=lambda c: (rank.get(c.topic, -1), c.lo or 0))
    return out


def _uncovered(cells_: list[Cell], n: int) -> list[tuple[int, int]]:
    """The runs [b, e] of buckets 1..n that none of `cells_` covers (a cell without buckets covers all)."""
    covered = set()
    for c in cells_:
        covered |= set(range(c.lo, c.hi + 1)) if c.lo is not None else set(range(1, n + 1))
    runs, b = [], 1
    while b <= n:
        if b in covered:
            b += 1
            continue
        e = b
        while e + 1 <= n and e + 1 not in covered:
            e += 1
        runs.append((b, e))
        b = e + 1
    return runs


def rates(m, cell_list: list[Cell], r: dict | None = None) -> dict[str, float] | None:
    """Each cell's sample rate (0 where no key names it); None without sample_rates."""
    r = m.mixture.sample_rates if r is None else r
    if r is None:
        return None
    return {c.name: (r.get(c.name, 0.0) if c.named else 0.0) for c in cell_list}


def weights(m, cell_list: list[Cell], w: dict | None = None) -> dict[str, float] | None:
    """Each cell's weight (normalised when `mixture.normalize`); None without weights."""
    w = m.mixture.weights if w is None else w
    if w is None:
        return None
    got = {c.name: (w.get(c.name, 0.0) if c.named else 0.0) for c in cell_list}
    total = sum(got.values())
    return {k: v / total for k, v in got.items()} if m.mixture.normalize and total else got


def index(source_cells: list[dict], buckets: np.ndarray | None, n: int, topics: np.ndarray | None = None,
          values: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """For each of n rows of one source (their quality buckets, topics and values of each of
    the source's axes (source_axes: axis -> values), or None), the position of its cell in
    `source_cells` (dicts of Cell.to_dict)."""
    if len(source_cells) == 1 and source_cells[0]["lo"] is None and source_cells[0].get("topic") is None \
            and not cell_axes(source_cells[0]):
        return np.zeros(n, np.int64)
    out = np.full(n, -1, np.int64)
    for pos, c in enumerate(source_cells):
        m = np.ones(n, bool)
        for axis, value, others in cell_axes(c):
            got = None if values is None else values.get(axis)
            if got is None:
                raise ValueError(f"cell {c['name']} is a value of {axis}, but the source's documents carry none")
            # numpy compares the object array elementwise (None equals no value): no Python loop over rows
            if value == "other":
                m &= ~np.logical_or.reduce([got == v for v in others], initial=False) if others else True
            else:
                m &= got == value
        if c.get("topic") is not None:
            if topics is None:
                raise ValueError(f"cell {c['name']} is a topic, but the source's documents carry no topic")
            m &= topics == c["topic"]
        if c["lo"] is not None:
            if buckets is None:
                raise ValueError(f"cell {c['name']} is a range of quality buckets, but the documents carry no bucket")
            m &= (buckets >= c["lo"]) & (buckets <= c["hi"])
        out[m & (out < 0)] = pos
    if (out < 0).any():
        t = None if topics is None else topics[out < 0][0]
        raise ValueError(f"a document (topic {t!r}) falls in no cell of {source_cells[0]['source']}: a topic the "
                         "classifier gives that the mixture's keys do not know")
    return out


def tally(acc: dict, d: dict) -> None:
    """Add one document shard's counts (its markers': kept, tokens, per bucket, per (topic,
    bucket), per (axis value, bucket, topic)) to a source's running sums `acc`: O(groups) a
    shard, whatever the number of cells. `available(cells, tallied(acc))` is then the sum
    of `available(cells, d)` over the shards, computed once (at 500 cells x 400 groups,
    per shard it cost 34-63 ms in the driver: hours at 5 x 10^5 shards)."""
    acc["kept"] = acc.get("kept", 0) + d["kept"]
    acc["tokens"] = acc.get("tokens", 0) + d["tokens"]
    if "bucket_docs" in d:
        for key in ("bucket_docs", "bucket_tokens"):
            have, add = acc.setdefault(key, []), d[key]
            if len(add) > len(have):
                have.extend([0] * (len(add) - len(have)))
            for i, v in enumerate(add):
                have[i] += v
    if "groups" in d:
        g = acc.setdefault("groups", {})
        for topic, bucket, nd, nt in d["groups"]:
            k = (topic, bucket)
            x = g.get(k)
            g[k] = (nd, nt) if x is None else (x[0] + nd, x[1] + nt)
    if "axis_groups" in d:  # a value: a string (one axis), or a list of one per axis
        g = acc.setdefault("axis_groups", {})
        for value, bucket, nd, nt, *topic in d["axis_groups"]:
            k = (tuple(value) if isinstance(value, list) else value, bucket, topic[0] if topic else "")
            x = g.get(k)
            g[k] = (nd, nt) if x is None else (x[0] + nd, x[1] + nt)


def tallied(acc: dict) -> dict:
    """A source's sums (`tally`) in the shape of one document shard's counts."""
    out = {"kept": acc.get("kept", 0), "tokens": acc.get("tokens", 0)}
    if "bucket_docs" in acc:
        out.update(bucket_docs=acc["bucket_docs"], bucket_tokens=acc["bucket_tokens"])
    if "groups" in acc:
        out["groups"] = [[t, b, nd, nt] for (t, b), (nd, nt) in sorted(acc["groups"].items(), key=lambda kv: (str(kv[0][0]), kv[0][1]))]
    if "axis_groups" in acc:
        out["axis_groups"] = [[list(v) if isinstance(v, tuple) else v, b, nd, nt, t]
                              for (v, b, t), (nd, nt) in sorted(acc["axis_groups"].items())]
    return out


def available(cell_list: list[Cell], d: dict) -> dict[str, tuple[int, int]]:
    """(kept docs, kept tokens) per cell of one document shard `d`, from its markers: per
    (topic, bucket) group (a topic step), per bucket (a quality step), or the whole shard."""
    out = {}
    for c in cell_list:
        if c.axes:  # the mix-axes step's counts per (value, bucket): a value per axis, in the cell's axis order
            docs = tok = 0
            for value, bucket, nd, nt, *topic in d["axis_groups"]:  # a 5th value: the topic ("" for none)
                if c.topic is not None and (topic[0] if topic else "") != c.topic:
                    continue
                vs = value if isinstance(value, (list, tuple)) else (value,)
                if all((v not in others if want == "other" else v == want) for (_, want, others), v in zip(c.axes, vs)) \
                        and (c.lo is None or c.lo <= bucket <= c.hi):
                    docs, tok = docs + nd, tok + nt
            out[c.name] = (docs, tok)
        elif c.lo is None and c.topic is None:
            out[c.name] = (d["kept"], d["tokens"])
        elif "groups" in d:
            docs = tok = 0
            for topic, bucket, nd, nt in d["groups"]:
                if (c.topic is None or c.topic == topic) and (c.lo is None or c.lo <= bucket <= c.hi):
                    docs, tok = docs + nd, tok + nt
            out[c.name] = (docs, tok)
        else:
            out[c.name] = (sum(d["bucket_docs"][c.lo - 1:c.hi]), sum(d["bucket_tokens"][c.lo - 1:c.hi]))
    return out
