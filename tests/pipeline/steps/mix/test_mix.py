"""The weighted mixture: budget and selection properties (hypothesis), and runs through
the real CLI: upsampling with epochs, shortfalls, seeds, determinism."""

from __future__ import annotations

import json
import math
import tempfile

import numpy as np
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.shards import select
from pipeline.errors import RunError
from pipeline.io import atomic
from pipeline.mixing import budget
from tests.conftest import curate, write_yaml


def _choose(ids, tokens, target, seed, source):
    """The reference: whole epochs, then the partial one in priority order until met."""
    avail = sum(tokens)
    whole, partial = budget.split_epochs(target, avail)
    rows = [(i, e) for e in range(whole) for i in ids]
    if partial:
        p = budget.priority(seed, source, ids, whole)
        got = 0
        for k in np.argsort(p, kind="stable"):
            if got >= partial:
                break
            rows.append((ids[k], whole))
            got += tokens[k]
    return rows


sources = st.dictionaries(st.sampled_from(["a", "b", "c", "d"]),
                          st.lists(st.integers(1, 400), min_size=1, max_size=40), min_size=1, max_size=4)


def _selected(ids, tokens, target, seed, source, cut):
    """The product's rows: the priority keys of two shards (cut at `cut`) merged into the
    partial epoch's cutoff by the select's reader (shards/select.py), then each shard's
    chosen (document, epoch) pairs as the route takes them (mixing/budget.cell_epochs)."""
    avail = sum(tokens)
    whole, partial = budget.split_epochs(target, avail)
    c = None
    if partial:
        p = budget.priority(seed, source, ids, whole)
        t = np.array(tokens, np.int64)
        with tempfile.TemporaryDirectory() as tmp:
            files = [f"{tmp}/a.parquet", f"{tmp}/b.parquet"]
            select.write_keys(files[0], p[:cut], t[:cut])
            select.write_keys(files[1], p[cut:], t[cut:])
            c, _, _ = select.cutoff(files, partial)
    cell = {"whole_epochs": whole, "cutoff": c}
    rows = []
    for part in (ids[:cut], ids[cut:]):
        for e, mask in budget.cell_epochs(cell, seed, source, part):
            rows += [(i, e) for k, i in enumerate(part) if mask is None or mask[k]]
    return rows


@settings(max_examples=150, deadline=None)
@given(sources, st.data())
def test_budget_and_selection_properties(srcs, data):
    """The budget's targets, and the rows the product selects for them (`_selected`: keys,
    the merged cutoff, each shard's choice), checked against the properties and against the
    reference `_choose`, however the shards are cut."""
    names = sorted(srcs)
    raw = [data.draw(st.floats(0.05, 1.0)) for _ in names]
    weights = {s: w / sum(raw) for s, w in zip(names, raw, strict=True)}
    avail = {s: sum(t) for s, t in srcs.items()}
    target = data.draw(st.integers(1, 3 * sum(avail.values())))
    max_ep = data.draw(st.sampled_from([None, 1.0, 2.0, 2.5]))
    b = budget.budget(avail, weights, target, {s: max_ep for s in names}, "renormalize")
    for s in names:
        tokens = srcs[s]
        ids = [f"{s}{i}" for i in range(len(tokens))]
        rows = _selected(ids, tokens, b[s]["target"], 7, s, data.draw(st.integers(0, len(ids))))
        assert sorted(rows) == sorted(_choose(ids, tokens, b[s]["target"], 7, s))  # the reference's rows, whatever the cut
        got = sum(tokens[int(i[1:])] for i, _ in rows)
        # targets met within one document
        assert b[s]["target"] <= got < b[s]["target"] + max(tokens) or b[s]["target"] == 0
        # no document beyond max_epochs
        if max_ep is not None:
            assert max(e for _, e in rows) + 1 <= math.ceil(max_ep) if rows else True
            assert got < max_ep * avail[s] + max(tokens)
        # every output document is a kept one, at most once per epoch
        assert set(i for i, _ in rows) <= set(ids) and len(set(rows)) == len(rows)
    if not any(v["capped"] for v in b.values()):
        assert abs(sum(v["target"] for v in b.values()) - target) <= len(names)


def test_shortfall_error_names_the_source_and_renormalize_caps_it():
    avail = {"big": 1000, "small": 100}
    with pytest.raises(RunError) as e:
        budget.budget(avail, {"big": 0.5, "small": 0.5}, 600, {"big": None, "small": 2.0}, "error")
    assert "small" in str(e.value) and "<- short" in str(e.value) and "3.00" in str(e.value)
    b = budget.budget(avail, {"big": 0.5, "small": 0.5}, 600, {"big": None, "small": 2.0}, "renormalize")
    assert b["small"]["target"] == 200 and b["small"]["capped"] and b["big"]["target"] == 400


