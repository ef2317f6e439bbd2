"""Heavy LSH buckets cut into blocks (pipeline/steps/dedup/salt.py), on a real Ray.

The corpus: 160 copies of one templated page (a word of each upper-cased) among 300
distinct Wikipedia pages and 40 planted pairs. With CURATE_FUZZY_SALT_ROWS=40 (half the
documents sampled, by id hash: the estimate is twice a bucket's sampled members), the
template's buckets are cut into blocks of about 40 rows (without the anchor pairs the
copies would fall apart into a cluster a block); the runs compare against the same
mixture without the cut, and against other shards, workers, partitions, merge groups and
sample tasks with it.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline import config
from pipeline.io import atomic
from pipeline.run import runner
from pipeline.steps.dedup import salt
from tests.conftest import write_yaml

COPIES = 160


@pytest.fixture(scope="module")
def corpus(wiki_texts, tmp_path_factory):
    rng = random.Random(11)
    d = tmp_path_factory.mktemp("skewed")
    texts = [t for t in wiki_texts if len(t.split()) >= 60]
    template = " ".join(texts[:4]).split(" ")
    recs = []
    for i in range(COPIES):
        words = list(template)
        k = rng.randrange(len(words))
        words[k] = words[k].upper()  # the same shingles once folded: every band's bucket holds every copy
        recs.append({"id": f"t{i:04d}", "text": " ".join(words)})
    for i in range(300):
        recs.append({"id": f"w{i:04d}", "text": " ".join(texts[10 + 2 * i : 12 + 2 * i])})
    for i in range(40):  # a planted pair each: the base among the pages above, a copy with one word changed
        words = recs[COPIES + i]["text"].split(" ")
        words[rng.randrange(len(words))] = f"zz{i}"
        recs.append({"id": f"c{i:04d}", "text": " ".join(words)})
    rng.shuffle(recs)
    with open(d / "docs.jsonl", "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    return d


def _run(d: Path, corpus: Path, name: str, workers: int, env: dict, shard_bytes: int = 1 << 26, extra: str = "") -> Path:
    y = write_yaml(d / f"{name}.yaml", f"""
        name: {name}
        tokenizer: null
        sources:
          web: {{paths: ["{corpus}/docs.jsonl"], id_field: id, max_shard_bytes: {shard_bytes}}}
        dedup:
          fuzzy: {{}}
        {extra}
    """)
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        runner.run(config.load(y), workers=workers, output=str(d), log=lambda m: None, quiet=True)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    return d / name


def _steps(run: Path) -> dict:
    return atomic.read_json(run / "run.json")["steps"]


def _markers(run: Path, step: str) -> list[dict]:
    return [atomic.read_json(f) for f in sorted((run / _steps(run)[step]["dir"] / "_markers").glob("part-*.json"))]


def _heavy(run: Path) -> Path:
    return run / _steps(run)["dedup-fuzzy-heavy"]["dir"] / "heavy.parquet"


def _fuzzy(run: Path) -> dict[str, tuple]:
    rows = {}
    for f in sorted((run / _steps(run)["dedup-fuzzy"]["dir"]).glob("*/part-*.parquet")):
        for r in pq.read_table(f).to_pylist():
            if r["keep"] is not None:
                rows[r["id"]] = (r["keep"], r["reason"], r["duplicate_of"], r["jaccard"], r["cluster"], r["cluster_size"])
    return rows


@pytest.fixture(scope="module")
def runs(ray_local, corpus, tmp_path_factory):
    d = tmp_path_factory.mktemp("salt")
    plain = _run(d, corpus, "plain", 2, {})
    cut = _run(d, corpus, "cut", 2, {"CURATE_FUZZY_SALT_ROWS": "40"})
    group, salt.GROUP = salt.GROUP, 2  # the sample's document shards two a task (planned here, in the driver)
    try:
        other = _run(d, corpus, "other", 1, {"CURATE_FUZZY_SALT_ROWS": "40", "CURATE_SHUFFLE_GROUP": "2"},
                     shard_bytes=40_000, extra="  partitions: 3")
    finally:
        salt.GROUP = group
    return plain, cut, other


def test_a_heavy_bucket_is_cut_into_blocks_and_no_reducer_holds_it(runs):
    plain, cut, _ = runs
    assert _steps(plain)["dedup-fuzzy-sample"]["shards"] == 0  # under salt_rows documents: nothing sampled
    assert _steps(plain)["dedup-fuzzy-heavy"]["shards"] == 0
    heavy = _markers(cut, "dedup-fuzzy-heavy")[0]
    table = pq.read_table(_heavy(cut)).to_pylist()
    assert heavy["heavy"] == len(table) >= 1 and heavy["virtual"] == sum(r["blocks"] for r in table)
    sampled = _markers(cut, "dedup-fuzzy-sample")
    assert 0 < sum(m["sampled"] for m in sampled) < 0.7 * sum(m["docs"] for m in sampled)  # a sample, not all
    for r in table:  # the estimate: twice the sampled members
        assert r["blocks"] == -(-r["estimate"] // 40) and r["estimate"] > 40
    largest = {name: max(m["largest"] for m in _markers(run, "dedup-fuzzy-buckets")) for name, run in (("plain", plain), ("cut", cut))}
    print(f"\nlargest bucket a reducer held: {largest['plain']} without the cut, {largest['cut']} with it; "
          f"{heavy['heavy']} heavy buckets in {heavy['virtual']} blocks")
    assert largest["plain"] >= COPIES * 0.8
    assert largest["cut"] <= COPIES // 2  # blocks of about 40 members: hash ranges of estimated sizes
    parts = {m["partitions"] for m in _markers(cut, "dedup-fuzzy-signatures")}
    assert parts == {_markers(plain, "dedup-fuzzy-signatures")[0]["partitions"] + heavy["virtual"]}


def test_the_cut_keeps_the_decisions(runs):
    """Every template copy but one removed, with the same survivor and cluster, as without
    the cut; the planted pairs found both ways."""
    plain, cut, _ = runs
    a, b = _fuzzy(plain), _fuzzy(cut)
    removed = {i for i, r in b.items() if r[0] is False}
    assert removed == {i for i, r in a.items() if r[0] is False}
    survivor = [i for i in b if i.startswith("t") and b[i][0] is True]
    assert len(survivor) == 1 and len({r[2] for i, r in b.items() if i.startswith("t") and r[0] is False}) == 1
    assert {i for i in removed if i.startswith("t")} == {f"t{i:04d}" for i in range(COPIES)} - set(survivor)
    for i in removed:  # one cluster of every copy; the Jaccard, that of the closest verified neighbour, may differ
        assert b[i][2] == a[i][2] and b[i][4] == a[i][4] and b[i][5] == a[i][5]
        assert b[i][5] == COPIES if i.startswith("t") else b[i][5] == 2
    assert len({i for i in removed if not i.startswith("t")}) == 40  # each planted pair: one of the two


def test_the_cut_is_the_same_for_any_shards_workers_partitions_and_merge_groups(runs):
    _, cut, other = runs
    steps = _steps(other)
    assert steps["ingest-web"]["shards"] > _steps(cut)["ingest-web"]["shards"] > 0
    assert steps["dedup-fuzzy-signatures-merge"]["shards"] > 0  # the merge tier joined the signatures' files
    assert steps["dedup-fuzzy-sample"]["shards"] > 1 == _steps(cut)["dedup-fuzzy-sample"]["shards"]
    assert _fuzzy(cut) == _fuzzy(other)  # every decision, survivor, Jaccard and cluster
    a, b = (pq.read_table(_heavy(r)) for r in (cut, other))
    assert a.drop_columns(["anchor"]).equals(b.drop_columns(["anchor"]))  # anchors are gids: shard positions


def test_a_sample_with_no_heavy_bucket_cuts_nothing(tmp_path):
    """Sampled, but no bucket past salt_rows: an empty table, no virtual partition (the
    common case between 2 million and a few hundred million documents)."""
    import numpy as np
    import pyarrow as pa

    class Out:
        dir = str(tmp_path / "heavy")

    (tmp_path / "s").mkdir()
    pq.write_table(pa.table({"bucket": np.array([5, 5, 9], np.uint64), "okey": np.array([1, 2, 3], np.uint64),
                             "okey2": np.array([1, 2, 3], np.uint64), "gid": np.array([10, 11, 12])}),
                   tmp_path / "s" / "part-00000.parquet")
    spec = {"samples": str(tmp_path / "s"), "files": 1, "rate": 1.0, "salt_rows": 20}
    m = salt.heavy_shard(spec, Out())
    assert m["heavy"] == 0 and m["virtual"] == 0 and m["rows"] == 3
    assert pq.read_table(tmp_path / "heavy" / "heavy.parquet").num_rows == 0
    spec["salt_rows"] = 1  # bucket 5's two samples: 2 blocks, its anchor its first member in the bucket order
    m = salt.heavy_shard(spec, Out())
    t = pq.read_table(tmp_path / "heavy" / "heavy.parquet").to_pylist()
    assert m["heavy"] == 1 and m["virtual"] == 2
    assert [(r["bucket"], r["blocks"], r["first"], r["anchor"]) for r in t] == [(5, 2, 0, 10)]
