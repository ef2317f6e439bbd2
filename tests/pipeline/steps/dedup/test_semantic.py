"""Semantic dedup (`dedup.semantic`) on a real Ray, on planted copies built from real text.

The corpus: 300 base documents (three Wikipedia summaries each) in source `a`; in source
`b`, the sentences of 100 of them shuffled (the same words: MinHash's 5-grams across
sentence boundaries change, the embedding hardly does) and 100 others with a tenth of
their words replaced by stopwords; and 60 other base documents. Distinct bases are at
cosine <= 0.81 of each other with WordLlama's embeddings, the copies at >= 0.97.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline import config
from pipeline.io import atomic
from pipeline.run import runner
from tests.conftest import curate, write_yaml


@pytest.fixture(scope="module")
def planted(wiki_texts, tmp_path_factory):
    rng = random.Random(11)
    d = tmp_path_factory.mktemp("semantic")
    texts = [t for t in wiki_texts if len(t.split()) >= 60]
    bases = [" ".join(texts[3 * i : 3 * i + 3]) for i in range(360)]
    a = [{"id": f"a{i:04d}", "text": t} for i, t in enumerate(bases[:300])]
    b, copies = [], {}
    for i in range(200):
        if i < 100:
            sentences = [s for s in bases[i].replace("\n", " ").split(". ") if s]
            rng.shuffle(sentences)
            text = ". ".join(sentences)
        else:
            words = bases[i].split(" ")
            for _ in range(len(words) // 10):
                words[rng.randrange(len(words))] = rng.choice(["the", "of", "and", "a", "in"])
            text = " ".join(words)
        b.append({"id": f"s{i:04d}", "text": text})
        copies[f"s{i:04d}"] = f"a{i:04d}"
    b += [{"id": f"b{i:04d}", "text": t} for i, t in enumerate(bases[300:], 300)]
    for name, recs in (("a", a), ("b", b)):
        rng.shuffle(recs)
        (d / name).mkdir()
        for k in range(3):
            with open(d / name / f"part-{k}.jsonl", "w") as f:
                for r in recs[k::3]:
                    f.write(json.dumps(r) + "\n")
    return {"dir": d, "copies": copies}


def _yaml(path: Path, data: Path, threshold: float = 0.95, extra: str = "", max_shard_bytes: int = 1 << 26) -> Path:
    return write_yaml(path, f"""
        name: sem
        tokenizer: null
        sources:
          a: {{paths: ["{data}/a/*.jsonl"], id_field: id, max_shard_bytes: {max_shard_bytes}}}
          b: {{paths: ["{data}/b/*.jsonl"], id_field: id, max_shard_bytes: {max_shard_bytes}}}
        dedup:
          semantic: {{threshold: {threshold}, clusters: 4, sample: 400}}
        {extra}
    """)


def _decisions(run_dir: Path) -> dict[str, dict]:
    st = atomic.read_json(run_dir / "run.json")["steps"]["dedup-semantic"]
    return {r["id"]: r for f in sorted((run_dir / st["dir"]).glob("*/part-*.parquet"))
            for r in pq.read_table(f).to_pylist() if r["keep"] is not None}


@pytest.fixture(scope="module")
def runs(ray_local, planted, tmp_path_factory):
    d = tmp_path_factory.mktemp("runs")
    runner.run(config.load(_yaml(d / "one.yaml", planted["dir"])), workers=2, output=str(d / "w2"), log=lambda m: None,
               quiet=True)
    runner.run(config.load(_yaml(d / "two.yaml", planted["dir"], extra="  partitions: 3", max_shard_bytes=20_000)),
               workers=1, output=str(d / "w1"), log=lambda m: None, quiet=True)
    return d, d / "w2" / "sem", d / "w1" / "sem"


def test_planted_copies_are_removed_for_their_base_and_nothing_else(planted, runs):
    _, run, _ = runs
    dec = _decisions(run)
    removed = {i: r for i, r in dec.items() if r["keep"] is False}
    wrong = {i: r["duplicate_of"] for i, r in removed.items() if planted["copies"].get(i) != r["duplicate_of"]}
    shuffled = sum(1 for i in removed if int(i[1:]) < 100)
    print(f"\nremoved {len(removed)}: {shuffled}/100 sentence-shuffled and {len(removed) - shuffled}/100 edited copies; "
          f"{len(wrong)} not a planted pair")
    assert not wrong  # precision: every removal is a planted copy, pointing at its own base in `a`
    assert shuffled == 100 and len(removed) >= 195  # recall, with 4 clusters cutting a few pairs apart at most
    r = removed["s0000"]
    assert r["reason"].startswith("semantic_duplicate_of:a0000 (cosine=") and r["cosine"] >= 0.99
    assert r["duplicate_of_source"] == "a" and 0 <= r["cluster"] < 4 and r["cluster_size"] >= 2
    led = atomic.read_json(run / "ledger.json")
    assert led["conservation"] is True
    assert led["sources"]["b"]["removed"]["dedup:semantic"] == {"semantic_duplicate": len(removed)}
    assert "dedup:semantic" not in led["sources"]["a"]["removed"]  # the first source's documents survive


def test_same_decisions_for_any_workers_shards_and_partitions(runs):
    _, one, two = runs
    steps = atomic.read_json(two / "run.json")["steps"]
    assert steps["ingest-a"]["shards"] > 3 and steps["dedup-semantic-reduce"]["shards"] == 3  # really other shards
    a = {i: (r["keep"], r["reason"], r["cluster"]) for i, r in _decisions(one).items()}
    b = {i: (r["keep"], r["reason"], r["cluster"]) for i, r in _decisions(two).items()}
    assert a == b
    ma = pq.read_table(sorted((one / "mixture").glob("*.parquet"))).column("id").to_pylist()
    mb = pq.read_table(sorted((two / "mixture").glob("*.parquet"))).column("id").to_pylist()
    assert sorted(ma) == sorted(mb)


def test_a_threshold_edit_embeds_nothing_again_and_explain_shows_the_cluster(planted, runs, joined):
    d, run, _ = runs
    y = _yaml(d / "one.yaml", planted["dir"], threshold=0.99)
    r = curate("run", str(y), "--workers", "2", "--output", str(d / "w2"), env=joined)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = atomic.read_json(run / "run.json")["steps"]
    for name in ("embed-a", "embed-b", "dedup-semantic-sample", "dedup-semantic-centroids", "dedup-semantic-map"):
        assert steps[name]["status"] == "SKIPPED", name
    assert steps["dedup-semantic-reduce"]["status"] == "SUCCESS"
    dec = _decisions(run)
    assert all(r["cosine"] >= 0.99 for r in dec.values() if r["keep"] is False)
    assert dec["s0000"]["keep"] is False and dec["s0150"]["keep"] is True  # an edited copy is below 0.99
    e = curate("explain", str(run), "--id", "s0001")
    assert e.returncode == 0, e.stderr
    assert "dedup:semantic               removed semantic_duplicate_of:a0001 (cosine=" in e.stdout
    assert "closest earlier member a0001 (cosine " in e.stdout and "removed as its duplicates: s0001 (" in e.stdout


def test_min_overlap_keeps_close_vectors_whose_words_differ():
    """Two unrelated French pages can sit at a cosine above the threshold with static
    embeddings; their word sketches tell them apart. A reordered copy shares every word."""
    from pipeline.steps.dedup.semantic import duplicates, sketches

    a = "La ville est située au bord du fleuve et compte de nombreux monuments historiques du Moyen Âge."
    b = "Le joueur a commencé sa carrière dans un petit club avant de rejoindre la sélection nationale en 1998."
    c = "Du Moyen Âge, la ville compte de nombreux monuments historiques et est située au bord du fleuve."
    v = np.ones((3, 4), np.float32) / 2  # the same vector: cosine 1 between all three
    sk = sketches([a, b, c])
    gone, best, _ = duplicates(v, 0.93)
    assert gone.tolist() == [False, True, True]  # the cosine alone removes b and c
    gone, best, _ = duplicates(v, 0.93, sk, 0.5)
    assert gone.tolist() == [False, False, True] and best[2] == 0  # b shares too few words; c is a's copy
    assert (sk[0] == sk[2]).mean() > 0.9 and (sk[0] == sk[1]).mean() < 0.3


def test_the_overlap_gate_names_the_closest_earlier_member_that_passes_it():
    """`duplicates` with `min_overlap` stops at the first candidate that passes the word gate,
    by cosine: its decisions, named members and cosines equal a direct search over every
    earlier member (the highest cosine among those at or above the threshold whose sketches
    share enough; the earliest on a tie), on clusters dense enough that many candidates fail."""
    from pipeline.steps.dedup.semantic import duplicates

    rng = np.random.default_rng(7)
    m, t, ov = 700, 0.9, 0.56
    base = rng.normal(size=(60, 24)).astype(np.float32)
    v = base[rng.integers(0, 60, m)] + rng.normal(scale=0.2, size=(m, 24)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    sk = rng.integers(0, 2, size=(m, 128)).astype(np.uint32)  # word overlaps around 0.4-0.6: the gate decides
    gone, best, cos = duplicates(v, t, sk, ov)
    s = v @ v.T
    for i in range(1, m):
        ok = [j for j in range(i) if s[i, j] >= t and (sk[j] == sk[i]).mean() >= ov]
        if ok:
            j = max(ok, key=lambda j: (s[i, j], -j))
            assert gone[i] and best[i] == j and abs(cos[i] - s[i, j]) < 1e-6, i
        else:
            assert not gone[i], i
    assert 50 < gone.sum() < m - 50  # both outcomes are exercised


def test_semantic_duplicates_in_the_samples_are_one_reason_group(runs):
    """Issue 51, item 4: `semantic_duplicate_of:<survivor> (cosine=...)` is grouped by its kind,
    as `duplicate_of` is: the samples hold at most `removed_per_reason` of ~200 semantic duplicates,
    not one group per survivor."""
    _, run, _ = runs
    rows = [json.loads(x) for x in (run / "samples" / "b" / "removed.jsonl").read_text().splitlines()]
    sem = [r for r in rows if r["reason"].startswith("semantic_duplicate_of:")]
    assert 0 < len(sem) <= 10, len(sem)


def test_a_large_cluster_is_split_and_its_cost_per_member_is_bounded():
    """semantic.split_cluster: a cluster of 3,000 members (200 of them near-copies of earlier
    ones, cosine >= 0.95) cut into groups of at most 400: every group in priority order, every
    member in one group; the comparison inside the groups finds at least 95% of the copies the
    whole cluster's all-pairs finds, and nothing the whole comparison would not remove."""
    from pipeline.steps.dedup import semantic

    rng = np.random.default_rng(7)
    base = rng.normal(size=(2800, 64)).astype(np.float32)
    noise = rng.normal(size=(200, 64)).astype(np.float32) * 0.02
    v = np.vstack([base, base[rng.integers(0, 2800, 200)] + noise])
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    groups = semantic.split_cluster(v, 400)
    assert all(len(g) <= 400 for g in groups) and len(groups) >= 3000 // 400
    assert sorted(np.concatenate(groups).tolist()) == list(range(3000))
    assert all((np.diff(g) > 0).all() for g in groups)  # each in priority order
    whole, _, _ = semantic.duplicates(v, 0.92)
    split = np.zeros(3000, bool)
    for g in groups:
        gone, _, _ = semantic.duplicates(v[g], 0.92)
        split[g[gone]] = True
    assert whole.sum() >= 195 and split.sum() >= 0.95 * whole.sum()
    assert not (split & ~whole).any()  # a group finds a subset of what the whole cluster finds
    assert semantic.split_cluster(v, None)[0].tolist() == list(range(3000))  # null: one group, all pairs


