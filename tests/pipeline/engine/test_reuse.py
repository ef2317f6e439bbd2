"""Reuse by content, shard by shard (issue 50): an edit or a new input file computes only the
shards whose inputs changed, stops where outputs come out the same, and gives the bytes of
a fresh run on the same inputs.

One store takes a chain of changes (a new input file, a filter edit on one source, a dedup
edit, a classifier edit, a changed file, a removed file); after each, the run's mixture
files, token files and ledger counts are compared byte for byte with a fresh run of the
same mixture and inputs in a store of its own, and run.json's per-step counts say which
shards were computed and which linked."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import zstandard

from pipeline.engine.step import read_markers
from pipeline.io import atomic
from tests.conftest import curate, write_yaml

MIX = """
name: {name}
output: {out}
tokenizer: gpt2
sources:
  wiki: {{paths: ["{c}/wiki/*.parquet"], id_field: id, filters: [short]}}
  web: {{paths: ["{c}/web/*.jsonl.zst"], filters: [rep, long], quality: {{classifier: wvw, buckets: 2}}{web_extra}}}
  code: {{paths: ["{c}/code/*.jsonl"], id_field: id, filters: [huge]}}
filters:
  rep: {{type: gopher_repetition}}
  short: {{type: length, min_chars: {min_chars}}}
  long: {{type: length, max_chars: 60000}}
  huge: {{type: length, max_chars: {max_chars}}}
dedup:
  exact: {{}}
  fuzzy: {{threshold: {threshold}}}
  paragraph: {{min_chars: 50, max_occurrences: 5}}{semantic}
classifiers:
  wvw: {{type: fasttext, {examples}, max_examples_per_class: 1500, epochs: {epochs}}}
mixture: {{{mixture}, shard_tokens: 40000, on_shortfall: renormalize}}
tokenize: {{formats: [{formats}]}}
"""
BASE = {"min_chars": 50, "max_chars": 20000, "threshold": 0.8, "epochs": 3, "examples": "positive: [wiki], negative: [web]",
        "web_extra": "", "semantic": "", "formats": "megatron",
        "mixture": "target_tokens: 150000, weights: {web/q2: 0.4, wiki: 0.4, code: 0.2}"}


def _zst(path: Path, lines: list[str]) -> None:
    path.write_bytes(zstandard.ZstdCompressor().compress(("\n".join(lines) + "\n").encode()))


@pytest.fixture(scope="module")
def corpus(demo_corpus, tmp_path_factory) -> Path:
    """Wiki in two Parquet files, web in three JSONL.zst files (a fourth held back), code in
    two JSONL files: about 2,600 documents, so each run takes seconds."""
    c = tmp_path_factory.mktemp("reuse-corpus")
    wiki = pq.read_table(demo_corpus / "wiki" / "summaries_en.parquet").slice(0, 1600)
    (c / "wiki").mkdir()
    pq.write_table(wiki.slice(0, 800), c / "wiki" / "a.parquet")
    pq.write_table(wiki.slice(800, 800), c / "wiki" / "b.parquet")
    lines = []
    for f in sorted((demo_corpus / "web").glob("*.jsonl.zst")):
        lines += zstandard.ZstdDecompressor().stream_reader(f.open("rb")).read().decode().splitlines()
    (c / "web").mkdir()
    for k in range(3):
        _zst(c / "web" / f"crawl-{k}.jsonl.zst", lines[k * 300:(k + 1) * 300])
    _zst(c / "held.jsonl.zst", lines[900:960])  # the new file, 2.3% more documents
    (c / "code").mkdir()
    import gzip

    code = gzip.decompress(next((demo_corpus / "code").glob("*.jsonl.gz")).read_bytes()).decode().splitlines()
    recs = [json.loads(x) for x in code[:300]]
    for k in range(2):
        with open(c / "code" / f"part-{k}.jsonl", "w") as f:
            for i, r in enumerate(recs[k * 150:(k + 1) * 150]):
                f.write(json.dumps({"id": f"c{k}-{i}", "text": r["text"]}) + "\n")
    return c


def _run(corpus: Path, out: Path, name: str, env: dict, **params) -> tuple[Path, dict]:
    y = write_yaml(out.parent / f"{out.name}-{name}.yaml", MIX.format(name=name, out=out, c=corpus, **{**BASE, **params}))
    r = curate("run", str(y), "--workers", "2", env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    run = out / name
    return run, atomic.read_json(run / "run.json")["steps"]


def _bytes(run: Path) -> dict[str, str]:
    """sha256 of every output a user reads (bench/fuzz_reuse.outputs: the mixture, token files,
    samples, validation split, quarantine, report.json, manifest.json and the ledger, less
    their timings; paths to the run, its store and its output folder left out). The config
    hash is left out too: a fresh run's YAML names another output folder."""
    from bench.fuzz_reuse import outputs, timeless

    got = outputs(run, [str(run.parent / "_store"), str(run.parent)])
    for name in ("report.json", "manifest.json"):  # again, without the config hash
        if (run / name).exists():
            doc = json.loads((run / name).read_text())
            doc.pop("config_hash", None)
            got[name] = hashlib.sha256(json.dumps(timeless(doc), sort_keys=True).encode()).hexdigest()
    return got


