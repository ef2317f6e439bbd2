"""What is wrong with a mixture's weight keys (pipeline/mixing/cells.py says what a key is):
each problem as (YAML location, message saying what to write instead)."""

from __future__ import annotations

import re

from pipeline.mixing.cells import parse_key, topics_of

LANG = re.compile(r"^(?:[a-z]{2,3}(?:_[A-Z][a-z]{3})?|other)$")  # a `lang=` value: ISO 639 (+ script), or other
GRAMMAR = ("write a source (web), a bucket (web/q5), a range of buckets (web/q3-q4), a topic (web/code), an axis "
           "value (web/lang=fr) or several of them (web/lang=fr/toxicity=t1/code/q5: each axis once, the buckets last)")


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
    taken: dict[str, list[tuple[tuple, dict, str]]] = {}  # per source: (rectangle, axis values, key)
    for key, value in w.items():
        loc = ("mixture", field, key)
        k = parse_key(key)
        if k is None:
            out.append((loc, f"{key!r} is not a cell: {GRAMMAR}"))
            continue
        source, topic, lo, hi = k.source, k.topic, k.lo, k.hi
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
        if topic is not None and (msg := _topic_problem(key, source, topic, spec, topics)):
            out.append((loc, msg))
            continue
        msg = next((p for axis, v in k.axes if (p := _axis_problem(m, key, source, axis, v, spec, axes))), None)
        if msg:
            out.append((loc, msg))
            continue
        mine = dict(k.axes)
        others = taken.get(source, [])
        if others and set(others[0][1]) != set(mine):
            names, want = sorted(mine), sorted(others[0][1])
            out.append((loc, f"{key}: give every weight key of {source} a language (lang=<code>, lang=other for the "
                             "rest), or none" if names in (["lang"], []) and want in (["lang"], []) else
                             f"{key}: give every weight key of {source} the same axes "
                             f"({', '.join(f'{a}=<value>' for a in want) or 'none'}, as {others[0][2]} does; "
                             "<axis>=other for the rest of an axis), or none"))
            continue
        rect = (topic, lo, hi)
        clash = next((other for r, vals, other in others if vals == mine and _overlap(rect, r)), None)
        if clash is not None:
            out.append((loc, f"{key} overlaps {clash}: a document may be in one cell only; "
                             "weight the whole source or disjoint cells"))
            continue
        taken.setdefault(source, []).append((rect, mine, key))
    return out


def _topic_problem(key: str, source: str, topic: str, spec, topics: dict) -> str | None:
    if source not in topics:
        return (f"{key} names a topic, but source {source} has no topic classifier; set "
                f"sources.{source}.topic.classifier (a classifier with labels) or "
                f"sources.{source}.topics.clusters (embedding clusters)")
    if topics[source] is not None and topic not in topics[source]:
        if spec.topics:
            return (f"{key}: {topic!r} is not a cluster of {source}; its clusters: c0 .. "
                    f"c{spec.topics.clusters - 1} (sources.{source}.topics.clusters)")
        return f"{key}: {topic!r} is not a topic of {source}'s classifier; its labels: {', '.join(topics[source])}"
    return None


def _axis_problem(m, key: str, source: str, axis: str, value: str, spec, axes: dict | None) -> str | None:
    if axis == "lang":
        chain = [m.filters[f].type for f in spec.filters if f in m.filters]
        if not LANG.match(value):
            return (f"{key}: {value!r} is not a language code; write lang=<ISO 639 code>[_<Script>] "
                    "(fr, zh_Hans) or lang=other")
        if "language" not in chain:
            return (f"{key} names a language, but {source}'s filters have no language filter to detect "
                    f"it; add one to sources.{source}.filters (type: language, label_only: true keeps "
                    "every document)")
    elif axes is not None and axis not in axes.get(source, ()):  # the plan knows the stages' axes
        return (f"{key} names axis {axis!r}, but no stage declares it for {source}; its axes: "
                f"{', '.join(['lang'] + sorted(axes.get(source, ())))} (docs/extending.md: a mixture axis)")
    return None