# ---------------------------------------------------------------- through the CLI


@pytest.fixture(scope="module")
def corpus(wiki_texts, tmp_path_factory):
    d = tmp_path_factory.mktemp("mixdata")
    for name, lo, hi in (("big", 0, 3000), ("small", 3000, 3200)):
        with open(d / f"{name}.jsonl", "w") as f:
            for i, t in enumerate(wiki_texts[lo:hi]):
                f.write(json.dumps({"id": f"{name}{i:05d}", "text": t}) + "\n")
    return d


def _yaml(path, corpus, mixture: str, seed: int = 0):
    return write_yaml(path, f"""
        name: m
        seed: {seed}
        sources:
          big: {{paths: ["{corpus}/big.jsonl"], id_field: id, max_shard_bytes: 200000}}
          small: {{paths: ["{corpus}/small.jsonl"], id_field: id}}
        mixture:
          {mixture}
    """)


def _table(run):
    files = sorted(str(p) for p in (run / "mixture").glob("*.parquet"))
    return pads.dataset(files, format="parquet").to_table()


def test_upsampling_epochs_determinism_and_seed(ray_local, corpus, tmp_path):
    """In-process runs on the session's Ray (worker-count invariance of the bytes is shown on
    the demo, which upsamples web, by tests/pipeline/engine/test_cluster.py)."""
    from pipeline import config
    from pipeline.run import runner

    # small has ~1/15 of big's tokens: a 0.3 share of a 166k-token mixture needs ~2.5 epochs of it
    spec = "target_tokens: 166000\n          weights: {big: 0.7, small: 0.3}\n          max_epochs: 3\n          shard_tokens: 40000"
    y = _yaml(tmp_path / "a.yaml", corpus, spec)
    runner.run(config.load(y), output=str(tmp_path / "w2"), log=lambda m: None, quiet=True)
    m1 = atomic.read_json(tmp_path / "w2" / "m" / "manifest.json")
    assert len(m1["files"]) >= 4
    small = m1["sources"]["small"]
    assert 2.0 < small["epochs"] < 3.0 and small["docs_repeated"] > 0
    t = _table(tmp_path / "w2" / "m")
    counts: dict[str, int] = {}
    for s, i in zip(t.column("source").to_pylist(), t.column("id").to_pylist(), strict=True):
        if s == "small":
            counts[i] = counts.get(i, 0) + 1
    assert set(counts.values()) == {2, 3}
    epochs = {e for s, e in zip(t.column("source").to_pylist(), t.column("epoch").to_pylist(), strict=True) if s == "small"}
    assert epochs == {0, 1, 2}
    for s, w in (("big", 0.7), ("small", 0.3)):
        assert abs(m1["sources"][s]["realized_weight"] - w) <= 0.005
    # another seed: another order and another selection of big
    y3 = _yaml(tmp_path / "c.yaml", corpus, spec, seed=1)
    runner.run(config.load(y3), output=str(tmp_path / "s1"), log=lambda m: None, quiet=True)
    t3 = _table(tmp_path / "s1" / "m")
    assert t3.column("id").to_pylist()[:50] != t.column("id").to_pylist()[:50]
    big = lambda tb: {i for s, i in zip(tb.column("source").to_pylist(), tb.column("id").to_pylist(), strict=True) if s == "big"}  # noqa: E731
    assert big(t3) != big(t)


