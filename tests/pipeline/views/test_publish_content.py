"""What `curate publish` puts in a dataset folder, and what it never touches: by default no
text that the run removed, redacted or held out as an eval item (the demo corpus's planted
contacts, HumanEval's problems) in any file of the folder; `include` puts each kind back and
the card says so first. The folder replaces only a folder publish wrote, its data files are
copies of the run's checked against the manifest, and `replace_dir` leaves a user's
`<dest>.old` alone."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.io import atomic
from tests.conftest import curate

PHONE = r"\+1 \(555\) \d{3}-\d{4}|555-\d{3}-\d{4}|\+44 20 7946 \d{4}|\(555\) \d{3} \d{4}|\+49 30 \d{7}"  # demo_data.PHONES
CONTACT = re.compile(rf"[\w.]+@[\w-]+(?:\.[\w-]+)+|{PHONE}|203\.0\.113\.\d+")


@pytest.fixture(scope="module")
def planted(demo_corpus) -> dict[str, set[str]]:
    """Every e-mail address, phone number and IP address pipeline/demo_data.py planted into the
    crawl (the contact paragraph of each page it marks `planted: [contact]`), and the longest
    line of each of the eval source's items (HumanEval problems)."""
    import zstandard

    from pipeline import demo_data

    assert demo_data.PHONES == ["+1 (555) {a}-{b}", "555-{a}-{b}", "+44 20 7946 {b}", "(555) {a} {b}", "+49 30 {a}{b}"]
    contacts: set[str] = set()
    for f in sorted((demo_corpus / "web").glob("*.jsonl.zst")):
        with zstandard.open(f, "rt") as fh:
            for line in fh:
                page = json.loads(line)
                if "contact" in page.get("planted", ()):  # (a near copy's changed words may have hit the contact line)
                    contacts |= set(CONTACT.findall(page["text"]))
    evals = {max(json.loads(x)["text"].strip().splitlines(), key=len).strip()
             for x in (demo_corpus / "eval" / "humaneval.jsonl").read_text().splitlines()}
    assert len(contacts) > 50 and len(evals) > 150 and min(map(len, evals)) > 20  # two problems share their longest line
    return {"contacts": contacts, "evals": evals}


def _strings(p: Path) -> list[str]:
    """The text a file carries, decoded: a Parquet file's string cells, a JSON document's
    strings, an HTML page as a browser reads it and the JSON it embeds, any other file as text."""
    if p.suffix == ".parquet":
        t = pq.read_table(p)
        return [str(v) for c in t.columns for v in c.to_pylist() if v is not None]

    def leaves(x):
        if isinstance(x, dict):
            return [s for k, v in x.items() for s in [str(k), *leaves(v)]]
        if isinstance(x, list):
            return [s for v in x for s in leaves(v)]
        return [str(x)]

    raw = p.read_text()
    if p.suffix == ".jsonl":
        return [s for line in raw.splitlines() for s in leaves(json.loads(line))]
    if p.suffix == ".json":
        return leaves(json.loads(raw))
    if p.suffix == ".html":
        embedded = re.findall(r'<script type="application/json"[^>]*>(.*?)</script>', raw, re.S)
        return [raw, html.unescape(raw), *(s for e in embedded for s in leaves(json.loads(e)))]
    return [raw]


