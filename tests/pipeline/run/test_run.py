"""The whole chain through the real CLI and a real embedded Ray: determinism, caching, resume."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path


from pipeline.io import atomic
from tests.conftest import curate, mixture_shas, write_yaml


def test_demo_is_accounted_for(demo_run):
    # the same bytes with other worker counts: tests/pipeline/engine/test_cluster.py (3 nodes; a resume with 1 worker)
    d2 = demo_run
    assert len(mixture_shas(d2)) >= 3
    for path, sha in mixture_shas(d2).items():  # the manifest tells the truth about the files
        assert atomic.file_digest(d2 / path)[1] == sha
    led = atomic.read_json(d2 / "ledger.json")
    assert led["conservation"] is True
    for name, e in led["sources"].items():
        assert e["conservation"] is True and e["in"] == e["kept"] + e["removed_total"] + e["quarantined"], name
    web, wiki = led["sources"]["web"], led["sources"]["wiki"]
    assert web["in"] == 3000 and web["removed"]["filter:english"]["wrong_language:la"] > 50  # lorem ipsum pages
    assert web["removed"]["filter:gopher_quality"]["too_few_alpha_words"] > 50  # keyword stuffing
    assert set(web["removed"]) >= {"filter:english", "filter:gopher_quality", "filter:c4_quality"}
    assert wiki["in"] == 26227 and wiki["removed"]["filter:english"]["wrong_language:fr"] > 9000
    code = led["sources"]["code"]  # huge files, near-identical modules, and down-sampling to its 10%
    assert set(code["removed"]) <= {"filter:not_huge", "dedup:exact", "dedup:fuzzy", "decontaminate", "mix"}
    assert code["removed"]["mix"]["not_selected"] > 0
    stages = [st["stage"] for st in web["stages"]]
    assert stages == ["ingest", "filter:fix_text", "filter:english", "filter:gopher_quality", "filter:gopher_repetition",
                      "filter:c4_quality", "filter:fineweb_quality", "filter:redact_pii", "dedup:exact", "dedup:fuzzy",
                      "dedup:paragraph", "decontaminate", "validation", "quality:wiki_vs_web", "mix"]
    rw = {st["stage"]: st.get("rewritten") for st in web["stages"]}  # the crawl's planted mojibake and contact lines
    assert rw["filter:fix_text"]["docs_changed"] > 50 and rw["filter:redact_pii"]["emails"] > 50
    # the demo's eval source: HumanEval problems planted in code are found, and it is never mixed
    assert code["removed"]["decontaminate"]["contaminated:humaneval"] >= 3
    he = led["sources"]["humaneval"]
    assert he["in"] == 164 and he["removed"]["validation"]["eval_source"] >= 160 and "mix" not in he["removed"]
    man = atomic.read_json(d2 / "manifest.json")
    assert man["total_docs"] == sum(e["stages"][-1]["rows_out"] for e in led["sources"].values())
    assert sum(s["realized_tokens"] for s in man["sources"].values()) == man["total_tokens"]
    assert web["stages"][-1]["repeated_rows"] > 0  # web needs more than one epoch


def test_mixture_reads_with_pyarrow_dataset_and_hf_datasets(demo_run, tmp_path):
    import datasets
    import pyarrow.dataset as pads

    files = sorted(str(p) for p in (demo_run / "mixture").glob("*.parquet"))
    t = pads.dataset(files, format="parquet").to_table()
    assert t.column_names == ["id", "text", "source", "source_id", "n_tokens", "epoch", "quality_score", "quality_bucket", "topic", "topic_score", "lang"]
    ds = datasets.load_dataset("parquet", data_files=files, split="train", cache_dir=str(tmp_path / "hfcache"))
    assert len(ds) == t.num_rows and ds[0]["text"] == t.column("text")[0].as_py()
    keys = list(zip(t.column("source").to_pylist(), t.column("id").to_pylist(), t.column("epoch").to_pylist(), strict=True))
    assert len(set(keys)) == t.num_rows
    # the manifest against a recount of the files
    man = atomic.read_json(demo_run / "manifest.json")
    total = sum(t.column("n_tokens").to_pylist())
    assert total == man["total_tokens"] and t.num_rows == man["total_docs"]
    for f in man["files"]:
        ft = pads.dataset(str(demo_run / f["path"]), format="parquet").to_table()
        assert (ft.num_rows, sum(ft.column("n_tokens").to_pylist())) == (f["rows"], f["tokens"])
    shares = []
    for s, v in man["sources"].items():
        mine = [n for n, src in zip(t.column("n_tokens").to_pylist(), t.column("source").to_pylist(), strict=True) if src == s]
        assert sum(mine) == v["realized_tokens"] and len(mine) == v["docs"]
        shares.append((s, v["weight"], sum(mine) / total))
        assert abs(sum(mine) / total - v["weight"]) <= 0.005, (s, v)
    print(f"\nrealised shares: {shares}")
    # per cell (the demo weighs two ranges of the crawl's quality buckets): the rows of each bucket range
    buckets = t.column("quality_bucket").to_pylist()
    for name, c in man["cells"].items():
        lo, hi = c["buckets"] or (None, None)
        mine = [n for n, src, q in zip(t.column("n_tokens").to_pylist(), t.column("source").to_pylist(), buckets, strict=True)
                if src == c["source"] and (lo is None or lo <= q <= hi)]
        assert (sum(mine), len(mine)) == (c["tokens"], c["documents"]), name
        assert abs(sum(mine) / total - c["target_weight"]) <= 0.005, (name, c)
    assert man["cells"]["web/q1-q2"]["tokens"] == 0 and man["cells"]["web/q5"]["epochs"] > 1


def test_rerun_skips_everything_and_mixture_edit_reruns_only_mix(demo_run_yaml, demo_run, tmp_path):
    """A copy of the session's output folder (run directories and their step store move
    together: the runs' step links are relative), run again."""
    import shutil

    out = str(tmp_path)
    shutil.copytree(demo_run.parent, tmp_path, symlinks=True, dirs_exist_ok=True)
    # a copy of the file, publishing beside it (the session's published folder is other tests'); it takes
    # the copied run directory over once (--overwrite), then is edited in place: the normal loop
    demo_yaml = write_yaml(tmp_path / "demo.yaml", demo_run_yaml.read_text().replace(
        str(demo_run_yaml.parent / "published"), str(tmp_path / "published")))
    t0 = time.time()
    r = curate("run", str(demo_yaml), "--output", out, "--overwrite")
    took = time.time() - t0
    assert r.returncode == 0, r.stderr
    assert took < 15, took
    steps = atomic.read_json(tmp_path / "demo" / "run.json")["steps"]
    assert {s["status"] for s in steps.values()} == {"SKIPPED"}
    first = mixture_shas(tmp_path / "demo")

    edited = write_yaml(demo_yaml, demo_yaml.read_text().replace(
        "weights: {web/q5: 0.25, web/q3-q4: 0.35, wiki: 0.3, code: 0.1}", "weights: {web/q5: 0.2, web/q3-q4: 0.3, wiki: 0.4, code: 0.1}").replace(
        "shard_tokens: 100000", "shard_tokens: 50000"))
    plan = curate("plan", str(edited), "--output", out)
    r = curate("run", str(edited), "--output", out)
    assert plan.returncode == 0, plan.stderr
    actions = {ln.split()[0]: ln.split()[2:] for ln in plan.stdout.splitlines() if ln.split()[:1] and "-" in ln.split()[0]
               and ln.split()[0][0].islower() and len(ln.split()) > 3 and ln.split()[2] in ("run", "skip")}
    assert actions["mix-select"][:3] == ["run", "config", "changed;"]  # then: reused by content once mix-priority has run
    assert " ".join(actions["mix-select"][3:]) == "shards reused by content once mix-priority has run"
    assert all(v == ["skip", "done"] for k, v in actions.items() if not k.startswith(("mix", "samples", "tokens-"))), actions
    assert "expected mixture" in plan.stdout and "0.400" in plan.stdout
    assert r.returncode == 0, r.stderr
    steps = atomic.read_json(tmp_path / "demo" / "run.json")["steps"]
    assert {k for k, s in steps.items() if s["status"] == "SUCCESS"} == {"mix-budget", "mix-priority", "mix-select", "mix-route", "mix-route-merge", "mix",
                                                                        "tokens-megatron", "tokens-memmap", "samples-pick", "samples"}
    # the priority keys of a shard depend on its cells' membership, seed and epoch, not on the weights: a
    # source whose epochs the edit leaves (code) links its shards
    pr = steps["mix-priority"]
    assert 0 < pr["reused"] and pr["computed"] + pr["reused"] == pr["shards"], pr
    man = atomic.read_json(tmp_path / "demo" / "manifest.json")
    assert len(man["files"]) > len(first) and abs(man["sources"]["wiki"]["realized_weight"] - 0.4) < 0.005
    assert sorted(p.name for p in (tmp_path / "demo" / "mixture").iterdir()) == sorted(Path(f["path"]).name for f in man["files"])