# the fresh runs as `curate run` runs a mixture this small by default, without Ray (its tasks in
# local worker processes and the driver: engine/pool.py), where the chain's runs are on the
# session's Ray: the bytes must not depend on where the tasks ran either (and it saves the suite
# a Ray's scheduling of ~150 small tasks a fresh run)
SMALL_RUN = {"CURATE_INLINE_DOCS": "5000"}


class Chain:
    """The store taking the changes (on Ray), and a fresh store per step of the chain (SMALL_RUN)."""

    def __init__(self, corpus: Path, tmp: Path, env: dict):
        self.corpus, self.tmp, self.env = corpus, tmp, env
        self.params = dict(BASE)
        self.n = 0

    def step(self, name: str, **params) -> tuple[dict, dict]:
        """Run the changed mixture in the shared store and fresh; returns (steps, fresh steps)
        after checking the bytes are the same."""
        self.params.update(params)
        self.n += 1
        run, steps = _run(self.corpus, self.tmp / "out", name, self.env, **self.params)
        fresh, fsteps = _run(self.corpus, self.tmp / f"fresh{self.n}", name, SMALL_RUN, **self.params)
        a, b = _bytes(run), _bytes(fresh)
        assert a == b, sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        assert any(k.startswith("tokenized/") for k in a) and any(k.startswith("mixture/") for k in a)
        return steps, fsteps


@pytest.fixture(scope="module")
def chain(corpus, tmp_path_factory, joined):
    c = Chain(corpus, tmp_path_factory.mktemp("reuse"), joined)
    c.first, _ = _run(corpus, c.tmp / "out", "first", joined, **BASE)
    return c


def computed(steps: dict, name: str) -> int:
    return steps[name].get("computed", 0) if steps[name]["status"] == "SUCCESS" else 0


def test_every_shard_of_a_run_is_reusable(chain):
    """A shard whose task committed a file outside its folder is never reused (engine/task.py):
    none of an ordinary run's may be (a process's first tokenizer use once wrote Curate's cache
    inside the task's recording)."""
    bad = {}
    for f in (chain.tmp / "out" / "_store" / "steps").glob("*/_markers/part-*.json"):
        m = atomic.read_json(f)
        if m.get("reusable") is False:
            bad[f"{f.parent.parent.name}/{f.name}"] = m.get("written_elsewhere")
    assert bad == {}


def test_a_new_input_file_computes_its_shards_and_links_the_others(chain):
    shutil.copy(chain.corpus / "held.jsonl.zst", chain.corpus / "web" / "crawl-3.jsonl.zst")
    steps, fresh = chain.step("newfile")
    # ingest and filter of web: the new file's shard only; the other three linked by content
    for s in ("ingest-web", "filter-web"):
        assert (steps[s]["computed"], steps[s]["reused"], steps[s]["shards"]) == (1, 3, 4), steps[s]
    # wiki's and code's ingest and filters did not change at all (same step folders)
    assert computed(steps, "ingest-wiki") == computed(steps, "filter-code") == 0
    # dedup's per-shard maps: web's new shard (and the shards after it in the global order,
    # whose number moved) computed, wiki's linked
    m = steps["dedup-exact-map"]
    assert m["reused"] >= 2 and m["computed"] + m["reused"] == m["shards"] == fresh["dedup-exact-map"]["shards"]
    # the dedup apply steps' key digests every reducer's decisions, which the new file changed: each old
    # shard's task reads its own decisions and layers and, where they are the same as before, links the
    # earlier output (cutoff by what a task reads). A shard writes a file of its own only where its
    # bytes differ from the first run's (the new shard, and old ones whose duplicates the new file changed)
    for s in ("dedup-exact", "dedup-fuzzy", "dedup-paragraph"):
        now, before = _files(chain, "newfile", s), _files(chain, "first", s)
        ms = read_markers(chain.tmp / "out" / "_store" / "steps" / steps[s]["dir"].split("/")[-1]).values()
        linked = {(m["source"], m["part"]) for m in ms if "reused_from" in m or "linked_from" in m}
        assert sum("linked_from" in m for m in ms) > 0, s
        assert {k for k in now if k not in linked} == {k for k in now if now[k] != before.get(k)}, s
    # fetch reads its own rows' candidate pairs: an old shard that holds no member of a new pair links its texts
    fe = read_markers(chain.tmp / "out" / "_store" / "steps" / steps["dedup-fuzzy-fetch"]["dir"].split("/")[-1]).values()
    assert 0 < sum("linked_from" in m for m in fe) < len(fe), [m.get("linked_from") for m in fe]
    # verify shingles only the pairs with a new member: the others' Jaccard is looked up
    v = read_markers(chain.tmp / "out" / "_store" / "steps" / steps["dedup-fuzzy-verify"]["dir"].split("/")[-1])
    assert 0 < sum(m["looked_up"] for m in v.values()) < sum(m["rows"] for m in v.values()), v