def test_the_reduce_task_splits_a_cluster_past_max_cluster_rows(tmp_path):
    """semantic.reduce_shard on one cluster of 600 members (30 near-copies): with
    max_cluster_rows 100 it compares groups (its marker counts them) and removes a subset of
    what the whole cluster's comparison removes, most of it; null compares the whole cluster."""
    import pyarrow as pa

    from pipeline.engine.task import run_shard
    from pipeline.shards import shuffle

    rng = np.random.default_rng(3)
    base = rng.normal(size=(570, 16)).astype(np.float32)
    v = np.vstack([base, base[rng.integers(0, 570, 30)] + rng.normal(size=(30, 16)).astype(np.float32) * 0.01])
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    n = len(v)
    emb = pa.FixedSizeListArray.from_arrays(pa.array(v.astype(np.float16).ravel()), 16)
    t = pa.table({"cluster": np.zeros(n, np.int64), "okey": np.arange(n, dtype=np.uint64), "okey2": np.zeros(n, np.uint64),
                  "gid": shuffle.gid(0, 0, np.arange(n)), "id": [f"d{i}" for i in range(n)], "embedding": emb})
    shuffle.write_partitions(t, np.zeros(n, np.int64), 1, shuffle.map_file(tmp_path / "maps", 0))
    removed = {}
    for most in (None, 100):
        spec = {"inputs": str(tmp_path / "maps"), "maps": 1, "partition": 0, "offsets": [0], "ndocs": 1, "sources": ["s"],
                "params": {"threshold": 0.92, "min_overlap": None, "max_cluster_rows": most}}
        st = run_shard("pipeline.steps.dedup.semantic:reduce_shard", spec, str(tmp_path / f"out-{most}"), 0)
        assert st["clusters"] == 1 and (st["groups"] == 1 if most is None else st["groups"] >= 6), (most, st)
        removed[most] = set(pq.read_table(tmp_path / f"out-{most}" / "clusters" / "part-00000.parquet").column("id").to_pylist())
    assert len(removed[None]) >= 28 and removed[100] <= removed[None] and len(removed[100]) >= 0.8 * len(removed[None])