def found(folder: Path, needles: set[str]) -> dict[str, set[str]]:
    """file (relative) -> the needles it carries, over every file of the folder."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            text = "\n".join(_strings(p))
            hit = {n for n in needles if n in text}
            if hit:
                out[p.relative_to(folder).as_posix()] = hit
    return out


def test_a_published_folder_holds_no_planted_contact_and_no_eval_item(demo_run, demo_run_yaml, planted, tmp_path):
    # what makes the check worth doing: the run directory's own samples hold both
    in_run = found(demo_run / "samples", planted["contacts"] | planted["evals"])
    assert any(planted["contacts"] & v for v in in_run.values()) and any(planted["evals"] & v for v in in_run.values())
    out = tmp_path / "hub"
    r = curate("publish", str(demo_run), str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    for folder in (out, demo_run_yaml.parent / "published" / "demo"):  # and the one the YAML's publish section wrote
        assert found(folder, planted["contacts"]) == {}, folder
        assert found(folder, planted["evals"]) == {}, folder
        names = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
        assert not any(n.endswith("removed.jsonl") or n.startswith("samples/humaneval/") for n in names), names
        assert not any(n.startswith("data/validation-") for n in names)  # the demo's validation split: HumanEval only
        recs = [json.loads(x) for n in names if n.endswith(".jsonl") for x in (folder / n).read_text().splitlines()]
        assert recs and all(r["status"] == "kept" and "original" not in r for r in recs)
        assert "Not published: removed documents, texts as ingested" in (folder / "README.md").read_text()
    # the run directory's samples are what they were: the before/after view is the curator's
    assert any("original" in json.loads(x) for x in (demo_run / "samples" / "web" / "kept.jsonl").read_text().splitlines())


def _body_start(card: str) -> str:
    """The card's first lines: after the front matter, up to its first section."""
    return card.split("\n---\n", 1)[1].split("\n## ", 1)[0]


def test_including_a_kind_publishes_it_and_the_card_says_so_first(demo_run, planted, tmp_path):
    out = tmp_path / "all"
    r = curate("publish", str(demo_run), str(out), "--include", "removed_samples,original_texts,eval_items")
    assert r.returncode == 0, r.stderr[-3000:]
    contacts, evals = found(out, planted["contacts"]), found(out, planted["evals"])
    assert "samples/web/removed.jsonl" in contacts
    # the kept samples' texts before their rewrites (redacted contacts, cut paragraphs) are put back, each as
    # the run recorded it; whether a planted contact is among them depends on which 50 pages the sample drew
    run_kept, pub_kept = ([json.loads(x) for x in (d / "samples" / "web" / "kept.jsonl").read_text().splitlines()]
                          for d in (demo_run, out))
    assert sum("original" in r for r in run_kept) > 10
    assert [(r["id"], r.get("original")) for r in pub_kept] == [(r["id"], r.get("original")) for r in run_kept]
    drawn = any(CONTACT.search(r.get("original", "")) for r in run_kept)  # a redacted contact among them
    assert ("samples/web/kept.jsonl" in contacts) == drawn
    assert {"data/validation-00000-of-00001.parquet", "samples/humaneval/removed.jsonl", "samples/code/removed.jsonl"} <= set(evals)
    start = _body_start((out / "README.md").read_text())
    assert "publish.include: [removed_samples, original_texts, eval_items]" in start
    assert all(w in start for w in ("documents the run removed", "texts as ingested", "eval items"))
    assert atomic.read_json(out / "curate" / "files.json")["include"] == ["removed_samples", "original_texts", "eval_items"]
    # the eval source's validation rows, in the mixture's columns, and the card's table of them
    from tests.pipeline.views.test_publish import tables

    man = atomic.read_json(demo_run / "manifest.json")
    val = [f for f in atomic.read_json(out / "curate" / "files.json")["files"] if f["split"] == "validation"]
    assert [f["from"] for f in val] == [f["path"] for v in man["validation"].values() for f in v["files"]] != []
    for f in val:
        assert atomic.file_digest(out / f["path"])[1] == f["sha256"]
        src = pq.read_table(demo_run / f["from"], columns=["id", "text"])
        assert pq.read_table(out / f["path"], columns=["id", "text"]).equals(src)
    rows = {r["source"]: (r["documents"], r["tokens"]) for r in tables((out / "README.md").read_text())["Validation split"][0]}
    assert rows == {s: (v["docs"], v["tokens"]) for s, v in man["validation"].items()}

    # one kind alone (in the process, as the run's publish section calls it): only that kind
    from pipeline.views import publish

    one = publish.publish(demo_run, tmp_path / "one", include=["original_texts"])
    assert set(found(one, planted["contacts"])) == ({"samples/web/kept.jsonl", "samples/index.html"} if drawn else set())
    assert found(one, planted["evals"]) == {}
    start = _body_start((one / "README.md").read_text())
    assert "publish.include: [original_texts]" in start and "eval items" not in start and "removed" not in start

    # the YAML's publish.include is the default; --include none overrides it
    run = tmp_path / "run"
    shutil.copytree(demo_run, run, ignore=shutil.ignore_patterns("steps"), copy_function=os.link)
    rec = atomic.read_json(run / "run.json")
    rec["config"]["publish"] = {**(rec["config"].get("publish") or {}), "include": ["eval_items"]}
    atomic.write_json(run / "run.json", rec)  # a new file: the shared run's run.json is untouched
    assert curate("publish", str(run), str(tmp_path / "yaml")).returncode == 0
    assert "data/validation-00000-of-00001.parquet" in found(tmp_path / "yaml", planted["evals"])
    assert "publish.include: [eval_items]" in _body_start((tmp_path / "yaml" / "README.md").read_text())
    assert curate("publish", str(run), str(tmp_path / "yaml"), "--include", "none").returncode == 0
    assert found(tmp_path / "yaml", planted["evals"]) == {}
    r = curate("publish", str(run), str(tmp_path / "bad"), "--include", "originals")
    assert r.returncode == 2 and "originals" in r.stderr and "removed_samples, original_texts, eval_items" in r.stderr
    assert "Traceback" not in r.stderr