def test_shortfall_stops_before_writing_or_renormalizes(ray_local, corpus, tmp_path, joined):
    from pipeline import config
    from pipeline.run import runner

    spec = "target_tokens: 166000\n          weights: {big: 0.7, small: 0.3}\n          max_epochs: 2"
    y = _yaml(tmp_path / "e.yaml", corpus, spec + "\n          on_shortfall: error")
    r = curate("run", str(y), "--output", str(tmp_path / "e"), env=joined)
    assert r.returncode == 1
    assert "not enough tokens for the weights within max_epochs; nothing was written" in r.stderr
    assert "small" in r.stderr and "<- short" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "e" / "m" / "mixture").exists() and not (tmp_path / "e" / "m" / "manifest.json").exists()
    # the user's next step: the same file with on_shortfall edited, run again (in process); only the mix reruns
    y = _yaml(tmp_path / "e.yaml", corpus, spec + "\n          on_shortfall: renormalize")
    runner.run(config.load(y), output=str(tmp_path / "e"), log=lambda m: None, quiet=True)
    steps = atomic.read_json(tmp_path / "e" / "m" / "run.json")["steps"]
    # (an id index the failed run stopped before finishing completes now: nothing depends on it)
    ran = {k for k, v in steps.items() if v["status"] == "SUCCESS" and not k.startswith("id-index-")}
    assert ran == {"mix-budget", "mix-priority", "mix-select", "mix-route", "mix-route-merge", "mix", "samples-pick", "samples"}
    m = atomic.read_json(tmp_path / "e" / "m" / "manifest.json")["sources"]
    assert m["small"]["capped"] and 1.9 < m["small"]["epochs"] <= 2.0 + 1e-9 + 300 / m["small"]["available_tokens"]
    assert m["small"]["realized_weight"] < 0.3 - 0.01 and m["big"]["realized_weight"] > 0.7 + 0.01


def test_sample_rates_take_a_multiple_of_each_cells_tokens(ray_local, corpus, tmp_path):
    """Dolma's sample rates: 2.5 repeats every document 2.5 times, 0.4 takes the first 40% in
    priority order; the mixture's size is their sum."""
    from pipeline import config
    from pipeline.run import runner

    y = _yaml(tmp_path / "r.yaml", corpus, "sample_rates: {big: 0.4, small: 2.5}\n          shard_tokens: 40000")
    runner.run(config.load(y), output=str(tmp_path / "r"), log=lambda m: None, quiet=True)
    man = atomic.read_json(tmp_path / "r" / "m" / "manifest.json")
    t = _table(tmp_path / "r" / "m")
    biggest = max(t.column("n_tokens").to_pylist())
    for cell, rate in (("big", 0.4), ("small", 2.5)):
        c = man["cells"][cell]
        assert c["target_tokens"] == round(rate * c["available_tokens"])
        assert 0 <= c["tokens"] - c["target_tokens"] < biggest  # met within one document
        assert abs(c["epochs"] - rate) < biggest / c["available_tokens"]
    counts: dict[str, int] = {}
    for s, i in zip(t.column("source").to_pylist(), t.column("id").to_pylist(), strict=True):
        if s == "small":
            counts[i] = counts.get(i, 0) + 1
    assert set(counts.values()) == {2, 3} and len(counts) == man["cells"]["small"]["distinct_documents"]


@pytest.mark.parametrize("key,value,want", [
    ("sample_rates: {big: 1.0}\n          weights: {big: 1.0}", None, "give weights (token shares) or sample_rates"),
    ("sample_rates: {big: 1.0}\n          target_tokens: 1000", None, "sample_rates fix every cell's tokens"),
    ("sample_rates: {huge: 1.0}", None, "no source named huge"),
    ("weights: {big: 1.0}\n          simulate_target_tokens: 1000", None, "needs mixture.target_tokens"),
    ("weights: {big: 1.0}\n          target_tokens: 5000\n          simulate_target_tokens: 1000", None, "is below target_tokens"),
])
def test_bad_rates_and_simulation_are_refused(corpus, tmp_path, key, value, want):
    from pipeline import config
    from pipeline.errors import UsageError

    with pytest.raises(UsageError) as e:
        config.load(_yaml(tmp_path / "x.yaml", corpus, key))
    assert want in str(e.value)


