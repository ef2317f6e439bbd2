"""The shipped demo mixture: the crawl's planted exact and near copies are removed by dedup."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from pipeline.io import atomic
from tests.pipeline.steps.dedup.test_dedup_run import decisions


def test_demo_ledger_shows_dedup_and_planted_copies_are_removed(demo_run):
    run = demo_run
    led = atomic.read_json(run / "ledger.json")
    assert led["conservation"] is True
    web = led["sources"]["web"]["removed"]
    assert web["dedup:exact"]["exact_duplicate"] > 50 and web["dedup:fuzzy"]["near_duplicate"] > 50, web
    stages = [s["stage"] for s in led["sources"]["web"]["stages"]]
    assert stages[-7:] == ["dedup:exact", "dedup:fuzzy", "dedup:paragraph", "decontaminate", "validation", "quality:wiki_vs_web", "mix"]

    steps = atomic.read_json(run / "run.json")["steps"]
    kind, text, place = {}, {}, {}
    for f in sorted((run / steps["ingest-web"]["dir"]).glob("part-*.parquet")):
        t = pq.read_table(f, columns=["id", "text", "metadata"])
        for i, x, m in zip(t.column("id").to_pylist(), t.column("text").to_pylist(), t.column("metadata").to_pylist()):
            kind[i] = json.loads(m)["kind"]
            text[i] = x
            place[i] = len(place)  # ingest shards in file order, then rows
    dec = decisions(run)
    ex, fz = dec["exact"], dec["fuzzy"]
    # every group of identical pages that reached dedup keeps exactly one: the first by place (demo.yaml's
    # dedup.order), the copy in the first file. Their ids are content hashes, so that is not the smallest id
    groups: dict[str, list[str]] = {}
    for i in ex:
        if i in text:
            groups.setdefault(text[i].lower(), []).append(i)
    copies = [g for g in groups.values() if len(g) > 1]
    assert len(copies) > 50
    for g in copies:
        first = min(g, key=place.get)
        keep = [i for i in g if ex[i]["keep"]]
        assert keep == [first], g
        assert all(ex[i]["reason"] == f"exact_duplicate_of:{first}" for i in g if i != first)
    assert sum(min(g, key=place.get) != min(g) for g in copies) > 10  # the ids' order would have kept others
    # the planted near copies that reached fuzzy dedup are in clusters: removed, or the survivor of one
    survivors = {r["duplicate_of"] for r in fz.values() if r["keep"] is False}
    near = [i for i in fz if kind.get(i) == "near_copy"]
    found = [i for i in near if fz[i]["keep"] is False or i in survivors]
    print(f"\ndemo: {len(copies)} groups of exact copies, {len(found)}/{len(near)} planted near copies in clusters")
    assert len(near) > 50 and len(found) >= 0.9 * len(near)
