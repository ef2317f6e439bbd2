"""`curate publish` and the YAML's `publish:` section: a folder `datasets.load_dataset(DIR)`
loads as it is, whose card `huggingface_hub` parses, whose figures are the run's own
(checked field by field against ledger.json, manifest.json, report.json and eval.json), and
whose train files are copies of the mixture's files, byte for byte. What the folder leaves
out of the run's samples and validation split: test_publish_content.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.io import atomic
from pipeline.views.card import tokens_after_filters
from tests.conftest import curate


def _num(v: str):
    v = v.strip().replace("\\|", "|")
    if re.fullmatch(r"-?[\d,]+", v):
        return int(v.replace(",", ""))
    if re.fullmatch(r"-?\d+\.\d+(e-?\d+)?", v):
        return float(v)
    return {"true": True, "false": False, "–": None}.get(v, v)


def tables(card: str) -> dict[str, list[list[dict]]]:
    """Section heading -> its markdown tables, each a list of rows (header -> value)."""
    out: dict[str, list] = {}
    section = None
    lines = card.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = line[3:].strip()
        if line.startswith("| ") and i + 1 < len(lines) and lines[i + 1].startswith("| ---") or \
                line.startswith("| ") and i + 1 < len(lines) and lines[i + 1].startswith("|---") or \
                line.startswith("| ") and i + 1 < len(lines) and re.match(r"^\|( -+:? \|)+$", lines[i + 1]):
            head = [h.strip() for h in line.strip("|").split(" | ")]
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("| "):
                cells = [c for c in re.split(r"(?<!\\)\|", lines[i].strip()[1:-1])]
                rows.append({h: _num(c) for h, c in zip(head, cells, strict=True)})
                i += 1
            out.setdefault(section, []).append(rows)
            continue
        i += 1
    return out


def _load(folder: Path, tmp_path: Path):
    """datasets.load_dataset(folder) in a fresh process, offline, with its own cache."""
    code = ("import datasets, json, sys; d = datasets.load_dataset(sys.argv[1]); "
            "print(json.dumps({s: {'rows': d[s].num_rows, 'columns': d[s].column_names, 'ids': d[s]['id'][:50]} for s in d}))")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    r = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    import json

    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_published_run_loads_with_datasets_and_its_card_is_the_runs_figures(demo_run, tmp_path):
    out = tmp_path / "hub"
    r = curate("publish", str(demo_run), str(out), "--license", "odc-by", "--pretty-name", "Demo mixture")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == str(out / "README.md")
    man = atomic.read_json(demo_run / "manifest.json")
    led = atomic.read_json(demo_run / "ledger.json")
    rep = atomic.read_json(demo_run / "report.json")
    files = atomic.read_json(out / "curate" / "files.json")["files"]

    # datasets.load_dataset(DIR) with no other argument: train with the mixture's rows; no validation split, since the
    # demo's holds only its eval source's documents, which are not published (test_publish_content.py)
    loaded = _load(out, tmp_path)
    assert loaded["train"]["rows"] == man["total_docs"] and "validation" not in loaded
    assert [v["role"] for v in man["validation"].values()] == ["eval"]
    assert loaded["train"]["columns"] == pq.read_schema(demo_run / man["files"][0]["path"]).names
    first = pq.read_table(demo_run / man["files"][0]["path"], columns=["id"]).column("id").to_pylist()[:50]
    assert loaded["train"]["ids"] == first  # the files in order, rows in order

    # the card parses as the hub reads it, with the keys it needs
    from huggingface_hub import DatasetCard

    card = DatasetCard.load(out / "README.md")
    data = card.data.to_dict()
    for key in ("configs", "license", "language", "size_categories", "task_categories", "pretty_name", "tags"):
        assert key in data, key
    assert data["license"] == "odc-by" and "license_name" not in data and data["pretty_name"] == "Demo mixture"
    assert data["task_categories"] == ["text-generation"] and data["size_categories"] == ["1K<n<10K"]
    assert data["configs"] == [{"config_name": "default", "data_files": [{"split": "train", "path": "data/train-*"}]}]
    assert data["language"] == ["en"] and {"curate", "pretraining"} <= set(data["tags"])
    # what the hub checks: lower-case license and ISO 639 language codes, lists where it wants lists
    assert re.fullmatch(r"[a-z0-9][a-z0-9.+-]*", data["license"]) and all(re.fullmatch(r"[a-z]{2,3}", x) for x in data["language"])
    assert all(isinstance(data[k], list) for k in ("language", "size_categories", "task_categories", "tags", "configs"))

    # every data file: train files are the mixture's bytes (sha256 = the manifest's), copies: never the run's inode
    train = [f for f in files if f["split"] == "train"]
    assert [f["from"] for f in train] == [f["path"] for f in man["files"]]
    from pipeline.io.atomic import file_digest

    def sha256(p):
        return file_digest(p)[1]

    for f, m in zip(train, man["files"], strict=True):
        assert sha256(out / f["path"]) == m["sha256"] == f["sha256"]
        assert not os.path.samefile(out / f["path"], demo_run / m["path"])
        assert pq.ParquetFile(out / f["path"]).metadata.num_rows == m["rows"]
    assert [f for f in files if f["split"] != "train"] == []

    # every figure of the card is the run's
    md = (out / "README.md").read_text()
    t = tables(md)
    src_rows = {r["source"]: r for r in t["Sources"][0]}
    assert set(src_rows) == set(led["sources"])
    for s, e in led["sources"].items():
        r = src_rows[s]
        assert (r["documents in"], r["kept"], r["removed"], r["quarantined"]) == (e["in"], e["kept"], e["removed_total"], e["quarantined"])
        assert r["tokens after filters"] == tokens_after_filters(e) and r["tokens after filters"] > 0
        assert r["tokens in the mixture"] == (man["sources"].get(s) or {}).get("realized_tokens", 0)
    removals = {(r["source"], r["stage"], r["reason"]): r["documents"] for r in t["Filters and removals"][0]}
    assert removals == {(s, st, rs): n for s, e in led["sources"].items() for st, v in e["removed"].items() for rs, n in v.items()}
    changed = {(r["source"], r["stage"], r["change"]): r["count"] for r in t["Filters and removals"][1]}
    from pipeline.views import report

    want = {(s, st, k): n for s, e in led["sources"].items() for st, v in report._rewritten(e["stages"]).items() for k, n in v.items()}
    assert changed == want and ("web", "dedup:paragraph", "paragraphs_cut") in want and ("web", "filter:redact_pii", "emails") in want
    dedup = {(r["source"], r["stage"]): r["documents removed"] for r in t["Deduplication"][0]}
    assert dedup == {(s, st): sum(v.values()) for s, e in led["sources"].items() for st, v in e["removed"].items() if st.startswith("dedup:")}
    mix = {r["source"]: r for r in t["Mixture"][0]}
    assert set(mix) == {s for s, v in man["sources"].items() if v}
    for s, r in mix.items():
        v = man["sources"][s]
        assert (r["target weight"], r["realised weight"], r["target tokens"], r["tokens"], r["rows"], r["distinct documents"], r["epochs"]) \
            == (v["weight"], v["realized_weight"], v["target_tokens"], v["realized_tokens"], v["docs"], v["distinct_docs"], v["epochs"])
    cells = {r["cell"]: r for r in t["Mixture"][1]}
    assert set(cells) == set(man["cells"])
    for k, r in cells.items():
        v = man["cells"][k]
        assert (r["target weight"], r["realised weight"], r["tokens"], r["rows"], r["epochs"]) == \
            (v["target_weight"], v["realized_weight"], v["tokens"], v["documents"], v["epochs"])
    ev = atomic.read_json(demo_run / atomic.read_json(demo_run / "run.json")["steps"]["classify-wiki_vs_web-train"]["dir"] / "eval.json")
    cl = t["Classifiers"][0][0]
    assert (cl["ROC AUC"], cl["F1 at 0.5"], cl["precision"], cl["recall"]) == (ev["roc_auc"], ev["f1"], ev["precision"], ev["recall"])
    assert cl["train examples (pos + neg)"] == f"{ev['examples']['train']['positive']:,} + {ev['examples']['train']['negative']:,}"
    assert "Validation split" not in t and "Not published: the validation documents of `humaneval`, eval items" in md
    con = {r["eval set"]: r for r in t["Contamination"][0]}
    assert {k: (r["items"], r["items found in the corpus"], r["share"]) for k, r in con.items()} == \
        {k: (v["items"], v["items_found"], v["share_found"]) for k, v in rep["contamination"]["eval_sets"].items()}
    by_source = {(r["source"], r["eval set"]): r["documents removed"] for r in t["Contamination"][1]}
    assert by_source == {(s, es): v["documents"] for s, sets in rep["contamination"]["by_source"].items() for es, v in sets.items()}
    assert [(r["file"], r["rows"], r["sha256"]) for r in t["Files"][0]] == [(f["path"], f["rows"], f["sha256"]) for f in files]
    steps = {r["step"]: (r["hash"], r["computed in this run"]) for r in t["How it was made"][0]}
    rec = atomic.read_json(demo_run / "run.json")
    assert steps == {k: (v["hash"], v.get("computed", 0)) for k, v in rec["steps"].items()}
    assert f"{man['total_docs']:,} rows" in md and f"{man['total_tokens']:,} tokens" in md and f"Curate {rec['curate_version']}, commit `{rec['curate_commit'].removesuffix('+dirty')}`" in md
    # the configuration the run used, and links that resolve inside the folder
    assert "```yaml" in md and (out / "curate" / "mixture.yaml").read_text() in md
    for link in re.findall(r"\]\(([^)#]+)\)", md):
        assert (out / link).exists(), link
    # the languages: the lang column of the mixture files, rows without one named
    import pyarrow.compute as pc

    lang = pc.value_counts(pq.read_table([demo_run / f["path"] for f in man["files"]], columns=["lang"]).column("lang").drop_null()).to_pylist()
    assert lang and all(f"{v['values']} {v['counts']:,} rows" in md for v in lang)


def test_the_yaml_publish_section_publishes_at_the_end_of_the_run_and_says_what_it_does_not_know(demo_run, demo_run_yaml):
    out = demo_run_yaml.parent / "published" / "demo"  # conftest points the demo's `publish.dir` here ({name}: demo)
    card = (out / "README.md").read_text()
    from huggingface_hub import DatasetCard

    data = DatasetCard.load(out / "README.md").data.to_dict()
    assert data["license"] == "other" and data["license_name"] == "not-stated" and data["pretty_name"] == "Curate demo mixture"
    assert "**License**: the configuration gives none" in card
    assert re.search(r"\*\*Languages\*\*: from language ID on `wiki`, `web`|\*\*Languages\*\*: from language ID on `web`, `wiki`", card)
    man = atomic.read_json(demo_run / "manifest.json")  # the rows without a language: null `lang` in the mixture files
    unknown = pq.read_table([demo_run / f["path"] for f in man["files"]], columns=["lang"]).column("lang").null_count
    assert unknown > 0 and f"; {unknown:,} of {man['total_docs']:,} rows come from sources without language ID" in card
    # the mixture file as written, comments and all (it still gives the run's configuration hash)
    assert "The mixture file as written" in card and "# at the end of each run" in card


def test_publish_refuses_what_it_should_and_replaces_its_own_folder(demo_run, tmp_path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    r = curate("publish", str(demo_run), str(foreign))
    assert r.returncode == 2 and "was not written by `curate publish`" in r.stderr and "Traceback" not in r.stderr
    assert (foreign / "notes.txt").read_text() == "mine"
    r = curate("publish", str(tmp_path), str(tmp_path / "x"))
    assert r.returncode == 2 and "is not a run directory (no run.json)" in r.stderr
    r = curate("publish", str(demo_run), str(demo_run / "hub"))
    assert r.returncode == 2 and "inside the run directory" in r.stderr
    r = curate("publish", str(demo_run), str(tmp_path / "y"), "--license", "MIT")
    assert r.returncode == 2 and "lower case, e.g. apache-2.0" in r.stderr
    # a run directory named by URL (an object store's, here file://) publishes the same files
    r = curate("publish", demo_run.as_uri(), str(tmp_path / "remote"))
    assert r.returncode == 0, r.stderr[-2000:]
    def listing(d):
        return sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file())

    kept = [p for p in listing(demo_run / "samples") if p.endswith("/kept.jsonl") and not p.startswith("humaneval/")]
    assert listing(tmp_path / "remote" / "samples") == sorted(kept + ["index.html"]) and kept
    out = tmp_path / "hub"
    assert curate("publish", str(demo_run), str(out), "--include", "removed_samples").returncode == 0
    assert (out / "samples" / "web" / "removed.jsonl").exists()
    r = curate("publish", str(demo_run), str(out), "--copy", "--license", "cc-by-4.0")  # --copy: still accepted
    assert r.returncode == 0, r.stderr
    assert not (out / "samples" / "web" / "removed.jsonl").exists()  # replaced whole
    copied = [f for f in atomic.read_json(out / "curate" / "files.json")["files"] if f["split"] == "train"]
    assert copied and not any(os.path.samefile(out / f["path"], demo_run / f["from"]) for f in copied)  # no links
    from pipeline.io.atomic import file_digest

    assert all(file_digest(out / f["path"])[1] == f["from_sha256"] for f in copied)  # the copies' own bytes
    assert "license: cc-by-4.0" in (out / "README.md").read_text()



def test_publish_over_another_runs_folder_needs_replace_and_waits_for_no_run(demo_run, tmp_path):
    """Issue 51, item 7: a folder another run published (two mixtures, one `publish.dir`) is
    refused unless --replace; a run directory a run is writing is not published meanwhile."""
    from pipeline.engine.lease import Leases

    out = tmp_path / "shared"
    assert curate("publish", str(demo_run), str(out)).returncode == 0
    mark = atomic.read_json(out / "curate" / "files.json")
    (out / "curate" / "files.json").unlink()
    atomic.write_json(out / "curate" / "files.json", {**mark, "run": "another-mixture"})
    r = curate("publish", str(demo_run), str(out))
    assert r.returncode == 2 and "holds run another-mixture's published dataset" in r.stderr and "--replace" in r.stderr
    assert atomic.read_json(out / "curate" / "files.json")["run"] == "another-mixture"  # untouched
    assert curate("publish", str(demo_run), str(out), "--replace").returncode == 0
    assert atomic.read_json(out / "curate" / "files.json")["run"] == mark["run"]
    leases = Leases(name="a-run")
    assert leases.acquire(demo_run / "_lease") is None
    try:
        r = curate("publish", str(demo_run), str(tmp_path / "during"))
        assert r.returncode == 2 and "is being written by a run" in r.stderr, r.stderr
        assert not (tmp_path / "during").exists()
    finally:
        leases.release_all()


def test_a_bad_publish_section_names_the_key(tmp_path):
    y = tmp_path / "m.yaml"
    y.write_text("name: m\nsources:\n  a: {paths: [a.jsonl]}\npublish: {dir: s3://bucket/x, licence: mit}\n")
    (tmp_path / "a.jsonl").write_text('{"text": "hello"}\n')
    r = curate("validate", str(y))
    assert r.returncode == 2 and "publish" in r.stderr and "licence" in r.stderr, r.stderr


def test_phases_publish_one_config_each_with_the_held_out_validation(wiki_texts, tmp_path, joined):
    from tests.conftest import write_jsonl, write_yaml

    write_jsonl(tmp_path / "big.jsonl", [{"id": f"b{i}", "text": t} for i, t in enumerate(wiki_texts[:400])])
    write_jsonl(tmp_path / "small.jsonl", [{"id": f"s{i}", "text": t} for i, t in enumerate(wiki_texts[400:500])])
    y = write_yaml(tmp_path / "p.yaml", """
        name: p
        sources:
          big: {paths: [big.jsonl], id_field: id}
          small: {paths: [small.jsonl], id_field: id}
        mixture:
          phases:
            - {name: pretrain, target_tokens: 20000, weights: {big: 0.8, small: 0.2}}
            - {name: anneal, target_tokens: 8000, weights: {big: 0.5, small: 0.5}}
          max_epochs: 4
          validation: {fraction: 0.05}
        publish: {dir: hub, license: cc-by-sa-4.0, tags: [wikipedia]}
    """)
    r = curate("run", str(y), "--output", str(tmp_path / "out"), env=joined)
    assert r.returncode == 0, r.stderr[-3000:]
    man = atomic.read_json(tmp_path / "out" / "p" / "manifest.json")
    out = tmp_path / "hub"
    from huggingface_hub import DatasetCard

    data = DatasetCard.load(out / "README.md").data.to_dict()
    assert [c["config_name"] for c in data["configs"]] == ["pretrain", "anneal"] and data["configs"][0]["default"] is True
    assert data["configs"][1]["data_files"][0] == {"split": "train", "path": "data/anneal/train-*"}
    assert data["license"] == "cc-by-sa-4.0" and "wikipedia" in data["tags"] and "language" not in data  # no language ID
    loaded = _load(out, tmp_path)  # the default config: the first phase
    assert loaded["train"]["rows"] == man["phases"]["pretrain"]["total_docs"]
    assert loaded["validation"]["rows"] == sum(v["docs"] for v in man["validation"].values()) > 0
    files = atomic.read_json(out / "curate" / "files.json")["files"]
    for name, ph in man["phases"].items():
        mine = [f for f in files if f["path"].startswith(f"data/{name}/")]
        assert [f["sha256"] for f in mine] == [f["sha256"] for f in ph["files"]]
    card = (out / "README.md").read_text()
    assert "Phase `anneal`" in card
    total = man["phases"]["pretrain"]["total_docs"]  # the YAML above names it
    assert f"**Languages**: from language ID on no source: none; {total:,} of {total:,} rows" in card


def test_card_parameters_are_those_set_away_from_defaults():
    """A filter's line in the card: its type and what the configuration changed, also for
    types with a required parameter (regex: its pattern, not every default)."""
    from pipeline.views import card

    assert card._params({"type": "regex", "pattern": "x"}) == 'regex {pattern: "x"}'
    assert card._params({"type": "gopher_quality", "min_words": 80, "max_words": 100000}) == "gopher_quality {min_words: 80}"
    assert card._params({"type": "no_such_type", "a": 1}) == "no_such_type {a: 1}"


def test_languages_of_a_run_whose_manifest_has_none_are_counted_from_the_files(tmp_path):
    """A mix step cached by an older Curate has no `languages` in the manifest: the card's
    counts then come from the files' `lang` column, the same as the mix tasks count."""
    from pipeline.views import publish

    pq.write_table(pa.table({"lang": ["en", "fr", None, "en"]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"lang": ["en"]}), tmp_path / "b.parquet")
    files = [{"path": "a.parquet"}, {"path": "b.parquet", "languages": {"de": 2}}]
    assert publish._languages(files, tmp_path) == ({"en": 2, "de": 2, "fr": 1}, 1)


