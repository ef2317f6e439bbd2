"""Mixture cells (pipeline/mixing/cells.py): exact quality buckets per source and weights over
ranges of them, through real runs (a fastText model trained in the run, real Parquet),
the same whatever the workers and shards."""

from __future__ import annotations

import math

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.mixing import cells, keys
from pipeline import config
from pipeline.shards import select
from pipeline.errors import UsageError
from pipeline.io import atomic
from tests.conftest import curate, write_yaml

WEIGHTS = {"web/q4": 0.3, "web/q2-q3": 0.3, "wiki": 0.4}


def _yaml(d, name, corpus, shard_rows, weights=WEIGHTS, quality="buckets: 4"):
    w = ", ".join(f"{k}: {v}" for k, v in weights.items())
    return write_yaml(d / f"{name}.yaml", f"""
        name: {name}
        output: out
        sources:
          wiki: {{paths: ["{corpus}/wiki/summaries_en.parquet"], id_field: id, max_shard_rows: {shard_rows}}}
          web:
            paths: ["{corpus}/web/*.jsonl.zst"]
            max_shard_rows: {shard_rows}
            quality: {{classifier: wiki_vs_web, {quality}}}
        classifiers:
          wiki_vs_web: {{positive: [wiki], negative: [web], epochs: 3, dim: 16, bucket: 20000, max_examples_per_class: 3000}}
        mixture:
          weights: {{{w}}}
          target_tokens: 1500000
          max_epochs: 4
    """)