def test_order_place_keeps_the_first_copy_by_place_not_by_id_hash(tmp_path):
    """semantic.reduce_shard on two copies whose id hashes (okey) order them against their
    places: by id the later row survives, with `order: place` (dedup.order) the first."""
    import pyarrow as pa

    from pipeline.engine.task import run_shard
    from pipeline.shards import shuffle

    v = np.ones((2, 16), np.float32) / 4.0
    emb = pa.FixedSizeListArray.from_arrays(pa.array(v.astype(np.float16).ravel()), 16)
    t = pa.table({"cluster": np.zeros(2, np.int64), "okey": np.array([9, 1], np.uint64), "okey2": np.zeros(2, np.uint64),
                  "gid": shuffle.gid(0, 0, np.arange(2)), "id": ["first", "second"], "embedding": emb})
    shuffle.write_partitions(t, np.zeros(2, np.int64), 1, shuffle.map_file(tmp_path / "maps", 0))
    got = {}
    for order in ("id", "place"):
        spec = {"inputs": str(tmp_path / "maps"), "maps": 1, "partition": 0, "offsets": [0], "ndocs": 1, "sources": ["s"],
                "params": {"threshold": 0.92, "min_overlap": None, "max_cluster_rows": None},
                **({"order": order} if order == "place" else {})}
        run_shard("pipeline.steps.dedup.semantic:reduce_shard", spec, str(tmp_path / order), 0)
        got[order] = pq.read_table(tmp_path / order / "clusters" / "part-00000.parquet").select(["id", "duplicate_of"]).to_pylist()
    assert got == {"id": [{"id": "first", "duplicate_of": "second"}], "place": [{"id": "second", "duplicate_of": "first"}]}