def test_a_filter_edit_on_one_source_recomputes_that_source_and_links_the_rest(chain):
    steps, _ = chain.step("codeedit", max_chars=15000)
    assert steps["filter-code"]["computed"] == steps["filter-code"]["shards"] == 2
    # the other sources' dedup maps are linked, not computed
    for s in ("dedup-exact-map", "dedup-fuzzy-signatures", "dedup-paragraph-map"):
        assert steps[s]["computed"] <= 2 and steps[s]["reused"] == steps[s]["shards"] - steps[s]["computed"], (s, steps[s])
    # the classifier's examples come from wiki and web, which the edit cannot change: not retrained
    assert computed(steps, "classify-wvw-train") == 0 and steps["classify-wvw-train"]["reused"] == 1
    assert computed(steps, "tokenize-web") == 0 and computed(steps, "tokenize-wiki") == 0


def test_a_shard_recomputed_to_the_same_bytes_stops_the_cascade(chain):
    """A filter edit that changes no decision: the filter runs (its hash changed), writes the
    same bytes, and nothing after it is computed: every later shard is linked."""
    steps, _ = chain.step("cutoff", min_chars=60)  # the shortest wiki summary has 70 characters
    assert steps["filter-wiki"]["computed"] == steps["filter-wiki"]["shards"] == 2
    store = chain.tmp / "out" / "_store" / "steps"
    before = read_markers(store / atomic.read_json(chain.tmp / "out" / "codeedit" / "run.json")["steps"]["filter-wiki"]["dir"].split("/")[-1])
    after = read_markers(store / steps["filter-wiki"]["dir"].split("/")[-1])
    assert [m["out_files"] for _, m in sorted(before.items())] == [m["out_files"] for _, m in sorted(after.items())]
    # samples-pick's spec names what its decisions read, not the run directory: linked too (only the
    # per-source merge, which reads this run's run.json for survivors and eval items, runs in every variant)
    later = [s for s, v in steps.items() if v["status"] == "SUCCESS" and s not in ("filter-wiki", "samples")]
    assert later, steps
    assert {s: steps[s]["computed"] for s in later if steps[s]["computed"]} == {}


def _files(chain, run: str, step: str) -> dict[tuple, dict]:
    """(source, part) -> the files a step's shard wrote, with their digests."""
    d = atomic.read_json(chain.tmp / "out" / run / "run.json")["steps"][step]["dir"].split("/")[-1]
    return {(m["source"], m["part"]): m["out_files"] for _, m in read_markers(chain.tmp / "out" / "_store" / "steps" / d).items()}


def test_a_dedup_edit_reuses_the_maps_and_runs_the_reduces(chain):
    steps, _ = chain.step("dedupedit", threshold=0.85)
    # the threshold is verify's: the signatures, their buckets and the fetched texts are linked
    for s in ("dedup-fuzzy-signatures", "dedup-exact-map", "dedup-fuzzy-buckets", "dedup-fuzzy-fetch"):
        assert computed(steps, s) == 0, (s, steps[s])
    assert steps["dedup-fuzzy-verify"]["computed"] >= 1
    # every pair's Jaccard is looked up in the earlier verify output by its two texts' digests: none shingled again
    v = read_markers(chain.tmp / "out" / "_store" / "steps" / steps["dedup-fuzzy-verify"]["dir"].split("/")[-1])
    assert sum(m["rows"] for m in v.values()) > 0 and all(m["looked_up"] == m["rows"] for m in v.values()), v
    # after the fuzzy layer, exactly the document shards whose fuzzy decisions changed are mapped again
    a, b = _files(chain, "cutoff", "dedup-fuzzy"), _files(chain, "dedupedit", "dedup-fuzzy")
    changed = sum(a[k] != b[k] for k in b)
    assert 0 < changed < len(b)
    assert steps["dedup-paragraph-map"]["computed"] == changed, (changed, steps["dedup-paragraph-map"])