def _run(d, name, corpus, workers, shard_rows, env=None):
    y = _yaml(d, name, corpus, shard_rows)
    r = curate("run", str(y), "--workers", str(workers), env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return y, d / "out" / name


def _buckets(run) -> dict[str, tuple[int, float]]:
    """id -> (bucket, score) of every web document that reached the quality stage."""
    steps = atomic.read_json(run / "run.json")["steps"]
    t = pq.read_table(sorted((run / steps["quality-web"]["dir"] / "web").glob("*.parquet")))
    return {r["id"]: (r["bucket"], r["score"]) for r in t.to_pylist() if r["keep"] is not None}


@pytest.fixture(scope="module")
def two_runs(demo_corpus, tmp_path_factory, joined, joined_1cpu):
    d = tmp_path_factory.mktemp("cells")
    return d, _run(d, "one", demo_corpus, 1, 2500, env=joined_1cpu), _run(d, "two", demo_corpus, 2, 900, env=joined)


def test_buckets_are_exact_quantiles_whatever_the_sharding(two_runs):
    _, (_, a), (_, b) = two_runs
    ba, bb = _buckets(a), _buckets(b)
    assert ba == bb  # the same bucket (and score) for every document, 1 worker / 2 workers, other shard sizes
    sizes = np.bincount([v[0] for v in ba.values()], minlength=5)[1:]
    assert sizes.max() - sizes.min() <= 1 and sizes.sum() == len(ba), sizes
    for k in range(1, 4):  # every score of bucket k is at most every score of bucket k+1
        assert max(s for q, s in ba.values() if q == k) <= min(s for q, s in ba.values() if q == k + 1)
    # the report's score edges, what `edges:` takes to fix the buckets (docs/classifiers.md, "Pinned"), give each
    # document its bucket (a score equal to an edge, split by the id hash between two buckets, goes to the upper one)
    edges = np.array(atomic.read_json(a / "report.json")["sources"]["web"]["quality"]["bucket_edges"], np.float32)
    assert len(edges) == 3 and (np.diff(edges) >= 0).all()
    for q, sc in ba.values():
        if np.float32(sc) not in edges:
            assert 1 + np.searchsorted(edges, np.float32(sc), side="right") == q


def test_cells_meet_their_weights_and_bytes_do_not_depend_on_workers(two_runs):
    _, (_, a), (_, b) = two_runs
    ma, mb = (atomic.read_json(r / "manifest.json") for r in (a, b))
    assert [f["sha256"] for f in ma["files"]] == [f["sha256"] for f in mb["files"]]
    c = ma["cells"]
    assert set(c) == {"wiki", "web/q1", "web/q2-q3", "web/q4"}  # q1: no weight names it, a cell of weight 0
    for name, w in WEIGHTS.items():
        assert abs(c[name]["realized_weight"] - w) <= 0.005, (name, c[name])
    assert c["web/q1"]["tokens"] == 0 and c["web/q1"]["target_weight"] == 0.0
    assert c["web/q4"]["epochs"] > 1  # the top quartile is repeated to reach its share
    assert sum(v["tokens"] for v in c.values()) == ma["total_tokens"]

    # the files: quality_bucket as a column, no q1 document, each row's bucket its document's
    rows = pq.read_table(sorted((a / "mixture").glob("*.parquet")), columns=["id", "source", "quality_bucket", "epoch"]).to_pylist()
    buckets = _buckets(a)
    web = [r for r in rows if r["source"] == "web"]
    assert web and all(r["quality_bucket"] == buckets[r["id"]][0] for r in web)
    assert not any(r["quality_bucket"] == 1 for r in web)
    assert all(r["quality_bucket"] is None for r in rows if r["source"] == "wiki")
    per_cell = {"web/q4": 0, "web/q2-q3": 0}
    for r in web:
        per_cell["web/q4" if r["quality_bucket"] == 4 else "web/q2-q3"] += 1
    assert per_cell == {k: c[k]["documents"] for k in per_cell}

    # accounting: every kept q1 document is removed at the mix with the cell's reason
    led = atomic.read_json(a / "ledger.json")
    q1_kept = sum(1 for q, _ in buckets.values() if q == 1)
    assert led["sources"]["web"]["removed"]["mix"]["cell_weight_0:web/q1"] == q1_kept
    assert all(e["conservation"] is True for e in led["sources"].values())


def test_plan_explain_and_samples_name_the_cell(two_runs):
    d, (y, a), _ = two_runs
    r = curate("plan", str(y))
    assert r.returncode == 0, r.stderr
    lines = {ln.split()[0]: ln for ln in r.stdout.splitlines() if ln.startswith(("wiki ", "web/"))}
    assert set(lines) >= {"web/q1", "web/q2-q3", "web/q4"} and "left out" in lines["web/q1"]
    q1 = next(i for i, (q, _) in _buckets(a).items() if q == 1)
    r = curate("explain", str(a), "--id", q1)
    assert r.returncode == 0, r.stderr
    assert "removed at mix: cell_weight_0:web/q1" in r.stdout and "bucket=1" in r.stdout
    import json  # the published samples show the cell's reason too

    removed = [json.loads(x) for x in (a / "samples" / "web" / "removed.jsonl").read_text().splitlines()]
    assert any(x["stage"] == "mix" and x["reason"] == "cell_weight_0:web/q1" for x in removed)


def test_editing_a_cell_weight_reruns_only_the_mixture(two_runs, demo_corpus, joined_1cpu):
    d, (y, a), _ = two_runs
    y2 = _yaml(d, "one", demo_corpus, 2500, weights={"web/q4": 0.2, "web/q2-q3": 0.4, "wiki": 0.4})
    r = curate("run", str(y2), "--workers", "1", env=joined_1cpu)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = atomic.read_json(a / "run.json")["steps"]
    ran = {k for k, v in steps.items() if v["status"] == "SUCCESS"}
    assert ran and all(k.startswith(("mix", "samples")) for k in ran), ran
    c = atomic.read_json(a / "manifest.json")["cells"]
    assert abs(c["web/q4"]["realized_weight"] - 0.2) <= 0.005 and abs(c["web/q2-q3"]["realized_weight"] - 0.4) <= 0.005


@pytest.mark.parametrize("weights,quality,want", [
    ({"web/q5": 1.0}, "buckets: 4", "web/q5: buckets of web are q1..q4"),
    ({"web/q3-q2": 1.0}, "buckets: 4", "a range is q<a>-q<b> with a <= b"),
    ({"web": 0.5, "web/q1": 0.5}, "buckets: 4", "web/q1 overlaps web"),
    ({"web/q1-q3": 0.5, "web/q3-q4": 0.5}, "buckets: 4", "web/q3-q4 overlaps web/q1-q3"),
    ({"wiki/q1": 1.0}, "buckets: 4", "source wiki has no buckets; set sources.wiki.quality.buckets"),
    ({"web/q1/q2": 1.0}, "buckets: 4", "'web/q1/q2' is not a cell"),
    ({"web/code": 1.0}, "buckets: 4", "web/code names a topic, but source web has no topic classifier"),
    ({"crawl/q1": 1.0}, "buckets: 4", "no source named crawl"),
    ({"web/q2": 1.0}, "edges: [0.5, 0.3]", "edges must be strictly ascending"),
    ({"web/q2": 1.0}, "buckets: 4, edges: [0.5]", "give buckets (quantiles) or edges"),
])
def test_bad_cells_are_refused_with_the_key(tmp_path, weights, quality, want):
    y = _yaml(tmp_path, "bad", tmp_path, 100, weights=weights, quality=quality)
    with pytest.raises(UsageError) as e:
        config.load(y)
    assert want in str(e.value) and f"{y}:" in str(e.value)


def _random_ranges(n: int, data) -> list[tuple[int, int]]:
    """Some of a random cut of buckets 1..n into disjoint ranges."""
    cuts = sorted(data.draw(st.sets(st.integers(1, n), max_size=n)))
    ranges, lo = [], 1
    for c in cuts + [n]:
        if c >= lo:
            ranges.append((lo, c))
            lo = c + 1
    return data.draw(st.lists(st.sampled_from(ranges), unique=True, min_size=1))


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 30), st.data())
def test_every_bucket_is_in_exactly_one_cell(n, data):
    named = _random_ranges(n, data)
    w = {cells.bucket_name("web", a, b): 1.0 / len(named) for a, b in named}
    m = config.Mixture.model_validate({
        "name": "x", "sources": {"web": {"paths": ["x"], "quality": {"classifier": "c", "buckets": n}}},
        "classifiers": {"c": {"model": "m.bin"}}, "mixture": {"weights": w, "normalize": True}})
    assert not keys.problems(m)
    got = cells.cells(m)
    covered = [b for c in got for b in range(c.lo, c.hi + 1)]
    assert covered == list(range(1, n + 1))  # in order, once each
    assert {c.name for c in got if c.named} == set(w)
    ws = cells.weights(m, got)
    assert abs(sum(ws.values()) - 1) < 1e-9 and all(ws[c.name] == 0 for c in got if not c.named)
    # each bucket maps to its cell
    idx = cells.index([c.to_dict() for c in got], np.arange(1, n + 1), n)
    assert [got[i].lo <= b <= got[i].hi for i, b in zip(idx, range(1, n + 1))] == [True] * n


