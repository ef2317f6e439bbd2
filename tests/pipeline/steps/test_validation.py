"""mixture.validation (pipeline/steps/validation.py): an exact held-out share of each train
source, never in the mixture, chosen after dedup, the same whatever the workers and shards."""

from __future__ import annotations

import hashlib
import json
import random

import pyarrow.parquet as pq

from pipeline.io import atomic
from tests.conftest import curate, write_yaml


def _run(d, name, workers, shard_rows, env=None):
    y = write_yaml(d / f"{name}.yaml", f"""
        name: {name}
        output: out
        sources:
          web: {{paths: [web.jsonl], id_field: id, max_shard_rows: {shard_rows}}}
          wiki: {{paths: [wiki.jsonl], id_field: id, max_shard_rows: {shard_rows}}}
        dedup:
          fuzzy: {{ngram: 5, num_perm: 112, bands: 14, threshold: 0.8, verify: true}}
        mixture:
          weights: {{web: 0.5, wiki: 0.5}}
          validation: {{fraction: 0.1}}
    """)
    r = curate("run", str(y), "--workers", workers, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return d / "out" / name


def test_a_held_out_share_is_exact_never_mixed_and_after_dedup(demo_corpus, tmp_path, joined, joined_1cpu):
    rng = random.Random(5)
    wiki = [r for r in pq.read_table(demo_corpus / "wiki" / "summaries_en.parquet", columns=["id", "text"]).to_pylist()
            if len(r["text"].split()) >= 30]
    rng.shuffle(wiki)
    pairs = [r for r in wiki if len(r["text"].split()) >= 150][:60]  # each in web, a near copy (one word changed) in wiki
    wiki = [r for r in wiki if r not in pairs]
    web = [{"id": f"w-{r['id']}", "text": r["text"]} for r in wiki[:1000] + pairs]
    near = []
    for r in pairs:
        w = r["text"].split()
        w[7] = "changedword"
        near.append({"id": f"k-{r['id']}", "text": " ".join(w)})
    wk = [{"id": f"k-{r['id']}", "text": r["text"]} for r in wiki[1000:1800]] + near
    for name, rows in (("web", web), ("wiki", wk)):
        with open(tmp_path / f"{name}.jsonl", "w") as f:
            for x in rows:
                f.write(json.dumps(x) + "\n")
    run = _run(tmp_path, "v2", "2", 400, env=joined)
    man = atomic.read_json(run / "manifest.json")
    mixed = set(pq.read_table(sorted((run / "mixture").glob("*.parquet")), columns=["id"]).column("id").to_pylist())
    held = {}
    for s in ("web", "wiki"):
        files = man["validation"][s]["files"]
        assert files and all(hashlib.sha256((run / f["path"]).read_bytes()).hexdigest() == f["sha256"] for f in files)
        held[s] = pq.read_table([str(run / f["path"]) for f in files], columns=["id"]).column("id").to_pylist()
        avail = man["validation"][s]["available"]
        assert abs(len(held[s]) - 0.1 * avail) <= 1, (s, len(held[s]), avail)  # within one document of the share
        assert not set(held[s]) & mixed  # never in the mixture
    led = atomic.read_json(run / "ledger.json")["sources"]
    assert all(e["conservation"] is True for e in led.values())
    assert {s: led[s]["removed"]["validation"]["held_out"] for s in held} == {s: len(v) for s, v in held.items()}
    # dedup came first: of each near-duplicate pair at most one side is anywhere, validation or mixture
    everywhere = mixed | set(held["web"]) | set(held["wiki"])
    assert sum(f"w-{r['id']}" in everywhere and f"k-{r['id']}" in everywhere for r in pairs) == 0
    # the same held-out documents with one worker and other shards
    again = _run(tmp_path, "v1", "1", 700, env=joined_1cpu)
    man1 = atomic.read_json(again / "manifest.json")["validation"]
    for s in ("web", "wiki"):
        ids = pq.read_table([str(again / f["path"]) for f in man1[s]["files"]], columns=["id"]).column("id").to_pylist()
        assert sorted(ids) == sorted(held[s])