def test_simulated_epoching_repeats_each_cell_as_the_full_mixture_would(ray_local, corpus, tmp_path):
    """A 60k-token mixture simulating a 600k one: small needs ~9 epochs at 600k (a 0.3 share
    of 600k over its ~20k tokens), so the small mixture draws each source from a pool of
    1/10 of its documents, repeated as often; the full mixture is run too and compared."""
    from pipeline import config
    from pipeline.run import runner

    common = "weights: {big: 0.7, small: 0.3}\n          max_epochs: 12\n          shard_tokens: 40000"
    yf = _yaml(tmp_path / "full.yaml", corpus, "target_tokens: 600000\n          " + common)
    runner.run(config.load(yf), output=str(tmp_path / "full"), log=lambda m: None, quiet=True)
    ys = _yaml(tmp_path / "sim.yaml", corpus, "target_tokens: 60000\n          simulate_target_tokens: 600000\n          " + common)
    runner.run(config.load(ys), output=str(tmp_path / "sim"), log=lambda m: None, quiet=True)
    full, sim = (atomic.read_json(tmp_path / d / "m" / "manifest.json") for d in ("full", "sim"))
    t = _table(tmp_path / "sim" / "m")
    biggest = max(t.column("n_tokens").to_pylist())
    sel = atomic.read_json(next((tmp_path / "sim" / "m").glob("steps/mix-select-*/_markers/part-00000.json")))
    for cell, w in (("big", 0.7), ("small", 0.3)):
        c = next(x for x in sel["sources"][cell]["cells"])
        pool = c["pool_tokens_chosen"]
        assert 0 <= pool - c["available"] * 60000 / 600000 < biggest  # the pool: a tenth of the source's tokens
        e_full = full["cells"][cell]["epochs"]
        e_sim = sim["cells"][cell]["tokens"] / pool  # the small mixture's epochs over its pool
        assert abs(e_sim - e_full) * pool < biggest, (cell, e_sim, e_full)  # the same epochs, within one document
        print(f"\n{cell}: full mixture {e_full:.4f} epochs, simulated {e_sim:.4f} over a pool of {pool:,} of "
              f"{c['available']:,} tokens ({c['pool_docs']} documents)")
        assert abs(sim["cells"][cell]["realized_weight"] - w) <= 0.01
    assert full["cells"]["small"]["epochs"] > 8
    # every small-mixture row comes from the pool, and the pool's documents are repeated 8-10 times
    counts: dict[str, int] = {}
    for s, i in zip(t.column("source").to_pylist(), t.column("id").to_pylist(), strict=True):
        if s == "small":
            counts[i] = counts.get(i, 0) + 1
    c = sel["sources"]["small"]["cells"][0]
    assert len(counts) == c["pool_docs"] and set(counts.values()) <= {c["whole_epochs"], c["whole_epochs"] + 1}


PHASES = """phases:
            - {name: pretrain, target_tokens: 40000, weights: {big: 0.8, small: 0.2}}
            - {name: anneal, target_tokens: 20000, weights: {big: 0.6, small: 0.4}}
          max_epochs: 4
          shard_tokens: 8000"""


def _phase_rows(run, name):
    return _table_of(sorted(str(p) for p in (run / "mixture" / name).glob("*.parquet")))


def _table_of(files):
    return pads.dataset(files, format="parquet").to_table()


@pytest.mark.parametrize("disjoint", [False, True])
def test_phases_meet_their_targets_and_disjoint_phases_share_no_document(ray_local, corpus, tmp_path, disjoint):
    from pipeline import config
    from pipeline.run import runner

    spec = PHASES + ("\n          disjoint: true" if disjoint else "")
    y = _yaml(tmp_path / "p.yaml", corpus, spec)
    shas = []
    for w in (1, 2):
        runner.run(config.load(y), workers=w, output=str(tmp_path / f"w{w}"), log=lambda m: None, quiet=True)
        man = atomic.read_json(tmp_path / f"w{w}" / "m" / "manifest.json")
        shas.append([(f["path"], f["sha256"]) for f in man["files"]])
    assert shas[0] == shas[1]  # the same bytes with 1 and 2 workers
    run = tmp_path / "w1" / "m"
    man = atomic.read_json(run / "manifest.json")
    assert set(man["phases"]) == {"pretrain", "anneal"} and not list((run / "mixture").glob("*.parquet"))
    ids = {}
    for name, target, weights in (("pretrain", 40000, {"big": 0.8, "small": 0.2}), ("anneal", 20000, {"big": 0.6, "small": 0.4})):
        t = _phase_rows(run, name)
        ph = man["phases"][name]
        assert [f["path"] for f in ph["files"]] == sorted(f"mixture/{name}/{p.name}" for p in (run / "mixture" / name).glob("*.parquet"))
        biggest = max(t.column("n_tokens").to_pylist())
        assert 0 <= ph["total_tokens"] - target < 2 * biggest and ph["total_tokens"] == sum(t.column("n_tokens").to_pylist())
        for cell, w in weights.items():
            c = ph["cells"][cell]
            assert 0 <= c["tokens"] - c["target_tokens"] < biggest and c["target_tokens"] == round(w * target)
        ids[name] = set(zip(t.column("source").to_pylist(), t.column("id").to_pylist(), strict=True))
    both = ids["pretrain"] & ids["anneal"]
    files = sorted(next((run / "steps").glob("mix-priority-*")).glob("keys/part-*.parquet"))  # one a shard, the cell a column
    keys = sorted({f"c{c}" for f in files for c in pq.read_table(f, columns=["cell"]).column("cell").to_pylist()})
    if disjoint:
        assert keys == ["c0", "c1"]  # each cell's order keyed once, by the first phase, and shared out (no c2, c3)
        assert not both
    else:
        assert keys == ["c0", "c1", "c2", "c3"]  # each phase its own priorities
        assert both  # small is in both phases (it is up-sampled in the anneal)
    led = atomic.read_json(run / "ledger.json")
    for s, e in led["sources"].items():
        assert e["conservation"] is True and e["kept"] == len({i for src, i in ids["pretrain"] | ids["anneal"] if src == s}), s
    rep = atomic.read_json(run / "report.json")  # the report has each phase's cells, as the manifest
    assert {k: v["cells"] for k, v in rep["phases"].items()} == {k: v["cells"] for k, v in man["phases"].items()}
    assert "<h2>Phase anneal</h2>" in (run / "report.html").read_text()