@settings(max_examples=120, deadline=None)
@given(st.integers(2, 8), st.data())
def test_cell_targets_are_met_within_one_document_and_no_document_passes_its_cap(n, data):
    """Random cells over a bucketed source (and a whole second source), random weights,
    sizes, targets and caps, through the mixture's own functions: the budget, the key files
    and their merge (mix.selection, the select step's maths), and each document's epochs (budget.cell_epochs)."""
    import tempfile

    from pipeline.mixing import budget
    from pipeline.steps.mix import tasks as mix

    docs = data.draw(st.lists(st.tuples(st.integers(1, n), st.integers(1, 300)), min_size=1, max_size=60))
    other = data.draw(st.lists(st.integers(1, 300), min_size=1, max_size=30))
    named = _random_ranges(n, data)
    raw = {cells.bucket_name("web", a, b): data.draw(st.floats(0.05, 1.0)) for a, b in named}
    raw["wiki"] = data.draw(st.floats(0.05, 1.0))
    m = config.Mixture.model_validate({
        "name": "x", "sources": {"wiki": {"paths": ["x"]}, "web": {"paths": ["x"], "quality": {"classifier": "c", "buckets": n}}},
        "classifiers": {"c": {"model": "m.bin"}}, "mixture": {"weights": raw, "normalize": True}})
    cl = cells.cells(m)
    cd = {c.name: {**c.to_dict(), "index": i} for i, c in enumerate(cl)}
    ids = {"web": [f"w{i}" for i in range(len(docs))], "wiki": [f"k{i}" for i in range(len(other))]}
    tokens = {"web": np.array([t for _, t in docs], np.int64), "wiki": np.array(other, np.int64)}
    buckets = np.array([b for b, _ in docs], np.int64)
    where = {"web": cells.index([cd[c.name] for c in cl if c.source == "web"], buckets, len(docs)),
             "wiki": np.zeros(len(other), np.int64)}
    mine = {s: [cd[c.name] for c in cl if c.source == s] for s in ("web", "wiki")}
    avail = {c: int(tokens[v["source"]][where[v["source"]] == mine[v["source"]].index(v)].sum()) for c, v in cd.items()}
    docs_n = {c: int((where[v["source"]] == mine[v["source"]].index(v)).sum()) for c, v in cd.items()}
    max_ep = data.draw(st.sampled_from([None, 1.0, 2.0, 2.5]))
    target = data.draw(st.integers(1, 3 * sum(avail.values())))
    b = budget.cell_budget(avail, cells.weights(m, cl), target, {c: max_ep for c in cd}, "renormalize")
    with tempfile.TemporaryDirectory() as tmp:
        keys = {}
        for c, v in cd.items():
            e = budget.key_epoch(b[c], avail[c])
            s, pos = v["source"], mine[v["source"]].index(v)
            inside = np.flatnonzero(where[s] == pos)
            keys[c] = []
            if e is not None:
                half = len(inside) // 2  # two "shards"
                for j, part in enumerate((inside[:half], inside[half:])):
                    keys[c].append(f"{tmp}/{v['index']}-{j}.parquet")
                    select.write_keys(keys[c][-1], budget.priority(0, s, [ids[s][i] for i in part], e), tokens[s][part])
        sel = mix.selection({"budget": b, "available": avail, "available_docs": docs_n, "keys": keys, "cells": cd,
                                "shard_tokens": None, "shard_rows": 1000})
    for s in ("web", "wiki"):
        for pos, c in enumerate(sel["sources"][s]["cells"]):
            inside = np.flatnonzero(where[s] == pos)
            copies = np.zeros(len(inside), np.int64)
            for _, mask in budget.cell_epochs(c, 0, s, [ids[s][i] for i in inside]):
                copies += 1 if mask is None else mask.astype(np.int64)
            got = int((copies * tokens[s][inside]).sum())
            want = b[c["name"]]["target"]
            biggest = int(tokens[s][inside].max()) if len(inside) else 0
            assert want <= got < want + max(biggest, 1) or want == 0, (c["name"], want, got)  # met within one document
            assert want > 0 or got == 0, (c["name"], got)  # a cell with no target (weight 0, or empty) takes nothing
            assert got == c["tokens"]  # the selection's own count
            if max_ep is not None and len(inside):
                assert copies.max() <= math.ceil(max_ep)  # no document past its cap
            if c["lo"] is not None:  # every chosen document is of the cell's buckets
                assert all(c["lo"] <= buckets[i] <= c["hi"] for i in inside[copies > 0])