def test_a_classifier_edit_retrains_and_links_what_it_does_not_feed(chain):
    steps, _ = chain.step("epochs", epochs=4)
    assert steps["classify-wvw-train"]["computed"] == 1
    assert computed(steps, "classify-wvw-examples") == 0
    assert computed(steps, "tokenize-wiki") == 0


def test_a_changed_file_recomputes_its_shard_only(chain):
    f = chain.corpus / "code" / "part-1.jsonl"
    lines = f.read_text().splitlines()
    f.write_text("\n".join(lines[:-1]) + "\n")  # one record less
    steps, _ = chain.step("changed")
    assert (steps["ingest-code"]["computed"], steps["ingest-code"]["reused"]) == (1, 1), steps["ingest-code"]


def test_a_removed_file_drops_its_shard_and_reuses_the_others(chain):
    (chain.corpus / "web" / "crawl-3.jsonl.zst").unlink()
    steps, _ = chain.step("removed")
    assert (steps["ingest-web"]["shards"], steps["ingest-web"]["computed"]) == (3, 0), steps["ingest-web"]
    # every shard that reads only the files left is linked (the folder is new: the edits before changed its hash)
    m = steps["dedup-exact-map"]
    assert m["status"] == "SUCCESS" and (m["computed"], m["reused"]) == (0, m["shards"]), m


def test_plan_says_how_many_shards_run_and_how_many_are_reused(chain):
    shutil.copy(chain.corpus / "held.jsonl.zst", chain.corpus / "web" / "crawl-3.jsonl.zst")
    y = write_yaml(chain.tmp / "plan.yaml", MIX.format(name="plan", out=chain.tmp / "out", c=chain.corpus, **chain.params))
    out = curate("plan", str(y)).stdout
    line = next(x for x in out.splitlines() if x.startswith("ingest-web "))
    assert "run 1 of 4 shards (3 reused)" in line, line
    assert any("shards reused by content once filter-web has run" in x for x in out.splitlines()), out


def test_a_pinned_classifier_scores_only_the_texts_it_has_not_scored(chain):
    """The classifier pinned to an earlier run's model (`model:`, as a team adding monthly dumps
    does): a change that moves web's keep masks (a file removed: old pages lose or gain their
    duplicates) runs the scoring of the shards whose read changed, and each scores only the
    texts its earlier shard did not score; the bytes are a fresh run's."""
    d = chain.tmp / "out" / "removed" / "steps"
    model = chain.tmp / "wvw.bin"
    shutil.copy(next(d.glob("classify-wvw-train-*")) / "model.bin", model)
    chain.step("pinned", examples=f"model: {model}")  # crawl-3 is back (the plan test's copy)
    (chain.corpus / "web" / "crawl-3.jsonl.zst").unlink()
    steps, _ = chain.step("pinnedless")
    ms = read_markers(chain.tmp / "out" / "_store" / "steps" / steps["classify-wvw-web"]["dir"].split("/")[-1]).values()
    ran = [m for m in ms if "reused_from" not in m and "linked_from" not in m]
    old = [m for m in ran if m.get("scored_before")]
    assert old, ms  # old shards whose keep mask changed ran, and looked their texts' scores up
    assert all(m["scored_before"] < m["rows"] for m in old)  # some of their texts did change (paragraph cuts)
    assert sum(m["scored_before"] for m in ran) > sum(m["rows"] for m in ran) // 2, ran
    # the token encoding of those shards, the same way: the texts an earlier shard encoded are looked up
    ms = read_markers(chain.tmp / "out" / "_store" / "steps" / steps["tokenize-web"]["dir"].split("/")[-1]).values()
    ran = [m for m in ms if "reused_from" not in m and "linked_from" not in m]
    assert ran and sum(m["encoded_before"] for m in ran) > sum(m["rows"] for m in ran) // 2, ran
    # paragraph dedup's apply counts the tokens of the cut texts an earlier shard did not count
    ms = read_markers(chain.tmp / "out" / "_store" / "steps" / steps["dedup-paragraph"]["dir"].split("/")[-1]).values()
    ran = [m for m in ms if "reused_from" not in m and "linked_from" not in m and m["docs_rewritten"]]
    assert ran and sum(m["counted_before"] for m in ran) > 0, ran


