"""`dedup.order: place` (issue 50): survivors by place, the first file in path order and then
the first row, as datatrove keeps them. With content ids (hashes), a page of a new dump wins
about half the clusters it joins under `order: id`, and every old shard it wins in changes;
by place, a dump whose files sort after the others changes no earlier decision.

The corpus: a web source of three JSONL files of real text (content ids: no id field) with
copies inside it, then a fourth file of exact copies, near copies and pages sharing a
boilerplate paragraph with the first three. Checked on real runs: the old shards' dedup
layers come out byte for byte as before the addition (every survivor is the old copy), the
run gives the bytes of a fresh run, and splitting the files into more shards changes no
decision."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.io import atomic
from tests.conftest import curate, write_yaml
from tests.pipeline.engine.test_reuse import _bytes

BOILER = "Subscribe to our newsletter for weekly updates on science, culture and the arts."
MIX = """
name: {name}
output: {out}
tokenizer: gpt2
sources:
  web: {{paths: ["{c}/web/*.jsonl"], max_shard_rows: {rows}}}
dedup:
  order: place
  exact: {{}}
  fuzzy: {{}}
  paragraph: {{min_chars: 50, max_occurrences: 3}}
mixture: {{target_tokens: 40000, weights: {{web: 1.0}}, shard_tokens: 20000}}
"""
KINDS = ("exact", "fuzzy", "paragraph")


def _edit(text: str, rng: random.Random, k: int = 2) -> str:
    words = text.split(" ")
    for _ in range(k):
        words[rng.randrange(len(words))] = f"zq{rng.randint(0, 10**6)}"
    return " ".join(words)


@pytest.fixture(scope="module")
def corpus(wiki_texts, tmp_path_factory) -> Path:
    rng = random.Random(11)
    texts = [t for t in wiki_texts if len(t.split()) >= 60]
    pages = ["\n\n".join(texts[3 * i: 3 * i + 3]) for i in range(420)]
    for i in range(0, 40, 5):  # a boilerplate paragraph in 8 old pages: max_occurrences 3 cuts it from 5
        pages[i] += "\n\n" + BOILER
    old = pages[:360] + [pages[10], _edit(pages[20], rng), pages[130]]  # copies inside the old files too
    c = tmp_path_factory.mktemp("order")
    (c / "web").mkdir()
    for k in range(3):
        _write(c / "web" / f"crawl-{k}.jsonl", old[k::3])
    new = [pages[i] for i in range(1, 300, 15)] + [_edit(pages[i], rng) for i in range(2, 300, 15)]
    new += [p + "\n\n" + BOILER for p in pages[360:380]] + pages[380:420]
    _write(c / "held.jsonl", new)
    return c


def _write(path: Path, texts: list[str]) -> None:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))


def _run(corpus: Path, out: Path, name: str, env: dict, rows: int = 50_000) -> Path:
    y = write_yaml(out.parent / f"{out.name}-{name}.yaml", MIX.format(name=name, out=out, c=corpus, rows=rows))
    r = curate("run", str(y), "--workers", "2", env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return out / name


def _layers(run: Path) -> dict[str, dict[str, bytes]]:
    """Per dedup kind, each shard file's name -> its bytes."""
    steps = atomic.read_json(run / "run.json")["steps"]
    store = run.parent / "_store" / "steps"
    return {k: {p.name: p.read_bytes() for p in sorted((store / steps[f"dedup-{k}"]["dir"].split("/")[-1] / "web").glob("*.parquet"))}
            for k in KINDS}


def _decisions(run: Path) -> dict[tuple[str, str], tuple]:
    """(kind, id) -> what dedup decided about the document, wherever its shard is."""
    steps = atomic.read_json(run / "run.json")["steps"]
    store = run.parent / "_store" / "steps"
    got = {}
    for k in KINDS:
        for p in (store / steps[f"dedup-{k}"]["dir"].split("/")[-1] / "web").glob("*.parquet"):
            t = pq.read_table(p).to_pylist()
            for r in t:
                if r["reason"] is not None or r.get("text") is not None:
                    got[(k, r["id"])] = (r["reason"], r.get("duplicate_of"), r.get("text"))
    return got


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory, joined) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("order-runs")
    got = {"first": _run(corpus, tmp / "out", "first", joined)}
    (corpus / "held.jsonl").rename(corpus / "web" / "crawl-3.jsonl")
    got["added"] = _run(corpus, tmp / "out", "added", joined)
    got["fresh"] = _run(corpus, tmp / "fresh", "added", joined)
    got["split"] = _run(corpus, tmp / "split", "added", joined, rows=40)  # each file in 3 to 5 shards
    return got


def test_a_dump_sorting_last_changes_no_earlier_decision(runs):
    before, after = _layers(runs["first"]), _layers(runs["added"])
    for k in KINDS:
        assert len(before[k]) == 3 and len(after[k]) == 4, k
        for name, data in before[k].items():  # the old shards' layers: the same bytes
            assert after[k][name] == data, (k, name)
    dec = _decisions(runs["added"])
    ingest = atomic.read_json(runs["added"] / "run.json")["steps"]["ingest-web"]["dir"].split("/")[-1]
    new_ids = set(pq.read_table(runs["added"].parent / "_store" / "steps" / ingest / "part-00003.parquet",
                                columns=["id"]).column("id").to_pylist())
    removed_new = {i: d for (k, i), d in dec.items() if k != "paragraph" and i in new_ids}
    # the 20 exact and 20 near copies go, each naming an old page as its survivor
    assert len(removed_new) == 40 and not any(d[1] in new_ids for d in removed_new.values()), removed_new
    # by id, about half of them would have won: the corpus tells the two orders apart
    assert sum(d[1] > i for i, d in removed_new.items()) >= 10
    # the boilerplate stays in the 3 oldest pages that hold it: every new holder loses it
    cut = [i for (k, i), d in dec.items() if k == "paragraph" and d[2] is not None and i in new_ids]
    assert len(cut) == 20


def test_survivors_by_place_give_the_bytes_of_a_fresh_run_whatever_the_shards(runs):
    assert _bytes(runs["added"]) == _bytes(runs["fresh"])
    split = _decisions(runs["split"])
    assert split == _decisions(runs["added"]) and len(split) > 60