def test_language_by_topic_by_bucket_cells_cover_every_document_once():
    """An axis with topics (`web/lang=fr/code/q3-q4`): the named cells, and per language (and
    `other`) and topic the runs of buckets no key covers, weight 0; every (language, topic,
    bucket) row of a shard falls in exactly one cell (cells.index), and the budget's counts
    per cell (cells.available, from mix-axes' per-(value, bucket, topic) groups) add up to the
    shard's."""
    from filters import base as filter_base

    m = config.Mixture.model_validate({
        "name": "x", "filters": {"lid": filter_base.parse_params({"type": "language", "label_only": True})},
        "sources": {"web": {"paths": ["x"], "filters": ["lid"], "quality": {"classifier": "q", "buckets": 4},
                            "topic": {"classifier": "t"}}},
        "classifiers": {"q": {"model": "m.bin"}, "t": {"labels": {"code": ["c.txt"], "prose": ["p.txt"]}}},
        "mixture": {"weights": {"web/lang=fr/code/q3-q4": 0.4, "web/lang=fr/prose": 0.3, "web/lang=es": 0.2,
                                "web/lang=other/q4": 0.1}}})
    assert not keys.problems(m)
    got = cells.cells(m)
    names = [c.name for c in got]
    assert names == ["web/lang=fr/code/q1-q2", "web/lang=fr/code/q3-q4", "web/lang=fr/prose", "web/lang=es",
                     "web/lang=other/q4", "web/lang=other/code/q1-q3", "web/lang=other/prose/q1-q3"]
    assert [c.named for c in got] == [False, True, True, True, True, False, False]
    langs, topics = ["fr", "es", "en", "de"], ["code", "prose"]
    rows = [(lang, t, b) for lang in langs for t in topics for b in range(1, 5)]
    dicts = [c.to_dict() for c in got]
    idx = cells.index(dicts, np.array([b for _, _, b in rows]), len(rows), np.array([t for _, t, _ in rows], dtype=object),
                      {"lang": np.array([lang for lang, _, _ in rows], dtype=object)})
    for (lang, t, b), i in zip(rows, idx.tolist()):
        c = got[i]
        assert (c.lang == lang if c.lang != "other" else lang not in ("fr", "es")) and c.topic in (None, t) \
            and (c.lo is None or c.lo <= b <= c.hi), (lang, t, b, c.name)
    groups = [[lang, b, 1, 10 * b, t] for lang, t, b in rows]  # mix-axes' rows: value, bucket, docs, tokens, topic
    avail = cells.available(got, {"axis_groups": groups})
    assert sum(d for d, _ in avail.values()) == len(rows) and sum(t for _, t in avail.values()) == sum(10 * b for *_, b in rows)
    assert avail["web/lang=fr/code/q3-q4"] == (2, 70) and avail["web/lang=other/q4"] == (4, 160)


