"""The experiment loop on the demo: `curate sweep --runs 8 --run` over the shared demo run's
steps, a metric computed here from each variant's realised mixture (the add-one unigram
cross-entropy, in bits per word, of held-out Wikipedia summaries and HumanEval prompts: a
stand-in for a proxy model's loss), then `curate fit` and the proposal validated.

The sweep's base is the demo mixture with the shared run's step store, so every variant
reuses every step but the mix's; the variants' wall time is printed beside the first run's."""

from __future__ import annotations

import collections
import csv
import json
import math
import re
import time

import pyarrow.parquet as pq

from pipeline.io import atomic
from tests.conftest import curate

WORD = re.compile(r"\w+")
MIX_STEPS = ("mix", "samples", "tokens-")


def counts(texts) -> collections.Counter:
    c: collections.Counter = collections.Counter()
    for t in texts:
        c.update(w.lower() for w in WORD.findall(t))
    return c


def unigram_bits(mixture_dir, held_out: list[collections.Counter]) -> float:
    c = counts(t for f in sorted(mixture_dir.glob("*.parquet")) for t in pq.read_table(f, columns=["text"])["text"].to_pylist())
    total, vocab = sum(c.values()), len(c) + 1
    return sum(sum(k * -math.log2((c.get(w, 0) + 1) / (total + vocab)) for w, k in h.items()) / sum(h.values())
               for h in held_out) / len(held_out)


def test_sweep_run_and_fit_on_the_demo(demo_run, demo_run_yaml, demo_corpus, joined):
    d = demo_run_yaml.parent
    text = demo_run_yaml.read_text()
    assert "output: ../out" in text
    base = d / "sweepbase.yaml"  # the demo mixture; its run directories apart, its step store the shared run's
    base.write_text(text.replace("output: ../out", f"output: sweep_out\nstore: {demo_run.parent / '_store'}", 1))
    t0 = time.time()
    r = curate("sweep", str(base), "--runs", "8", "--out", str(d / "sw"), "--run", env=joined, timeout=600)
    wall = time.time() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    assert "running" not in r.stderr  # the cells' tokens came from the shared run's steps: nothing ran first
    names = sorted(p.name for p in (d / "sw").glob("*.yaml"))
    assert names == [f"demo-sweep-{i:03d}.yaml" for i in range(8)]
    info = atomic.read_json(d / "sw" / "sweep.json")
    assert info["columns"] == ["web/q5", "web/q3-q4", "wiki", "code"]
    secs = []
    for v in info["variants"]:
        run = d / "sweep_out" / v["name"]
        rec = json.loads((run / "run.json").read_text())
        assert rec["status"] == "SUCCESS"
        ran = sorted(n for n, s in rec["steps"].items() if s["status"] != "SKIPPED")
        assert ran and all(n.startswith(MIX_STEPS) for n in ran), ran  # every step but the mix's reused
        secs.append(rec["seconds"])
        cells = json.loads((run / "manifest.json").read_text())["cells"]
        for c, w in v["weights"].items():  # the realised mixture has the variant's weights
            assert abs(cells[c]["realized_weight"] - w) < 0.02, (v["name"], c, cells[c]["realized_weight"], w)
    first = json.loads((demo_run / "run.json").read_text())["seconds"]
    print(f"\nsweep of 8 variants: {wall:.1f}s for the command, variants {min(secs):.1f}-{max(secs):.1f}s each "
          f"(sum {sum(secs):.1f}s); the shared demo run took {first:.1f}s")

    wiki = pq.read_table(demo_corpus / "wiki" / "summaries_en.parquet", columns=["text"])["text"].to_pylist()[-300:]
    code = [json.loads(line)["text"] for line in open(demo_corpus / "eval" / "humaneval.jsonl")]
    held = [counts(wiki), counts(code)]
    results = d / "results.csv"
    with open(results, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["variant", "unigram_bits"])
        for v in info["variants"]:
            w.writerow([v["name"], f"{unigram_bits(d / 'sweep_out' / v['name'] / 'mixture', held):.6f}"])
    r = curate("fit", str(d / "sw"), str(results), "--metric", "unigram_bits", "--minimize")
    assert r.returncode == 0, r.stderr[-3000:]
    print(r.stdout)
    fit = atomic.read_json(d / "sw" / "fit.json")
    proposed = d / "demo-fit.yaml"
    assert fit["file"] == str(proposed) and proposed.exists()
    assert curate("validate", str(proposed)).returncode == 0
    caps = info["groups"][0]["caps"]
    assert all(0 <= fit["proposed"][c] <= caps[c] + 1e-9 for c in caps) and abs(sum(fit["proposed"].values()) - 1) < 1e-9
    best = min(json.loads(json.dumps(list(csv.DictReader(open(results))))), key=lambda x: float(x["unigram_bits"]))
    assert fit["best_observed"]["variant"] == best["variant"]


def test_a_sweep_of_phases_runs_the_file_first(demo_corpus, tmp_path, joined):
    """A mixture with two phases that has never run: the sweep runs it once to count the
    cells, then draws each phase's weights on its own simplex within its caps (phase
    `anneal` has a quarter of the tokens, so its caps are 4x as loose); the variants run."""
    y = tmp_path / "ph.yaml"
    y.write_text(f"""name: ph
output: out
sources:
  wiki: {{paths: ["{demo_corpus}/wiki/summaries_es.parquet"], id_field: id, max_shard_rows: 2500}}
  web: {{paths: ["{demo_corpus}/web/crawl-0000[01].jsonl.zst"]}}
  code: {{paths: ["{demo_corpus}/code/*.jsonl.gz"], id_field: path}}
mixture:
  max_epochs: 1
  phases:
    - {{name: main, target_tokens: 400000, weights: {{web: 0.5, wiki: 0.3, code: 0.2}}}}
    - {{name: anneal, target_tokens: 100000, weights: {{web: 0.2, wiki: 0.8}}}}
""")
    r = curate("sweep", str(y), "--runs", "3", "--run", env=joined, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"running {y} once" in r.stderr
    info = atomic.read_json(tmp_path / "ph-sweep" / "sweep.json")
    assert info["columns"] == ["main:web", "main:wiki", "main:code", "anneal:web", "anneal:wiki"]
    main, anneal = info["groups"]
    for g in (main, anneal):
        for c in g["cells"]:  # cap = max_epochs (1) x available / the phase's target
            assert g["caps"][c] == min(1.0, g["available"][c] / g["target"])
    assert any(u < 1 for u in main["caps"].values())  # a cap that binds in the larger phase
    for v in info["variants"]:
        for g in (main, anneal):
            ws = {c: v["weights"][f"{g['phase']}:{c}"] for c in g["cells"]}
            assert abs(sum(ws.values()) - 1) < 1e-9 and all(ws[c] <= g["caps"][c] + 1e-9 for c in ws)
        man = json.loads((tmp_path / "out" / v["name"] / "manifest.json").read_text())
        for g in (main, anneal):
            cells = man["phases"][g["phase"]]["cells"]
            for c in g["cells"]:  # the variant's weights are the phase's targets; realised within a document or so
                w = v["weights"][f"{g['phase']}:{c}"]
                assert abs(cells[c]["target_weight"] - w) < 1e-9, (v["name"], g["phase"], c)
                assert abs(cells[c]["realized_weight"] - w) < 0.06, (v["name"], g["phase"], c)