def test_replace_dir_keeps_a_users_old_folder(tmp_path):
    from pipeline.io import fs

    (tmp_path / "pub").mkdir()
    (tmp_path / "pub" / "a.txt").write_text("published")
    (tmp_path / "pub.old").mkdir()
    (tmp_path / "pub.old" / "backup.txt").write_text("mine")
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "b.txt").write_text("new")
    fs.replace_dir(tmp_path / "new", tmp_path / "pub")
    assert [p.name for p in (tmp_path / "pub").iterdir()] == ["b.txt"]
    assert (tmp_path / "pub.old" / "backup.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pub", "pub.old"]  # the aside name it made is gone


def test_publish_replaces_only_its_own_folder_and_copies_only_files_the_manifest_vouches_for(demo_run, tmp_path):
    out = tmp_path / "hub"
    assert curate("publish", str(demo_run), str(out)).returncode == 0
    files = [f for f in atomic.read_json(out / "curate" / "files.json")["files"] if f["split"] == "train"]
    assert files and not any(os.path.samefile(out / f["path"], demo_run / f["from"]) for f in files)  # copies, not links
    # a run written into the published folder afterwards: publishing there again would delete it
    shutil.copytree(demo_run, out / "demo", ignore=shutil.ignore_patterns("steps"), copy_function=os.link)
    r = curate("publish", str(demo_run), str(out))
    assert r.returncode == 2 and "demo/ (a run directory)" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert (out / "demo" / "run.json").exists()
    shutil.rmtree(out / "demo")
    (out / "notes.txt").write_text("mine")
    r = curate("publish", str(demo_run), str(out))
    assert r.returncode == 2 and "did not write: notes.txt" in r.stderr and (out / "notes.txt").read_text() == "mine"

    # a mixture file edited in place after the run (same size): refused, the file named; nothing half-written left
    run = tmp_path / "run"
    shutil.copytree(demo_run, run, ignore=shutil.ignore_patterns("steps"))  # bytes of its own: the shared run stays
    man = atomic.read_json(run / "manifest.json")
    victim = run / man["files"][1]["path"]
    with open(victim, "r+b") as f:
        f.seek(victim.stat().st_size // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))
    r = curate("publish", str(run), str(tmp_path / "edited"))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"{victim} was modified after the run" in r.stderr and "run the mixture again" in r.stderr
    assert not (tmp_path / "edited").exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
