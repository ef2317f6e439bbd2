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
                   combinable with buckets (`web/lang=fr/q5`)

Every kept document of a mixed source belongs to exactly one cell: the cells the YAML
names, and for a source with bucketed cells, one implicit cell (weight 0) per run of
buckets it leaves out, so `web/q1-q2` is named in the manifest and the ledger even when
the YAML only weights `web/q3-q5`. A source without cells is one cell named like it.

The mixture's budget, priorities, cutoffs and epochs work per cell exactly as they did per
source (pipeline/steps/mix/tasks.py); a cell's documents are chosen by the same seeded hash of
(source, id, epoch), so a source that is one cell gives the mixture it always gave.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

CELL = re.compile(r"^(?P<source>[A-Za-z0-9][A-Za-z0-9_.-]*)"
                  r"(?:/(?P<axis>[a-z][a-z0-9_]*)=(?P<value>[A-Za-z0-9][A-Za-z0-9_.-]*))?"
                  r"(?:/(?!q\d+(?:-q\d+)?(?:/|$))(?![a-z][a-z0-9_]*=)(?P<topic>[A-Za-z0-9][A-Za-z0-9_.-]*))?"
                  r"(?:/q(?P<lo>\d+)(?:-q(?P<hi>\d+))?)?$")
LANG = re.compile(r"^(?:[a-z]{2,3}(?:_[A-Z][a-z]{3})?|other)$")  # a `lang=` value: ISO 639 (+ script), or other


@dataclass(frozen=True)
class Cell:
    name: str
    source: str
    lo: int | None = None  # first bucket (1-based), None: every bucket
    hi: int | None = None  # last bucket, inclusive
    named: bool = True  # False: what no weight names (weight 0)
    topic: str | None = None  # None: every topic
    value: str | None = None  # of `axis`; None: every value; "other": the values no cell of the source names
    others: tuple[str, ...] = ()  # value "other": the values the source's cells name
    axis: str | None = None  # "lang", or an axis a stage declares

    @property
    def lang(self) -> str | None:
        return self.value if self.axis == "lang" else None

    def to_dict(self) -> dict:
        d = {"name": self.name, "source": self.source, "topic": self.topic, "lo": self.lo, "hi": self.hi,
             "named": self.named}
        if self.axis == "lang":  # only then: a mixture without axis cells keeps its config (language cells theirs)
            d.update({"lang": self.value, "others": list(self.others)})
        elif self.axis is not None:
            d.update({"axis": self.axis, "value": self.value, "others": list(self.others)})
        return d


def axis_value(c: dict) -> tuple[str, str] | None:
    """(axis, value) of a cell's dict (Cell.to_dict), or None when it names no axis."""
    if c.get("lang") is not None:
        return "lang", c["lang"]
    if c.get("axis") is not None:
        return c["axis"], c["value"]
    return None


def source_axis(source_cells: list[dict]) -> str | None:
    """The axis a source's cells are cut by (one per source), or None."""
    return next((av[0] for c in source_cells if (av := axis_value(c)) is not None), None)


def bucket_name(source: str, lo: int, hi: int, topic: str | None = None) -> str:
    head = f"{source}/{topic}" if topic else source
    return f"{head}/q{lo}" if lo == hi else f"{head}/q{lo}-q{hi}"


def parse(key: str) -> tuple[str, str | None, int | None, int | None] | None:
    """(source, topic, lo, hi) of a weight key, or None when it is not one (lang_of: its language)."""
    m = CELL.match(key)
    if not m:
        return None
    lo = int(m["lo"]) if m["lo"] else None
    hi = int(m["hi"]) if m["hi"] else lo
    return m["source"], m["topic"], lo, hi


def axis_of(key: str) -> tuple[str, str] | None:
    """(axis, value) of a weight key (`web/lang=fr/q5` -> (lang, fr)), None when it names none."""
    m = CELL.match(key)
    return (m["axis"], m["value"]) if m and m["axis"] else None


def lang_of(key: str) -> str | None:
    """The language of a weight key (`web/lang=fr/q5` -> fr), None when it names none."""
    av = axis_of(key)
    return av[1] if av and av[0] == "lang" else None