def test_a_shard_whose_keep_mask_alone_moved_links_its_scores(chain, tmp_path):
    """Without paragraph dedup (which rewrites texts), a filter edit before the classifier
    moves web's keep masks and no text: each web shard's scoring links its earlier scores
    file (every row is scored, kept or not) and reads no text; the bytes are a fresh run's."""
    model = tmp_path / "wvw.bin"
    shutil.copy(next((chain.tmp / "out" / "first" / "steps").glob("classify-wvw-train-*")) / "model.bin", model)
    text = MIX.replace("  paragraph: {{min_chars: 50, max_occurrences: 5}}{semantic}\n", "{semantic}")
    assert text != MIX

    def run(out: Path, name: str, max_chars: int) -> dict:
        y = write_yaml(tmp_path / f"{out.name}-{name}.yaml", text.format(
            name=name, out=out, c=chain.corpus, **{**BASE, "examples": f"model: {model}"}).replace(
            "long: {type: length, max_chars: 60000}", f"long: {{type: length, max_chars: {max_chars}}}"))
        r = curate("run", str(y), "--workers", "2", env=chain.env)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        return atomic.read_json(out / name / "run.json")["steps"]

    run(tmp_path / "out", "a", 60000)
    steps = run(tmp_path / "out", "b", 1500)  # about a third of web's pages are longer
    run(tmp_path / "fresh", "b", 1500)
    assert _bytes(tmp_path / "out" / "b") == _bytes(tmp_path / "fresh" / "b")
    ms = read_markers(tmp_path / "out" / "_store" / "steps" / steps["classify-wvw-web"]["dir"].split("/")[-1]).values()
    ran = [m for m in ms if "reused_from" not in m and "linked_from" not in m]
    assert ran and all(m.get("scores_linked") and m["scored_before"] == m["rows"] for m in ran), ms


def test_a_selection_fanned_out_to_tasks_gives_the_same_bytes(chain, tmp_path):
    """`CURATE_SELECT_GROUP=2`: web's quality threshold (its bucket edges over 3 score shards),
    the mixture's selection and the samples read their files in tasks of 2 files, run on Ray
    from the selecting task, which adds their results up; the run's bytes (the published
    samples' included) are the default's."""
    for store, env in (("default", chain.env), ("out", {**chain.env, "CURATE_SELECT_GROUP": "2"})):
        y = write_yaml(tmp_path / f"{store}.yaml", MIX.format(name="first", out=tmp_path / store, c=chain.corpus, **BASE))
        r = curate("run", str(y), "--workers", "2", env=env)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    out = tmp_path / "out"
    assert _bytes(out / "first") == _bytes(tmp_path / "default" / "first")
    steps = atomic.read_json(out / "first" / "run.json")["steps"]
    ms = read_markers(out / "_store" / "steps" / steps["quality-web-threshold"]["dir"].split("/")[-1])
    assert ms[0]["select_tasks"] >= 2 * 2, ms  # the histogram and at least one bin, in 2 tasks each
    ms = read_markers(out / "_store" / "steps" / steps["samples"]["dir"].split("/")[-1])
    assert any(m.get("merge_tasks", 0) >= 2 for m in ms.values()), ms  # web's picks merged by a tree too


SEMANTIC = "\n  semantic: {threshold: 0.9, sample: 500}"
PHASES = ("phases: [{name: early, target_tokens: 80000, weights: {web/q2: 0.5, wiki: 0.5}}, "
          "{name: late, target_tokens: 60000, weights: {code: 0.4, wiki: 0.3, web/q2: 0.3}}]")


def test_semantic_dedup_topic_clusters_and_levanter_caches_give_the_bytes_of_a_fresh_run(chain):
    steps, _ = chain.step("semantic", semantic=SEMANTIC, web_extra=", topics: {clusters: 2, sample: 500}",
                          formats="megatron, levanter")
    assert computed(steps, "dedup-semantic") >= 1 and computed(steps, "tokens-levanter") >= 1, steps.keys()
    assert computed(steps, "filter-web") == 0  # what the edit does not touch is not computed


def test_phases_then_a_weights_only_edit_give_the_bytes_of_a_fresh_run(chain):
    chain.step("phases", semantic="", web_extra="", formats="megatron", mixture=PHASES)
    steps, _ = chain.step("phaseweights", mixture=PHASES.replace("web/q2: 0.5, wiki: 0.5", "web/q2: 0.7, wiki: 0.3"))
    for s in ("filter-web", "dedup-exact-map", "classify-wvw-web", "tokenize-web", "mix-priority"):
        assert computed(steps, s) == 0, (s, steps[s])  # a weights edit computes the selection and what follows it only
    assert steps["mix"]["computed"] >= 1
