"""The ledger's sums of a layer step's markers (ledger.fold): one pass, per source, the same
counts the markers hold, whatever the order they come in; markers of no source count for
every source, and a generator is read once (the driver holds sums, not markers)."""

from __future__ import annotations

import random

from pipeline.shards import ledger


def _marker(rng: random.Random, source: str | None, rewrites: bool) -> dict:
    d_in = rng.randint(0, 50)
    d_out = rng.randint(0, d_in)
    m = {"docs_in": d_in, "docs_out": d_out, "chars_in": d_in * 100, "chars_out": d_out * 90, "tokens_in": d_in * 20,
         "tokens_out": d_out * 18, "removed": {r: 1 for r in rng.sample(["a", "b", "c"], rng.randint(0, 3))}}
    if rewrites:
        m.update({"paragraphs_cut": rng.randint(0, 5), "chars_cut": rng.randint(0, 500), "docs_rewritten": rng.randint(0, 3)})
    if source is not None:
        m["source"] = source
    return m


def test_fold_sums_each_sources_markers_and_those_of_no_source():
    rng = random.Random(3)
    markers = [_marker(rng, rng.choice(["web", "wiki"]), True) for _ in range(400)]
    once = iter(markers)  # a generator: read once
    folded = ledger.fold(once)
    for source in ("web", "wiki", "code"):
        mine = [m for m in markers if m["source"] == source]
        got = ledger.of_source(folded, source)
        for k in ledger.FLOWS:
            assert got[k] == sum(m[k] for m in mine), (source, k)
        want: dict = {}
        for m in mine:
            for r, n in m["removed"].items():
                want[r] = want.get(r, 0) + n
        assert got["removed"] == want
        assert got["extra"] == ({k: sum(m[k] for m in mine) for k in ledger.EXTRA} if mine else {})
    shuffled = markers[:]
    rng.shuffle(shuffled)
    assert ledger.of_source(ledger.fold(shuffled), "web") == ledger.of_source(folded, "web")
    # a step of one source: its markers carry no `source` and count for whichever source asks
    plain = [_marker(rng, None, False) for _ in range(10)]
    got = ledger.of_source(ledger.fold(plain), "web")
    assert got["docs_in"] == sum(m["docs_in"] for m in plain) and got["extra"] == {}