def test_disjoint_phases_that_would_repeat_a_document_stop_before_writing(corpus, tmp_path, joined):
    y = _yaml(tmp_path / "d.yaml", corpus, PHASES.replace("20000, weights: {big: 0.6, small: 0.4}",
                                                          "20000, weights: {big: 0.1, small: 0.9}") + "\n          disjoint: true")
    r = curate("run", str(y), "--output", str(tmp_path / "d"), env=joined)
    assert r.returncode == 1 and "disjoint phases would repeat documents; nothing was written" in r.stderr, r.stderr[-2000:]
    assert "small: the phases need" in r.stderr
    assert not (tmp_path / "d" / "m" / "mixture").exists()


def test_budget_edge_cases_found_in_review():
    # an empty weighted cell with no target_tokens is a shortfall, not an empty mixture
    with pytest.raises(RunError) as e:
        budget.budget({"a": 0, "b": 1000}, {"a": 0.2, "b": 0.8}, None, {"a": None, "b": None}, "error")
    short = [ln.split()[0] for ln in str(e.value).splitlines() if ln.endswith("<- short")]
    assert "a " in str(e.value) and "<- short" in str(e.value) and short == ["a"]  # a is the short row, b is not
    b = budget.budget({"a": 0, "b": 1000}, {"a": 0.2, "b": 0.8}, None, {"a": None, "b": None}, "renormalize")
    assert b["a"]["target"] == 0 and b["b"]["target"] == 1000  # b alone, once
    # a sample rate equal to max_epochs is not short, whatever the rounding of the total
    r = budget.cell_budget({"web": 1000, "books": 1001}, None, None, {"web": 2.0, "books": 2.0}, "error",
                        sample_rates={"web": 2.0, "books": 0.3505})
    assert r["web"]["target"] == 2000 and r["books"]["target"] == round(0.3505 * 1001) and not r["web"]["capped"]
    with pytest.raises(RunError, match="sample rates above max_epochs"):
        budget.cell_budget({"web": 1000}, None, None, {"web": 2.0}, "error", sample_rates={"web": 2.5})
    assert budget.cell_budget({"web": 1000}, None, None, {"web": 2.0}, "renormalize", sample_rates={"web": 2.5})["web"]["target"] == 2000
    # simulated epoching: a cell whose scaled target rounds to 0 gets no pool (and no cutoff to make)
    s = budget.cell_budget({"web": 10**7, "books": 100}, {"web": 0.9, "books": 0.1}, 10**5, {"web": 4, "books": 4}, "renormalize",
                        simulate=10**8)
    assert s["books"]["target"] == 0 and s["books"]["pool_tokens"] == 0 and budget.key_epoch(s["books"], 100) is None


def test_disjoint_phases_where_a_phase_leaves_a_cell_out(ray_local, corpus, tmp_path):
    """The first phase gives small no weight: the second still gets its range of small's order."""
    from pipeline import config
    from pipeline.run import runner

    spec = PHASES.replace("weights: {big: 0.8, small: 0.2}", "weights: {big: 1.0, small: 0.0}") + "\n          disjoint: true"
    runner.run(config.load(_yaml(tmp_path / "z.yaml", corpus, spec)), output=str(tmp_path / "z"), log=lambda m: None, quiet=True)
    man = atomic.read_json(tmp_path / "z" / "m" / "manifest.json")
    assert man["phases"]["pretrain"]["cells"]["small"]["tokens"] == 0
    c = man["phases"]["anneal"]["cells"]["small"]
    assert 0 <= c["tokens"] - c["target_tokens"] < 2000 and c["target_tokens"] == 8000