def axis_name(source: str, axis: str, value: str, lo: int | None = None, hi: int | None = None) -> str:
    head = f"{source}/{axis}={value}"
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


def _overlap(a: tuple, b: tuple) -> bool:
    """Do two (topic, lo, hi) rectangles of a source's topic x bucket grid share a document?"""
    (ta, la, ha), (tb, lb, hb) = a, b
    topics = ta is None or tb is None or ta == tb
    buckets = la is None or lb is None or not (ha < lb or hb < la)
    return topics and buckets


def problems(m, field: str = "weights", topics: dict | None = None,
             axes: dict[str, set[str]] | None = None) -> list[tuple[tuple, str]]:
    """What is wrong with the cell keys of `m` (a config.Mixture) under mixture.<field>
    (weights or sample_rates): (YAML location, message). `axes`: per source, the axes its
    stages declare (the plan's; None when loading the file, where only `lang` is checked)."""
    w = getattr(m.mixture, field) or {}
    topics = topics_of(m) if topics is None else topics
    out: list[tuple[tuple, str]] = []
    defined = ", ".join(m.sources)
    taken: dict[str, list[tuple[tuple, str]]] = {}
    for key, value in w.items():
        loc = ("mixture", field, key)
        p = parse(key)
        if p is None:
            out.append((loc, f"{key!r} is not a cell: write a source (web), a bucket (web/q5), a range of buckets "
                             "(web/q3-q4), a topic (web/code) or a topic's buckets (web/code/q5)"))
            continue
        source, topic, lo, hi = p
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
        if topic is not None:
            if source not in topics:
                out.append((loc, f"{key} names a topic, but source {source} has no topic classifier; set "
                                 f"sources.{source}.topic.classifier (a classifier with labels) or "
                                 f"sources.{source}.topics.clusters (embedding clusters)"))
                continue
            if topics[source] is not None and topic not in topics[source]:
                if spec.topics:
                    out.append((loc, f"{key}: {topic!r} is not a cluster of {source}; its clusters: c0 .. "
                                     f"c{spec.topics.clusters - 1} (sources.{source}.topics.clusters)"))
                else:
                    out.append((loc, f"{key}: {topic!r} is not a topic of {source}'s classifier; its labels: "
                                     f"{', '.join(topics[source])}"))
                continue
        av = axis_of(key)
        if av is not None:
            axis, value = av
            if axis == "lang":
                chain = [m.filters[f].type for f in spec.filters if f in m.filters]
                if not LANG.match(value):
                    out.append((loc, f"{key}: {value!r} is not a language code; write lang=<ISO 639 code>[_<Script>] "
                                     "(fr, zh_Hans) or lang=other"))
                    continue
                if "language" not in chain:
                    out.append((loc, f"{key} names a language, but {source}'s filters have no language filter to detect "
                                     f"it; add one to sources.{source}.filters (type: language, label_only: true keeps "
                                     "every document)"))
                    continue
            elif axes is not None and axis not in axes.get(source, ()):  # the plan knows the stages' axes
                out.append((loc, f"{key} names axis {axis!r}, but no stage declares it for {source}; its axes: "
                                 f"{', '.join(['lang'] + sorted(axes.get(source, ())))} (docs/extending.md: a mixture axis)"))
                continue
        axis = av[0] if av else None
        differ = [o[0] if (o := axis_of(other)) else None for r, other in taken.get(source, [])]
        if any(a != axis for a in differ):
            out.append((loc, f"{key}: give every weight key of {source} a language (lang=<code>, lang=other for the "
                             "rest), or none" if "lang" in [axis, *differ] else
                             f"{key}: give every weight key of {source} the same axis (<axis>=<value>, <axis>=other "
                             "for the rest), or none"))
            continue
        rect = (topic, lo, hi)
        clash = next((other for r, other in taken.get(source, []) if axis_of(other) == av and _overlap(rect, r)), None)
        if clash is not None:
            out.append((loc, f"{key} overlaps {clash}: a document may be in one cell only; "
                             "weight the whole source or disjoint cells"))
            continue
        taken.setdefault(source, []).append((rect, key))
    return out


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
        p = parse(key)
        if p is not None and p[0] in m.sources:
            av = axis_of(key)
            named.setdefault(p[0], []).append(Cell(key, p[0], p[2], p[3], topic=p[1], value=av and av[1],
                                                   axis=av and av[0]))
    out = []
    for s in m.sources:
        if s in excluded:
            continue
        mine = named.get(s)
        if mine and any(c.axis is not None for c in mine):
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
    """A source weighted by an axis (its language, or a stage's): its named cells, and for
    each named value (and `other`, the values no key names), per topic when keys name topics
    (`web/lang=fr/code/q5`), the runs of buckets no key covers, weight 0."""
    axis = mine[0].axis
    values = list(dict.fromkeys(c.value for c in mine if c.value != "other"))
    others = tuple(values)
    by_bucket = any(c.lo is not None for c in mine)
    by_topic = any(c.topic for c in mine)
    labels = list(topics.get(s) or []) if by_topic else [None]
    rank = {t: i for i, t in enumerate(labels)}
    n = m.sources[s].quality.n_buckets() if by_bucket else 1
    out = []
    for v in values + ["other"]:
        own = [c for c in mine if c.value == v]
        rest = others if v == "other" else ()
        named = [Cell(c.name, s, c.lo, c.hi, topic=c.topic, value=v, others=rest, axis=axis)
                 for c in sorted(own, key=lambda c: c.lo or 0)]
        filled = []
        for t in labels:
            for b, e in _uncovered([c for c in own if c.topic is None or c.topic == t], n):
                whole = not by_bucket or (b == 1 and e == n)
                head = axis_name(s, axis, v) + (f"/{t}" if t else "")
                filled.append(Cell(head if whole else bucket_name(head, b, e), s, None if whole else b,
                                   None if whole else e, named=False, topic=t, value=v, others=rest, axis=axis))
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
          values: np.ndarray | None = None) -> np.ndarray:
    """For each of n rows of one source (their quality buckets, topics and values of the
    source's axis (source_axis), or None), the position of its cell in `source_cells` (dicts
    of Cell.to_dict)."""
    if len(source_cells) == 1 and source_cells[0]["lo"] is None and source_cells[0].get("topic") is None \
            and axis_value(source_cells[0]) is None:
        return np.zeros(n, np.int64)
    out = np.full(n, -1, np.int64)
    for pos, c in enumerate(source_cells):
        m = np.ones(n, bool)
        if (av := axis_value(c)) is not None:
            if values is None:
                raise ValueError(f"cell {c['name']} is a value of {av[0]}, but the source's documents carry none")
            if av[1] == "other":
                named = set(c["others"])
                m &= np.fromiter((x not in named for x in values), bool, n)
            else:
                m &= np.fromiter((x == av[1] for x in values), bool, n)
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
    if "axis_groups" in d:
        g = acc.setdefault("axis_groups", {})
        for value, bucket, nd, nt, *topic in d["axis_groups"]:
            k = (value, bucket, topic[0] if topic else "")
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
        out["axis_groups"] = [[v, b, nd, nt, t] for (v, b, t), (nd, nt) in sorted(acc["axis_groups"].items())]
    return out


def available(cell_list: list[Cell], d: dict) -> dict[str, tuple[int, int]]:
    """(kept docs, kept tokens) per cell of one document shard `d`, from its markers: per
    (topic, bucket) group (a topic step), per bucket (a quality step), or the whole shard."""
    out = {}
    for c in cell_list:
        if c.axis is not None:  # the mix-axes step's counts per (value, bucket)
            docs = tok = 0
            for value, bucket, nd, nt, *topic in d["axis_groups"]:  # a 5th value: the topic ("" for none)
                if c.topic is not None and (topic[0] if topic else "") != c.topic:
                    continue
                if (value not in c.others if c.value == "other" else value == c.value) and \
                        (c.lo is None or c.lo <= bucket <= c.hi):
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
