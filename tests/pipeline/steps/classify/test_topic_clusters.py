"""Embedding clusters as topic cells (`sources.<name>.topics: {clusters: K}`): a pool of
Wikipedia summaries and crawl pages clustered on WordLlama's embeddings, weights per
cluster, the report's cluster table, and the same clusters for any workers and shards."""

from __future__ import annotations

import re

import pyarrow.parquet as pq
import pytest

from pipeline import config
from pipeline.errors import UsageError
from pipeline.io import atomic
from pipeline.run import runner
from tests.conftest import write_jsonl, write_yaml

K = 6


@pytest.fixture(scope="module")
def pool(demo_corpus, tmp_path_factory):
    d = tmp_path_factory.mktemp("clusters")
    wiki = pq.read_table(demo_corpus / "wiki" / "summaries_es.parquet", columns=["id", "text"]).to_pylist()[:3000]
    write_jsonl(d / "pool.jsonl", [{"id": f"w{r['id']}", "text": r["text"]} for r in wiki])
    return d


def _yaml(path, d, extra: str = "", weights: str = "", max_shard_bytes: int = 1 << 26):
    weights = weights or ", ".join(f"pool/c{k}: {0.9 / K:.6f}" for k in range(K - 1)) + f", pool/c{K - 1}: {0.1 + 0.9 / K:.6f}"
    return write_yaml(path, f"""
        name: clus
        tokenizer: gpt2
        sources:
          pool: {{paths: ["{d}/pool.jsonl"], id_field: id, max_shard_bytes: {max_shard_bytes},
                  topics: {{clusters: {K}, sample: 2000}}}}
        mixture:
          weights: {{{weights}}}
          validation: {{fraction: 0.05}}
        {extra}
    """)


def _topics(run) -> dict[str, tuple]:
    st = atomic.read_json(run / "run.json")["steps"]["topic-pool"]
    return {r["id"]: (r["topic"], r["topic_score"]) for f in sorted((run / st["dir"]).glob("*/part-*.parquet"))
            for r in pq.read_table(f).to_pylist() if r["keep"]}


@pytest.fixture(scope="module")
def runs(ray_local, pool, tmp_path_factory):
    d = tmp_path_factory.mktemp("runs")
    runner.run(config.load(_yaml(d / "a.yaml", pool)), workers=2, output=str(d / "a"), log=lambda m: None, quiet=True)
    runner.run(config.load(_yaml(d / "b.yaml", pool, max_shard_bytes=300_000)), workers=1, output=str(d / "b"),
               log=lambda m: None, quiet=True)
    return d / "a" / "clus", d / "b" / "clus"


def test_every_kept_document_gets_a_cluster_and_the_weights_name_them(runs):
    run = runs[0]
    topics = _topics(run)
    held = {i for f in (run / "validation").rglob("*.parquet") for i in pq.read_table(f, columns=["id"]).column("id").to_pylist()}
    assert topics and all(re.fullmatch(r"c[0-5]", t) and 0 < s <= 1.0001 for t, s in topics.values())
    sizes = {f"c{k}": sum(1 for t, _ in topics.values() if t == f"c{k}") for k in range(K)}
    print(f"\ncluster sizes: {sizes}")
    assert all(v > 0 for v in sizes.values()) and len(held) == 150 and not held & set(topics)  # held out: no cluster
    man = atomic.read_json(run / "manifest.json")
    assert set(man["cells"]) == {f"pool/c{k}" for k in range(K)}
    assert all(man["cells"][f"pool/c{k}"]["topic"] == f"c{k}" and man["cells"][f"pool/c{k}"]["documents"] > 0 for k in range(K))
    mixed = pq.read_table(sorted((run / "mixture").glob("*.parquet"))).to_pylist()
    assert {r["topic"] for r in mixed} == {f"c{k}" for k in range(K)}
    assert all(topics[r["id"]][0] == r["topic"] for r in mixed)  # each mixed document in its own cluster's cell
    led = atomic.read_json(run / "ledger.json")
    assert led["conservation"] is True


def test_the_report_shows_each_clusters_size_and_three_titles(runs):
    html = (runs[0] / "report.html").read_text()
    i = html.index("Embedding clusters: size and three titles")
    table = html[i : html.index("</table>", i)]
    rows = re.findall(r"<tr><td>(c\d)</td><td>([\d,]+)</td><td>(.*?)</td></tr>", table)
    assert [r[0] for r in rows] == [f"c{k}" for k in range(K)]
    assert all(len(r[2].split(" | ")) == 3 for r in rows)


def test_the_same_clusters_for_any_workers_and_shards(runs):
    a, b = runs
    steps = atomic.read_json(b / "run.json")["steps"]
    assert steps["ingest-pool"]["shards"] > 3
    assert _topics(a) == _topics(b)


def test_cluster_config_errors_name_the_key(pool, tmp_path):
    with pytest.raises(UsageError, match=r"x.yaml:7: mixture.weights.pool/c9: pool/c9: 'c9' is not a cluster of pool; its clusters: c0 .. c5 \(sources.pool.topics.clusters\)"):
        config.load(_yaml(tmp_path / "x.yaml", pool, weights="pool/c9: 1.0"))
    y = _yaml(tmp_path / "y.yaml", pool, extra="dedup: {semantic: {max_tokens: 512}}")
    with pytest.raises(UsageError, match=r"sources.pool.topics: model 'wordllama' with max_tokens 2048 and dtype float16 "
                                         r"differs from dedup.semantic \(model 'wordllama', max_tokens 512, dtype float16\)"):
        config.load(y)