def test_the_published_folder_holds_nothing_of_the_machine(demo_run, tmp_path):
    """Issue 51, item 12: curate/run.json without host, store, Ray address or the mixture
    file's absolute path; no file of the folder names an absolute path of this machine (the
    run directory, the store, the mixture file's folder); a URL's credentials are cut
    wherever Curate writes one."""
    from pipeline.io import redact

    record = atomic.read_json(demo_run / "run.json")
    out = tmp_path / "pub"
    assert curate("publish", str(demo_run), str(out)).returncode == 0
    run = atomic.read_json(out / "curate" / "run.json")
    assert not {"host", "store", "ray_address"} & set(run) and run["mixture_file"] == Path(record["mixture_file"]).name
    places = {str(demo_run.resolve()), str(Path(record["store"]).resolve()), str(Path(record["mixture_file"]).resolve().parent)}
    for p in out.rglob("*"):
        if p.is_file() and p.suffix in (".json", ".md", ".yaml", ".jsonl", ".html"):
            text = p.read_text(errors="replace")
            assert not [x for x in places if x in text], (p, [x for x in places if x in text])
    assert redact.secrets("s3://AKIA123:abc/def+g@bucket/store") == "s3://bucket/store"
    assert redact.secrets("https://hf.co/x?token=hf_abc&rev=1") == "https://hf.co/x?token=***&rev=1"
    assert redact.portable_secrets({"paths": ["gs://u:p@b/*.jsonl"]}) == {"paths": ["gs://b/*.jsonl"]}