def test_stale_ray_address_file_is_cleared_with_a_message(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.jsonl").write_text('{"text": "one two three"}\n')
    y = write_yaml(tmp_path / "m.yaml", """
        name: s
        sources:
          s: {paths: ["d/*.jsonl"]}
    """)
    short = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # Ray's socket paths must stay short
    (short / "ray").mkdir()
    stale = short / "ray" / "ray_current_cluster"
    stale.write_text("127.0.0.1:1\n")  # nothing listens on port 1
    r = curate("run", str(y), "--workers", "1", env={"RAY_TMPDIR": str(short)})
    assert r.returncode == 0, r.stderr
    assert f"note: cleared a stale Ray address file ({stale}: 127.0.0.1:1)" in r.stderr
    assert atomic.read_json(tmp_path / "out" / "s" / "ledger.json")["totals"]["kept"] == 1


def test_a_source_named_like_a_temporary_file_runs(tmp_path, joined):
    """A source name is a folder name in the store (`<step>/<source>/part-...`): `x.tmp-1`
    looks like a temporary file's name, and the run's cleanup of temporary files must not
    take its folder for one."""
    (tmp_path / "d.jsonl").write_text("".join(f'{{"text": "document {i} with a few words"}}\n' for i in range(20)))
    y = write_yaml(tmp_path / "m.yaml", """
        name: m
        sources:
          x.tmp-1: {paths: ["d.jsonl"]}
        dedup: {exact: {}}
    """)
    r = curate("run", str(y), "--workers", "2", env=joined)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    led = atomic.read_json(tmp_path / "out" / "m" / "ledger.json")
    assert led["conservation"] and led["sources"]["x.tmp-1"]["kept"] == 20


def test_explain_names_the_filter_and_reason(demo_run):
    import pyarrow.parquet as pq

    run_dir = demo_run
    attrs = pq.read_table(next((run_dir / "steps").glob("filter-web-*")) / "part-00000.parquet").to_pylist()
    removed = next(a for a in attrs if a["stage"] == "c4_quality")
    r = curate("explain", str(run_dir), "--id", removed["id"])
    assert r.returncode == 0, r.stderr
    assert "filter:english               kept  (lang=en" in r.stdout
    assert f"=> removed at filter:c4_quality: {removed['reason']}" in r.stdout
    rows = pq.read_table(run_dir / "mixture" / "part-00000.parquet", columns=["id", "source"]).to_pylist()
    kept_id = next(x["id"] for x in rows if x["source"] == "wiki")  # wiki is down-sampled: one epoch
    r = curate("explain", str(run_dir), "--id", kept_id)
    assert "=> kept, in mixture/part-00000.parquet\n" in r.stdout
    r = curate("explain", str(run_dir), "--id", "nope")
    assert r.returncode == 1 and "no document with id 'nope'" in r.stdout


def test_a_filtered_sources_tokens_are_counted_for_what_its_filters_keep(demo_run):
    """Ingest leaves a filtered source's n_tokens null and its filter step counts the documents it
    keeps: the decisions (explain, samples) and the mixture carry the same counts, the removed
    documents none, and the ledger says the tokens before the last filter were not counted."""
    import pyarrow.parquet as pq

    from pipeline.plan import tokens
    from pipeline.shards import decisions as dec

    part = next((demo_run / "steps").glob("ingest-web-*")) / "part-00000.parquet"
    assert set(pq.read_table(part, columns=["n_tokens"]).column("n_tokens").to_pylist()) == {None}
    t = dec.shard_decisions(dec.Run(demo_run), "web", part, with_text=True).to_pylist()
    mixed = {r["id"]: r["n_tokens"] for f in sorted((demo_run / "mixture").glob("part-*.parquet"))
             for r in pq.read_table(f, columns=["id", "n_tokens"]).to_pylist()}
    kept = [r for r in t if r["status"] == "kept"]
    assert kept and all(r["n_tokens"] == mixed[r["id"]] == tokens.count("gpt2", [r["text"]])[0] for r in kept[:50])
    assert all(r["n_tokens"] is None for r in t if r["stage"] and r["stage"].startswith("filter:"))
    web = atomic.read_json(demo_run / "ledger.json")["sources"]["web"]["stages"]
    assert web[0]["tokens_out"] is None and web[-1]["tokens_out"] > 0


def test_decisions_for_a_few_rows_scores_are_those_of_the_whole_shard(demo_run):
    """samples-pick asks for the scores of its picks only (a filter chain's scores are most of
    the decisions' cost): the same values as the whole shard's, every other column the same."""
    from pipeline.shards import decisions as dec

    part = next((demo_run / "steps").glob("ingest-web-*")) / "part-00000.parquet"
    run = dec.Run(demo_run)
    full = dec.shard_decisions(run, "web", part)
    rows = [0, 3, 17, full.num_rows - 1]
    some = dec.shard_decisions(run, "web", part, score_rows=rows)
    assert some.drop(["scores"]).equals(full.drop(["scores"]))
    got, want = some.column("scores").to_pylist(), full.column("scores").to_pylist()
    assert [got[i] for i in rows] == [want[i] for i in rows] and all(want[i] for i in rows)
    assert all(got[i] is None for i in range(full.num_rows) if i not in rows)