def test_cells_over_two_axes_in_any_order_cover_every_document_once():
    """Two axes combined (a language and a stage's `length`), written in either order, with
    buckets: the named cells, one cell (weight 0) for each other combination of the named
    values and `other` per axis (and each run of buckets no key covers), every (language,
    length, bucket) row in exactly one cell, and the budget's counts (mix-axes' groups, a
    value per axis) adding up. A key that leaves out an axis the others name is refused."""
    from filters import base as filter_base

    def mixture(weights):
        return config.Mixture.model_validate({
            "name": "x", "filters": {"lid": filter_base.parse_params({"type": "language", "label_only": True})},
            "sources": {"web": {"paths": ["x"], "filters": ["lid"], "quality": {"classifier": "q", "buckets": 2}}},
            "classifiers": {"q": {"model": "m.bin"}}, "mixture": {"weights": weights}})
    m = mixture({"web/lang=fr/length=long/q2": 0.4, "web/length=short/lang=en": 0.3, "web/lang=other/length=other": 0.3})
    assert not keys.problems(m, axes={"web": {"length"}})
    got = cells.cells(m)
    assert [c.name for c in got] == [
        "web/lang=fr/length=long/q2", "web/lang=fr/length=long/q1", "web/lang=fr/length=short", "web/lang=fr/length=other",
        "web/lang=en/length=long", "web/length=short/lang=en", "web/lang=en/length=other",
        "web/lang=other/length=long", "web/lang=other/length=short", "web/lang=other/length=other"]
    assert [c.named for c in got] == [True, False, False, False, False, True, False, False, False, True]
    assert got[5].axes == (("lang", "en", ()), ("length", "short", ()))  # the source's axis order, whatever the key's
    assert got[9].axes == (("lang", "other", ("fr", "en")), ("length", "other", ("long", "short")))
    d = got[0].to_dict()
    assert d["axes"] == [["lang", "fr", []], ["length", "long", []]] and "lang" not in d and "axis" not in d
    rows = [(lang, ln, b) for lang in ("fr", "en", "de") for ln in ("long", "short", "mid") for b in (1, 2)]
    idx = cells.index([c.to_dict() for c in got], np.array([b for *_, b in rows]), len(rows), None,
                      {"lang": np.array([r[0] for r in rows], dtype=object), "length": np.array([r[1] for r in rows], dtype=object)})
    for (lang, ln, b), i in zip(rows, idx.tolist()):
        (_, cl, _), (_, cn, _) = got[i].axes
        assert (cl == lang or (cl == "other" and lang == "de")) and (cn == ln or (cn == "other" and ln == "mid")), (lang, ln, got[i].name)
        assert got[i].lo is None or got[i].lo == b
    groups = [[[lang, ln], b, 1, 10 * b] for lang, ln, b in rows]  # mix-axes' rows: [value per axis], bucket, docs, tokens
    acc: dict = {}
    cells.tally(acc, {"kept": len(rows), "tokens": 0, "axis_groups": groups[:7]})
    cells.tally(acc, {"kept": 0, "tokens": 0, "axis_groups": groups[7:]})
    avail = cells.available(got, cells.tallied(acc))
    assert sum(d for d, _ in avail.values()) == len(rows) and avail["web/lang=other/length=other"] == (2, 30)
    assert avail["web/lang=fr/length=long/q2"] == (1, 20) and avail["web/lang=fr/length=long/q1"] == (1, 10)
    wrong = keys.problems(mixture({"web/lang=fr/length=long": 0.5, "web/lang=en": 0.5}), axes={"web": {"length"}})
    assert wrong and "give every weight key of web the same axes (lang=<value>, length=<value>" in wrong[0][1], wrong
    wrong = keys.problems(mixture({"web/lang=fr/size=big": 1.0}), axes={"web": {"length"}})
    assert wrong and "names axis 'size', but no stage declares it for web" in wrong[0][1], wrong
