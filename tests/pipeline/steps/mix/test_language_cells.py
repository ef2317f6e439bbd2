"""Languages as mixture cells: `mixture.weights` keys `source/lang=<code>` (and `lang=other`),
from the language the source's chain detects. One source holding the demo corpus's Spanish,
French and English summaries, weighted by language: the realised token shares are the
weights within 0.005, the bytes are the same with 1 and 2 workers, the manifest names each
cell's language, `explain` names a document's language cell, and what cannot be a language
cell is a config error naming the key."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.io import atomic
from tests.conftest import curate, mixture_shas, write_yaml

WEIGHTS = "{wiki/lang=fr: 0.5, wiki/lang=es: 0.3, wiki/lang=en: 0.2}"


def _yaml(corpus, out, weights: str = WEIGHTS, chain: str = "[lid, gq]") -> str:
    return f"""
name: langs
output: {out}
tokenizer: gpt2
sources:
  wiki:
    paths: ["{corpus}/wiki/summaries_es.parquet", "{corpus}/wiki/summaries_fr.parquet", "{corpus}/wiki/summaries_en.parquet"]
    id_field: id
    max_shard_rows: 4000
    filters: {chain}
filters:
  lid: {{type: language, label_only: true}}
  gq: {{type: gopher_quality, per_language: fineweb2, min_words: 20}}
mixture:
  target_tokens: 400000
  weights: {weights}
  shard_tokens: 100000
"""


@pytest.fixture(scope="module")
def runs(demo_corpus, tmp_path_factory, joined, joined_1cpu):
    """1 and 2 workers, each on a Ray of the session with as many CPUs (tests/conftest.py `joined`)."""
    d = tmp_path_factory.mktemp("langcells")
    out = {}
    for w, env in ((1, joined_1cpu), (2, joined)):
        y = write_yaml(d / f"w{w}.yaml", _yaml(demo_corpus, d / f"out{w}"))
        r = curate("run", str(y), "--workers", str(w), env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        out[w] = d / f"out{w}" / "langs"
    return out


def test_language_weights_are_realised_and_the_bytes_do_not_depend_on_the_workers(runs):
    m = atomic.read_json(runs[1] / "manifest.json")
    want = {"wiki/lang=fr": 0.5, "wiki/lang=es": 0.3, "wiki/lang=en": 0.2, "wiki/lang=other": 0.0}
    assert set(m["cells"]) == set(want)
    for cell, w in want.items():
        assert abs(m["cells"][cell]["realized_weight"] - w) <= 0.005, (cell, m["cells"][cell])
        assert m["cells"][cell]["lang"] == cell.split("=")[1]
    # the mixture's own lang column agrees: each document's detected language is its cell's
    tokens: dict[str, int] = {}
    for p in sorted((runs[1] / "mixture").glob("part-*.parquet")):
        t = pq.read_table(p, columns=["lang", "n_tokens"])
        for lang, n in zip(t.column("lang").to_pylist(), t.column("n_tokens").to_pylist()):
            tokens[lang] = tokens.get(lang, 0) + n
    total = sum(tokens.values())
    assert {k: round(v / total, 2) for k, v in tokens.items()} == {"fr": 0.5, "es": 0.3, "en": 0.2}
    assert mixture_shas(runs[1]) == mixture_shas(runs[2])


def test_explain_names_the_language_cell(runs):
    t = pq.read_table(sorted((runs[1] / "mixture").glob("part-*.parquet"))[0], columns=["id", "lang"])
    doc, lang = t.column("id")[0].as_py(), t.column("lang")[0].as_py()
    r = subprocess.run([sys.executable, "-m", "pipeline", "explain", str(runs[1]), "--id", doc, "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)[0]
    assert info["cell"] == f"wiki/lang={lang}" and info["status"] == "kept"


@pytest.mark.parametrize("weights, chain, says", [
    ("{wiki/lang=fr: 0.5, wiki/lang=es: 0.5}", "[gq2]", "names a language, but wiki's filters have no language filter"),
    ("{wiki/lang=fr: 0.5, wiki: 0.5}", "[lid, gq]", "give every weight key of wiki a language"),
    ("{wiki/lang=fr/code: 1.0}", "[lid, gq]", "names a topic, but source wiki has no topic classifier"),
    ("{wiki/lang=fr: 0.5, wiki/lang=fr: 0.5}", "[lid, gq]", None),
])
def test_what_cannot_be_a_language_cell_is_a_config_error(tmp_path, demo_corpus, weights, chain, says):
    text = _yaml(demo_corpus, tmp_path / "out", weights, chain).replace(
        "  gq: {", "  gq2: {type: gopher_quality}\n  gq: {")
    r = curate("plan", str(write_yaml(tmp_path / "x.yaml", text)))
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    if says:
        assert says in r.stderr, r.stderr


def test_explain_names_the_language_and_thresholds_that_removed_a_document(runs):
    rj = atomic.read_json(runs[1] / "run.json")
    d = runs[1].parent / "_store" / "steps" / rj["steps"]["filter-wiki"]["dir"].split("/")[-1]
    t = pa.concat_tables([pq.read_table(p, columns=["id", "reason"]) for p in sorted(d.glob("part-*.parquet"))])
    doc, reason = next((i, r) for i, r in zip(t.column("id").to_pylist(), t.column("reason").to_pylist())
                       if r and r.endswith(":fr"))
    r = subprocess.run([sys.executable, "-m", "pipeline", "explain", str(runs[1]), "--id", doc, "--json"],
                       capture_output=True, text=True)
    rule = json.loads(r.stdout)[0]["removed_by"]["language_rule"]
    assert rule["language"] == "fr" and rule["parameters"]["min_alpha_words_ratio"] == 0.812  # FineWeb-2's fra_Latn
    assert "de" in rule["parameters"]["stop_words"] and rule["parameters"]["language"] == "fr"
    text = subprocess.run([sys.executable, "-m", "pipeline", "explain", str(runs[1]), "--id", doc],
                          capture_output=True, text=True).stdout
    assert f"removed at filter:gq: {reason}" in text and "by the rules of language fr: min_avg_word_length=2" in text


def test_the_report_counts_removals_by_the_language_whose_rules_removed_them(runs):
    rep = atomic.read_json(runs[1] / "report.json")["sources"]["wiki"]
    by = rep["removed_by_language"]
    assert {"fr", "es", "default"} <= set(by)
    led = atomic.read_json(runs[1] / "ledger.json")["sources"]["wiki"]["removed"]["filter:gq"]
    for lang, reasons in by.items():  # the ledger's reasons with that language, none lost
        assert reasons == {f"filter:gq {r.rsplit(':', 1)[0]}": n for r, n in led.items() if r.endswith(f":{lang}")}
    assert "Removals by the language whose rules removed them" in (runs[1] / "report.html").read_text()