def test_past_what_the_sample_fits_k_grows_in_two_levels(ray_local, planted, tmp_path):
    """With `cluster_rows: 20` the corpus wants 28 clusters where its sample of 400 fits 20:
    each coarse cluster is split by a k-means of its own sample (dedup-semantic-fine), the
    reducers see more clusters than the sample's k, the planted copies are still found for
    their base and nothing else, and another sharding gives the same decisions."""
    got = []
    for name, shard_bytes in (("two", 1 << 26), ("twoshards", 20_000)):
        y = write_yaml(tmp_path / f"{name}.yaml", _yaml(tmp_path / "x.yaml", planted["dir"], max_shard_bytes=shard_bytes)
                       .read_text().replace("clusters: 4, sample: 400", "sample: 400, cluster_rows: 20").replace("name: sem", f"name: {name}"))
        runner.run(config.load(y), workers=2, output=str(tmp_path), log=lambda m: None, quiet=True)
        run = tmp_path / name
        steps = atomic.read_json(run / "run.json")["steps"]
        coarse = [atomic.read_json(p) for p in (run / steps["dedup-semantic-centroids"]["dir"] / "_markers").glob("*.json")][0]
        fine = [atomic.read_json(p) for p in (run / steps["dedup-semantic-fine"]["dir"] / "_markers").glob("*.json")]
        reduce = [atomic.read_json(p) for p in (run / steps["dedup-semantic-reduce"]["dir"] / "_markers").glob("*.json")]
        assert coarse["clusters"] == 20 and sum(m["fine"] for m in fine) > 0, (coarse, fine)
        assert sum(m["clusters"] for m in reduce) > coarse["clusters"], reduce
        dec = _decisions(run)
        removed = {i: r for i, r in dec.items() if r["keep"] is False}
        assert all(planted["copies"].get(i) == r["duplicate_of"] for i, r in removed.items())
        assert len(removed) >= 180, len(removed)  # finer clusters cut a few more pairs apart than 4 did
        got.append({i: (r["keep"], r["reason"], r["cluster"]) for i, r in dec.items()})
    assert got[0] == got[1]
