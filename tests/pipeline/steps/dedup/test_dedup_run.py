"""Dedup on a real Ray (runs in process on the session's Ray, `explain` through the CLI)
on planted duplicates built from real text.

The corpus: 300 base documents (three Wikipedia summaries each) in source `a`; edited
copies of 260 of them with known word-5-gram Jaccard between about 0.5 and 1.0, split
between `a` and `b`; 30 exact copies; documents that share one boilerplate paragraph.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline import config
from pipeline.run import runner
from pipeline.io import atomic
from pipeline.shards import shuffle
from tests.conftest import curate, mixture_shas, write_yaml
from tests.pipeline.steps.dedup.test_text import _naive_words

BOILER = "Subscribe to our newsletter for weekly updates on science, culture and the arts."


def _shingles(t: str) -> set:
    w = _naive_words(t)  # the default fuzzy folding, written plainly
    return {tuple(w[i : i + 5]) for i in range(max(1, len(w) - 4))}


def _jaccard(x: str, y: str) -> float:
    a, b = _shingles(x), _shingles(y)
    return len(a & b) / len(a | b)


@pytest.fixture(scope="module")
def planted(wiki_texts, tmp_path_factory):
    rng = random.Random(7)
    d = tmp_path_factory.mktemp("planted")
    texts = [t for t in wiki_texts if len(t.split()) >= 60]
    bases = [" ".join(texts[3 * i : 3 * i + 3]) for i in range(300)]
    a = [{"id": f"a{i:04d}", "text": t} for i, t in enumerate(bases)]
    b = []
    pairs = []  # (base id, copy id, jaccard)
    for i in range(260):
        words = bases[i].split(" ")
        target = rng.uniform(0.45, 1.0)  # k isolated edits change about 5k of the ~len(words) shingles
        for _ in range(max(1, round(len(words) * (1 - target) / (5 * (1 + target))))):
            words[rng.randrange(len(words))] = f"zq{rng.randint(0, 10**6)}"
        copy = " ".join(words)
        rec = {"id": f"c{i:04d}", "text": copy}
        (a if i % 2 else b).append(rec)
        pairs.append((f"a{i:04d}", rec["id"], _jaccard(bases[i], copy)))
    exact = []
    for i in range(260, 290):
        rec = {"id": f"x{i:04d}", "text": bases[i].upper() if i % 3 == 0 else bases[i]}  # case folds by default
        b.append(rec)
        exact.append((f"a{i:04d}", rec["id"]))
    para = []
    for i in range(8):
        t = texts[900 + i] + "\n\n" + BOILER
        a.append({"id": f"p{i:04d}", "text": t})
        para.append(f"p{i:04d}")
    a.append({"id": "p_only", "text": BOILER})
    for name, recs in (("a", a), ("b", b)):
        rng.shuffle(recs)
        (d / name).mkdir()
        for k in range(3):
            with open(d / name / f"part-{k}.jsonl", "w") as f:
                for r in recs[k::3]:
                    f.write(json.dumps(r) + "\n")
    return {"dir": d, "pairs": pairs, "exact": exact, "para": para}


def _yaml(path: Path, data: Path, extra: str = "", max_shard_bytes: int = 1 << 26) -> Path:
    return write_yaml(path, f"""
        name: planted
        tokenizer: null
        sources:
          a: {{paths: ["{data}/a/*.jsonl"], id_field: id, max_shard_bytes: {max_shard_bytes}}}
          b: {{paths: ["{data}/b/*.jsonl"], id_field: id, max_shard_bytes: {max_shard_bytes}}}
        dedup:
          exact: {{}}
          fuzzy: {{}}
          paragraph: {{min_chars: 50, max_occurrences: 5}}
        {extra}
    """)


def decisions(run_dir: Path) -> dict[str, dict[str, dict]]:
    """stage -> id -> attribute row, for every row a dedup stage saw."""
    steps = atomic.read_json(run_dir / "run.json")["steps"]
    out = {}
    for kind in ("exact", "fuzzy", "paragraph"):
        st = steps[f"dedup-{kind}"]
        rows = {}
        for f in sorted((run_dir / st["dir"]).glob("*/part-*.parquet")):
            for r in pq.read_table(f).to_pylist():
                if r["keep"] is not None:
                    rows[r["id"]] = r
        out[kind] = rows
    return out


def _run(y: Path, workers: int, out: Path) -> None:
    """A run in this process on the session's Ray (the CLI path is tested elsewhere)."""
    runner.run(config.load(y), workers=workers, output=str(out), log=lambda m: None, quiet=True)


