"""A worker that dies mid-shard is a system failure: Ray retries the shard, the bytes do not change."""

from __future__ import annotations

from pipeline.io import atomic
from tests.conftest import curate, write_yaml


def test_a_killed_worker_is_retried_and_the_mixture_is_unchanged(demo_corpus, tmp_path):
    marker = tmp_path / "crashed"
    text = f"""
        name: r
        sources:
          wiki: {{paths: ["{demo_corpus}/wiki/summaries_es.parquet"], id_field: id, max_shard_rows: 2000, filters: [f]}}
        filters:
          f: {{type: python, callable: "tests.filters.user_rules:crash_once", args: {{marker: "{marker}"}}}}
    """
    y = write_yaml(tmp_path / "r.yaml", text)
    r = curate("run", str(y), "--workers", "2", "--output", str(tmp_path / "crash"))
    assert r.returncode == 0, r.stderr
    assert marker.exists()  # a worker did die
    r2 = curate("run", str(y), "--workers", "2", "--output", str(tmp_path / "clean"))  # marker exists: no crash now
    assert r2.returncode == 0, r2.stderr
    shas = [{f["path"]: f["sha256"] for f in atomic.read_json(tmp_path / d / "r" / "manifest.json")["files"]}
            for d in ("crash", "clean")]
    assert shas[0] == shas[1]
    led = atomic.read_json(tmp_path / "crash" / "r" / "ledger.json")["sources"]["wiki"]
    assert led["in"] == led["kept"] == 6239 and led["conservation"]