@pytest.fixture(scope="module")
def runs(ray_local, planted, tmp_path_factory):
    d = tmp_path_factory.mktemp("runs")
    _run(_yaml(d / "one.yaml", planted["dir"]), 2, d / "w2")
    # other shard counts, one worker, three shuffle partitions, and the merge tier joining
    # every two shuffle files (pipeline/steps/merge.py; by default it joins 32), every group of a
    # shuffle with partitions split by partition ranges past 1,000 bytes (small segments of keys are written raw:
    # shuffle.RAW_ROWS, so a pair of exact maps here holds ~1,250 bytes)
    os.environ.update({"CURATE_SHUFFLE_GROUP": "2", "CURATE_MERGE_BYTES": "1000"})
    try:
        _run(_yaml(d / "two.yaml", planted["dir"], "  partitions: 3", max_shard_bytes=20_000), 1, d / "w1")
    finally:
        del os.environ["CURATE_SHUFFLE_GROUP"], os.environ["CURATE_MERGE_BYTES"]
    return d / "w2" / "planted", d / "w1" / "planted"


def test_the_merge_tier_reads_fewer_files_and_changes_no_byte(planted, runs, tmp_path):
    """The run with shuffle files merged in pairs against the same mixture without the tier:
    every dedup decision file and every mixture file the same bytes; the readers read
    ceil(writers / 2) files each, and fuzzy verify's only those of its partition range."""
    merged = runs[1]
    os.environ["CURATE_SHUFFLE_GROUP"] = "100000"  # no merge: every reader reads every writer's file
    try:
        _run(_yaml(tmp_path / "two.yaml", planted["dir"], "  partitions: 3", max_shard_bytes=20_000), 2, tmp_path / "plain")
    finally:
        del os.environ["CURATE_SHUFFLE_GROUP"]
    plain = tmp_path / "plain" / "planted"
    steps = atomic.read_json(merged / "run.json")["steps"]
    tier = {k: v["shards"] for k, v in steps.items() if k.startswith("dedup-") and k.endswith("-merge")}
    assert len(tier) == 8 and all(n > 0 for n in tier.values()), tier  # every shuffle of the three kinds
    ingest_tier = {k: v["shards"] for k, v in steps.items() if k.startswith("merge-")}
    assert len(ingest_tier) == 4 and all(n > 0 for n in ingest_tier.values()), ingest_tier  # ids and id index, per source
    verify = atomic.read_json(merged / steps["dedup-fuzzy-verify"]["dir"] / "step.json")["shards"]
    groups, ranges, parts = verify[0]["maps"]  # merged file r x groups + j: range r of group j's files
    assert groups == -(-steps["dedup-fuzzy-fetch"]["shards"] // 2) and ranges > 1 and parts == len(verify) == 3
    assert steps["dedup-fuzzy-fetch-merge"]["shards"] == groups * ranges
    assert {tuple(shuffle.files_of(v["maps"], v["partition"])) for v in verify} == \
        {tuple(range(r * groups, (r + 1) * groups)) for r in range(ranges)}  # each reader: its range's files only
    split = set()
    for reader, writer, key in (("dedup-exact-reduce", "dedup-exact-map", "maps"),
                                ("dedup-exact", "dedup-exact-reduce", "reducers"),
                                ("dedup-fuzzy-buckets", "dedup-fuzzy-signatures", "maps"),
                                ("unique-ids-a", "ids-a", "files"), ("id-index-b", "ingest-b", "files")):
        spec = atomic.read_json(merged / steps[reader]["dir"] / "step.json")["shards"][0]
        files = spec[key]  # [groups, ranges, partitions] where the merge split the groups by bytes
        g = files[0] if isinstance(files, list) else files
        assert g == -(-steps[writer]["shards"] // 2), (reader, spec[key], steps[writer]["shards"])
        if isinstance(files, list) and files[1] > 1:
            split.add(writer)
    # every shuffle's writers report their bytes (engine/task.py), so merges other than the
    # text-carrying ones split too: the signatures' (650 GB in one task at 2.5 x 10^10 otherwise)
    assert "dedup-fuzzy-signatures" in split and "dedup-exact-map" in split, split
    plain_steps = atomic.read_json(plain / "run.json")["steps"]
    assert not [k for k, v in plain_steps.items() if k.endswith("-merge") and v["shards"]]
    for kind in ("exact", "fuzzy", "paragraph"):
        a = sorted((merged / steps[f"dedup-{kind}"]["dir"]).glob("*/part-*.parquet"))
        b = sorted((plain / plain_steps[f"dedup-{kind}"]["dir"]).glob("*/part-*.parquet"))
        assert a and [f.read_bytes() for f in a] == [f.read_bytes() for f in b], kind
    for step, pattern in (("unique-ids-a", "to/part-*.data"), ("id-index-a", "part-*.parquet"), ("id-index-b", "part-*.parquet")):
        a = sorted((merged / steps[step]["dir"]).glob(pattern))
        b = sorted((plain / plain_steps[step]["dir"]).glob(pattern))
        assert a and [f.read_bytes() for f in a] == [f.read_bytes() for f in b], step
    assert mixture_shas(merged) == mixture_shas(plain)


def test_planted_near_duplicates_recall_and_precision(planted, runs):
    fz = decisions(runs[0])["fuzzy"]
    high = [p for p in planted["pairs"] if p[2] >= 0.85]
    low = [p for p in planted["pairs"] if p[2] < 0.7]
    assert len(high) >= 60 and len(low) >= 40, (len(high), len(low))

    def found(base, copy):
        return (fz[copy]["keep"] is False and fz[copy]["duplicate_of"] == base) or (
            fz[base]["keep"] is False and fz[base]["duplicate_of"] == copy)

    recall = sum(found(b, c) for b, c, _ in high) / len(high)
    wrong = [(b, c, j) for b, c, j in low if fz[b]["keep"] is False or fz[c]["keep"] is False]
    mid = [p for p in planted["pairs"] if 0.7 <= p[2] < 0.85]
    print(f"\nplanted pairs: {len(high)} with Jaccard >= 0.85, recall {recall:.3f}; "
          f"{len(low)} below 0.7, {len(wrong)} removed (precision {1 - len(wrong) / len(low):.3f}); "
          f"{sum(found(b, c) for b, c, _ in mid)}/{len(mid)} found between 0.7 and 0.85")
    assert recall >= 0.95
    assert not wrong
    # every removal names its survivor and the verified Jaccard with it (pairs: the survivor is the neighbour)
    for b, c, j in high:
        if fz[c]["keep"] is False:
            assert fz[c]["reason"] == f"near_duplicate_of:{b} (jaccard={j:.2f})"
            assert fz[c]["jaccard"] == pytest.approx(j) and fz[c]["cluster"] == f"a:{b}" and fz[c]["cluster_size"] == 2


def test_exact_copies_removed_with_their_survivor_in_the_first_source(planted, runs):
    ex = decisions(runs[0])["exact"]
    for base, copy in planted["exact"]:
        assert ex[base]["keep"] is True
        assert ex[copy]["keep"] is False and ex[copy]["reason"] == f"exact_duplicate_of:{base}"
        assert ex[copy]["duplicate_of_source"] == "a"
    assert sum(r["keep"] is False for r in ex.values()) == len(planted["exact"])


def test_paragraph_cut_after_max_occurrences_in_id_order(planted, runs):
    pg = decisions(runs[0])["paragraph"]
    holders = sorted(planted["para"] + ["p_only"])  # rank is equal (source a): id order decides
    first = holders[:5]
    for i in holders:
        r = pg[i]
        if i in first:
            assert r["keep"] is True and r["text"] is None and r["cut_spans"] is None
        elif i == "p_only":
            assert r["keep"] is False and r["reason"] == "paragraph_dedup:empty"
        else:
            assert r["keep"] is True and BOILER not in r["text"] and r["cut_chars"] == len(BOILER) + 2
            assert r["cut_spans"][0]["kept_in"] == f"a:{first[0]}"
    led = atomic.read_json(runs[0] / "ledger.json")
    assert led["conservation"] is True
    assert led["sources"]["a"]["removed"]["dedup:paragraph"] == {"paragraph_dedup:empty": 1}


def test_same_removals_and_survivors_for_any_workers_shards_and_partitions(runs):
    one, two = decisions(runs[0]), decisions(runs[1])
    steps = atomic.read_json(runs[1] / "run.json")["steps"]
    shards = {s: steps[f"ingest-{s}"]["shards"] for s in ("a", "b")}
    print(f"\ninput shards per source: 3 and 3 vs {shards['a']} and {shards['b']}")
    assert min(shards.values()) > 3  # really other shard counts
    # fuzzy verify works per pair partition (3 here), fed by one fetch task per document shard
    assert steps["dedup-fuzzy-verify"]["shards"] == 3
    assert steps["dedup-fuzzy-fetch"]["shards"] == sum(shards.values())
    for kind in ("exact", "fuzzy", "paragraph"):
        a = {i: (r["keep"], r["reason"], r.get("duplicate_of")) for i, r in one[kind].items()}
        b = {i: (r["keep"], r["reason"], r.get("duplicate_of")) for i, r in two[kind].items()}
        assert a == b, kind
    ma = pq.read_table(sorted((runs[0] / "mixture").glob("*.parquet"))).column("id").to_pylist()
    mb = pq.read_table(sorted((runs[1] / "mixture").glob("*.parquet"))).column("id").to_pylist()
    assert sorted(ma) == sorted(mb)


def test_priority_picks_survivors_from_the_listed_source(ray_local, planted, tmp_path):
    _run(_yaml(tmp_path / "p.yaml", planted["dir"], "  priority: [b]"), 2, tmp_path)
    ex = decisions(tmp_path / "planted")["exact"]
    for base, copy in planted["exact"]:
        assert ex[copy]["keep"] is True and ex[base]["reason"] == f"exact_duplicate_of:{copy}"
    out = curate("explain", str(tmp_path / "planted"), "--id", planted["pairs"][0][1]).stdout
    assert "dedup:exact" in out
